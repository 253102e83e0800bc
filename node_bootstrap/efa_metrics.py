"""EFA counters as CloudWatch metrics: a small collector whose output the CloudWatch agent already ships.

Why a collector of our own, and why this shape (docs/observability.md has the longer version):
- The CloudWatch agent reads no EFA counters on EC2: its metrics sections (cpu, mem, disk, net, ethtool,
  nvidia_gpu, procstat, statsd, ...) do not cover RDMA devices. EFA-only interfaces have no network device, so
  `net` and `ethtool` never see them. The EFA driver publishes its counters in sysfs, one file per counter:
  /sys/class/infiniband/<device>/ports/<port>/hw_counters/<name> (Linux RDMA hw_counters; the efa driver's
  port statistics: tx/rx bytes and packets, rx_drops, send/recv, rdma_read_*/rdma_write_*, and on Nitro v4
  and later retrans_bytes, retrans_pkts, retrans_timeout_events, unresponsive_remote_events,
  impaired_remote_conn_events). Every counter is cumulative since the driver loaded.
- So this process reads them every `metrics.intervalSeconds`, turns them into per-interval deltas, and
  appends one CloudWatch Embedded Metric Format (EMF) line per device to an hourly file under
  `metrics.efaMetricsDir`. The agent tails the newest file into the log stream <instance id>/efa-metrics
  (cluster_constructs/cloudwatch_agent.py); CloudWatch Logs turns each line into metrics. No AWS API call,
  no credentials and no network access here; a stopped agent loses nothing that is still on disk.
- Not statsd: the agent's statsd listener would aggregate our values again and its dimensions ride in tags
  only the agent understands; EMF is one documented JSON shape we can validate in tests. Not the agent's
  EMF socket (logs.metrics_collected.emf): a file survives agent restarts and can be read on the node.

Each line holds the deltas since the previous sample (bytes or counts per interval): Sum over a period
divided by the period is a rate, for any period a graph picks. A counter that went backwards (driver
reload) is skipped for that interval. Only counters that exist are reported ("where present").

Runs as the systemd service cluster-efa-metrics.service, installed by the logging step (cloudwatch.py).
stdlib only, Python 3.9.
"""

from __future__ import annotations

import argparse
import json
import logging
import os
import sys
import time
from typing import Callable

from node_bootstrap.config import ConfigError, MetricsConfig, load_node_config

LOG = logging.getLogger("node_bootstrap.efa_metrics")

INFINIBAND = "/sys/class/infiniband"
KEEP_FILES = 3  # hourly files kept: the agent reads the newest; older ones are only for a lagging agent
UNIT = "cluster-efa-metrics.service"

# sysfs counter -> (metric name, CloudWatch unit). Names match cluster_spec/metrics.py.
BYTE_COUNTERS = {
    "tx_bytes": "EfaTxBytes",
    "rx_bytes": "EfaRxBytes",
    "rdma_read_bytes": "EfaRdmaReadBytes",
    "rdma_write_bytes": "EfaRdmaWriteBytes",
}
COUNT_COUNTERS = {
    "rx_drops": "EfaRxDrops",
    "retrans_pkts": "EfaRetransmittedPackets",
}
# Events that mean a path or a peer is in trouble, not load: summed into EfaErrorEvents (alarmed on).
# retrans_timeout_events: SRD traffic timed out and moved to another network path;
# unresponsive_remote_events / impaired_remote_conn_events: a peer stopped answering / is rate limited;
# rdma_*_wr_err: RDMA work requests that completed in error.
ERROR_EVENT_COUNTERS = (
    "retrans_timeout_events",
    "unresponsive_remote_events",
    "impaired_remote_conn_events",
    "rdma_read_wr_err",
    "rdma_write_wr_err",
)
ERROR_EVENTS = "EfaErrorEvents"
# Published per device as well as per node and cluster; the rest per node and cluster only (custom metrics
# are billed per dimension combination: 32 devices x every counter would be 32 times the bill).
PER_DEVICE_METRICS = ("EfaTxBytes", "EfaRxBytes", ERROR_EVENTS)

Counters = dict[str, dict[str, int]]  # link ("rdmap79s0/1") -> counter name -> value


def read_counters(root: str = "/") -> Counters:
    """Every port's hw_counters under `root`: {"<device>/<port>": {"tx_bytes": 123, ...}}."""
    base = os.path.join(root, INFINIBAND.lstrip("/"))
    found: Counters = {}
    try:
        devices = sorted(os.listdir(base))
    except OSError:
        return found
    for device in devices:
        ports_dir = os.path.join(base, device, "ports")
        try:
            ports = sorted(os.listdir(ports_dir))
        except OSError:
            continue
        for port in ports:
            counters_dir = os.path.join(ports_dir, port, "hw_counters")
            try:
                names = sorted(os.listdir(counters_dir))
            except OSError:
                continue
            values: dict[str, int] = {}
            for name in names:
                try:
                    with open(os.path.join(counters_dir, name)) as f:
                        values[name] = int(f.read().strip())
                except (OSError, ValueError):
                    continue  # "lifespan" is writable, some counters are unreadable; none of them fatal
            if values:
                found[f"{device}/{port}"] = values
    return found


def counter_deltas(previous: Counters, current: Counters) -> Counters:
    """Per link, the increase of every counter present in both samples; a counter that went backwards
    (driver reload) is left out for this interval."""
    deltas: Counters = {}
    for link, values in current.items():
        before = previous.get(link)
        if before is None:
            continue
        deltas[link] = {name: value - before[name] for name, value in values.items()
                        if name in before and value >= before[name]}
    return deltas


def build_record(link: str, deltas: dict[str, int], *, timestamp_ms: int, namespace: str, group: str,
                 instance_id: str, interval_s: float) -> dict | None:
    """One EMF document for one link's deltas, or None when it has none of the reported counters."""
    values: dict[str, int] = {}
    units: dict[str, str] = {}
    for counter, name in BYTE_COUNTERS.items():
        if counter in deltas:
            values[name], units[name] = deltas[counter], "Bytes"
    for counter, name in COUNT_COUNTERS.items():
        if counter in deltas:
            values[name], units[name] = deltas[counter], "Count"
    errors = [deltas[c] for c in ERROR_EVENT_COUNTERS if c in deltas]
    if errors:
        values[ERROR_EVENTS], units[ERROR_EVENTS] = sum(errors), "Count"
    if not values:
        return None
    per_device = [n for n in PER_DEVICE_METRICS if n in values]
    directives = []
    if per_device:
        directives.append({
            "Namespace": namespace,
            "Dimensions": [["AutoScalingGroupName", "InstanceId", "device"]],
            "Metrics": [{"Name": n, "Unit": units[n]} for n in per_device],
        })
    directives.append({
        "Namespace": namespace,
        "Dimensions": [["AutoScalingGroupName", "InstanceId"], ["AutoScalingGroupName"]],
        "Metrics": [{"Name": n, "Unit": units[n]} for n in values],
    })
    record: dict = {
        "_aws": {"Timestamp": timestamp_ms, "CloudWatchMetrics": directives},
        "AutoScalingGroupName": group,
        "InstanceId": instance_id,
        "device": link,
        "IntervalSeconds": round(interval_s, 3),
        "counters": deltas,  # every counter's delta, for CloudWatch Logs Insights (not metrics)
    }
    record.update(values)
    return record


def emf_line(record: dict) -> str:
    """One log event: a JSON object on one line, nothing before or after it (EMF specification)."""
    return json.dumps(record, separators=(",", ":"), sort_keys=True)


class HourlyFiles:
    """Appends lines to <dir>/efa-YYYYMMDDHH.log (UTC) and keeps the newest KEEP_FILES files."""

    def __init__(self, directory: str) -> None:
        self.directory = directory

    def path_for(self, epoch_s: float) -> str:
        return os.path.join(self.directory, time.strftime("efa-%Y%m%d%H.log", time.gmtime(epoch_s)))

    def append(self, epoch_s: float, lines: list[str]) -> str:
        os.makedirs(self.directory, mode=0o755, exist_ok=True)
        path = self.path_for(epoch_s)
        with open(path, "a", encoding="utf-8") as f:
            f.write("".join(line + "\n" for line in lines))  # one write: the agent never reads half a line
        self.prune()
        return path

    def prune(self) -> None:
        files = sorted(n for n in os.listdir(self.directory) if n.startswith("efa-") and n.endswith(".log"))
        for name in files[:-KEEP_FILES]:
            try:
                os.remove(os.path.join(self.directory, name))
            except OSError:
                pass


class Collector:
    """Samples the counters each interval and writes the deltas as EMF lines."""

    def __init__(self, metrics: MetricsConfig, instance_id: str, *, root: str = "/",
                 clock: Callable[[], float] = time.time) -> None:
        self.metrics = metrics
        self.instance_id = instance_id
        self.root = root
        self.clock = clock
        self.files = HourlyFiles(os.path.join(root, metrics.efa_metrics_dir.lstrip("/")))
        self._previous: Counters | None = None
        self._previous_at = 0.0

    def sample(self) -> list[str]:
        """Read the counters; returns the EMF lines for the interval since the last sample (none the first
        time) after appending them to the current hourly file."""
        now = self.clock()
        current = read_counters(self.root)
        previous, previous_at = self._previous, self._previous_at
        self._previous, self._previous_at = current, now
        if previous is None:
            return []
        lines = []
        for link, deltas in sorted(counter_deltas(previous, current).items()):
            record = build_record(link, deltas, timestamp_ms=int(now * 1000), namespace=self.metrics.namespace,
                                  group=self.metrics.auto_scaling_group_name, instance_id=self.instance_id,
                                  interval_s=now - previous_at)
            if record is not None:
                lines.append(emf_line(record))
        if lines:
            self.files.append(now, lines)
        return lines


def seconds_to_next_tick(now: float, interval_s: int) -> float:
    """Sleep until the next multiple of the interval, so every node samples at the same wall-clock times."""
    return interval_s - (now % interval_s) or interval_s


def run(collector: Collector, *, sleep: Callable[[float], None] = time.sleep,
        samples: int | None = None) -> int:
    """Sample forever (or `samples` times after the baseline). Errors are logged, never fatal: a missing
    counter or a full disk must not stop the next interval."""
    collector.sample()  # the baseline
    done = 0
    while samples is None or done < samples:
        sleep(seconds_to_next_tick(collector.clock(), collector.metrics.interval_seconds))
        try:
            lines = collector.sample()
            LOG.debug("wrote %d EMF lines", len(lines))
        except OSError as e:
            LOG.warning("EFA metrics: %s", e)
        done += 1
    return 0


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m node_bootstrap.efa_metrics",
        description="Write EFA hardware counters (sysfs hw_counters) as CloudWatch EMF lines every "
                    "metrics.intervalSeconds, for the CloudWatch agent to ship.",
    )
    parser.add_argument("--config", default="/etc/cluster/node-config.json", help="the node config")
    parser.add_argument("--root", default="/", help="file system root (tests)")
    parser.add_argument("--instance-id", help="instead of asking the instance metadata service")
    parser.add_argument("--samples", type=int, help="stop after this many intervals (default: run forever)")
    return parser


def main(argv: list[str | None] = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(levelname)s %(message)s", stream=sys.stderr)
    try:
        config = load_node_config(os.path.join(args.root, args.config.lstrip("/")))
    except ConfigError as e:
        print(f"efa_metrics: {e}", file=sys.stderr)
        return 2
    instance_id = args.instance_id
    if not instance_id:
        from node_bootstrap.imds import Imds, ImdsError

        try:
            instance_id = Imds().identity().instance_id
        except ImdsError as e:
            print(f"efa_metrics: cannot read the instance id: {e}", file=sys.stderr)
            return 1
    return run(Collector(config.metrics, instance_id, root=args.root), samples=args.samples)


if __name__ == "__main__":
    sys.exit(main())
