"""The EFA collector: sysfs hw_counters -> per-interval deltas -> EMF lines (valid by the EMF specification) in
hourly files the CloudWatch agent tails."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
from emf_spec import extracted_metrics, parse_emf_line

from node_bootstrap.config import parse_node_config
from node_bootstrap.efa_metrics import (
    KEEP_FILES,
    Collector,
    HourlyFiles,
    counter_deltas,
    main,
    read_counters,
    run,
    seconds_to_next_tick,
)

REPO = Path(__file__).resolve().parents[2]
PYTHON39 = "/root/.pyenv/versions/3.9.18/bin/python3.9"
# The port counters of an EFA device on a Nitro v4 instance (p5): names as the efa driver publishes them.
P5_COUNTERS = {
    "tx_bytes": 1_000, "tx_pkts": 10, "rx_bytes": 2_000, "rx_pkts": 20, "rx_drops": 0,
    "send_bytes": 0, "send_wrs": 0, "recv_bytes": 0, "recv_wrs": 0,
    "rdma_read_wrs": 0, "rdma_read_bytes": 500, "rdma_read_wr_err": 0, "rdma_read_resp_bytes": 0,
    "rdma_write_wrs": 0, "rdma_write_bytes": 300, "rdma_write_wr_err": 0, "rdma_write_recv_bytes": 0,
    "retrans_bytes": 0, "retrans_pkts": 0, "retrans_timeout_events": 0, "unresponsive_remote_events": 0,
    "impaired_remote_conn_events": 0,
}
# An older device without the SRD network counters (they are Nitro v4 and later only).
OLD_COUNTERS = {k: v for k, v in P5_COUNTERS.items()
                if not k.startswith(("retrans", "unresponsive", "impaired", "rdma_write"))}


class FakeSysfs:
    def __init__(self, root: Path) -> None:
        self.root = root

    def set(self, device: str, counters: dict[str, int], port: str = "1") -> None:
        d = self.root / "sys/class/infiniband" / device / "ports" / port / "hw_counters"
        d.mkdir(parents=True, exist_ok=True)
        for name, value in counters.items():
            (d / name).write_text(f"{value}\n")

    def add(self, device: str, **increments: int) -> None:
        d = self.root / "sys/class/infiniband" / device / "ports/1/hw_counters"
        for name, inc in increments.items():
            (d / name).write_text(f"{int((d / name).read_text()) + inc}\n")


class Clock:
    def __init__(self, now: float) -> None:
        self.now = now

    def __call__(self) -> float:
        return self.now


@pytest.fixture
def node(tmp_path, kit):
    sysfs = FakeSysfs(tmp_path)
    sysfs.set("rdmap79s0", P5_COUNTERS)
    sysfs.set("rdmap80s0", P5_COUNTERS)
    config = parse_node_config(kit.node_config_dict())
    clock = Clock(1_795_000_000.0)  # 2026-11-18T11:06:40Z
    collector = Collector(config.metrics, "i-0a1b2c3d4e5f60718", root=str(tmp_path), clock=clock)
    return sysfs, collector, clock, tmp_path


def test_counters_are_read_per_device_and_port(node):
    sysfs, _, _, root = node
    (root / "sys/class/infiniband/rdmap80s0/ports/1/hw_counters/lifespan").write_text("garbage\n")
    counters = read_counters(str(root))
    assert sorted(counters) == ["rdmap79s0/1", "rdmap80s0/1"]
    assert counters["rdmap79s0/1"]["tx_bytes"] == 1000 and "lifespan" not in counters["rdmap80s0/1"]
    assert read_counters(str(root / "nowhere")) == {}


def test_the_first_sample_is_a_baseline_then_each_interval_writes_one_valid_line_per_device(node):
    sysfs, collector, clock, root = node
    assert collector.sample() == []
    clock.now += 60
    sysfs.add("rdmap79s0", tx_bytes=6_000_000_000, rx_bytes=3_000_000_000, rdma_read_bytes=10, retrans_pkts=4,
              retrans_timeout_events=2, rdma_read_wr_err=1)
    sysfs.add("rdmap80s0", tx_bytes=5)
    lines = collector.sample()
    first, second = (parse_emf_line(line) for line in lines)
    assert first["device"] == "rdmap79s0/1" and first["InstanceId"] == "i-0a1b2c3d4e5f60718"
    assert first["AutoScalingGroupName"] == "TrainingClusterStack-nodes"
    assert first["EfaTxBytes"] == 6_000_000_000 and first["EfaRxBytes"] == 3_000_000_000
    assert first["EfaRdmaReadBytes"] == 10 and first["EfaRdmaWriteBytes"] == 0
    assert first["EfaRetransmittedPackets"] == 4 and first["EfaErrorEvents"] == 3
    assert first["IntervalSeconds"] == 60 and first["_aws"]["Timestamp"] == int(clock.now * 1000)
    assert first["counters"]["retrans_timeout_events"] == 2
    assert second["EfaTxBytes"] == 5 and second["EfaErrorEvents"] == 0
    # dimension sets: bytes and errors per device; everything per node and per cluster
    data = extracted_metrics(first)
    per_device = {d["MetricName"] for d in data if len(d["Dimensions"]) == 3}
    assert per_device == {"EfaTxBytes", "EfaRxBytes", "EfaErrorEvents"}
    per_cluster = {d["MetricName"] for d in data if [x["Name"] for x in d["Dimensions"]] == ["AutoScalingGroupName"]}
    assert per_cluster == {"EfaTxBytes", "EfaRxBytes", "EfaRdmaReadBytes", "EfaRdmaWriteBytes", "EfaRxDrops",
                           "EfaRetransmittedPackets", "EfaErrorEvents"}
    assert {d["Namespace"] for d in data} == {"TrainingCluster"}
    # the file the agent tails
    written = (root / "var/log/cluster/metrics" / "efa-2026111811.log").read_text().splitlines()
    assert written == lines


def test_only_counters_that_exist_are_reported(node):
    sysfs, collector, clock, root = node
    sysfs.set("rdmap81s0", OLD_COUNTERS)
    collector.sample()
    clock.now += 60
    lines = collector.sample()
    old = parse_emf_line(lines[-1])
    assert old["device"] == "rdmap81s0/1"
    assert "EfaRetransmittedPackets" not in old and "EfaRdmaWriteBytes" not in old
    assert old["EfaErrorEvents"] == 0  # rdma_read_wr_err exists


def test_a_counter_that_went_backwards_is_skipped_for_that_interval(node):
    sysfs, collector, clock, _ = node
    collector.sample()
    clock.now += 60
    sysfs.set("rdmap79s0", {**P5_COUNTERS, "tx_bytes": 10})  # the driver was reloaded
    sysfs.add("rdmap79s0", rx_bytes=7)
    document = parse_emf_line(collector.sample()[0])
    assert "EfaTxBytes" not in document and document["EfaRxBytes"] == 7
    assert counter_deltas({"a/1": {"x": 5}}, {"a/1": {"x": 7}, "b/1": {"x": 1}}) == {"a/1": {"x": 2}}


def test_hourly_files_are_pruned_to_the_newest(tmp_path):
    files = HourlyFiles(str(tmp_path / "metrics"))
    for hour in range(5):
        files.append(1_795_000_000.0 + hour * 3600, ["{}"])
    assert len(os.listdir(tmp_path / "metrics")) == KEEP_FILES
    assert sorted(os.listdir(tmp_path / "metrics"))[-1] == "efa-2026111815.log"


def test_samples_are_aligned_to_the_interval(node):
    _, collector, clock, _ = node
    assert seconds_to_next_tick(120.0, 60) == 60 and seconds_to_next_tick(125.5, 60) == 54.5
    slept = []

    def sleep(seconds):
        slept.append(seconds)
        clock.now += seconds

    assert run(collector, sleep=sleep, samples=2) == 0
    assert slept == [20.0, 60.0]  # 1_795_000_000 is 11:06:40Z


def test_main_writes_lines_for_the_configured_interval(tmp_path, kit):
    FakeSysfs(tmp_path).set("rdmap79s0", P5_COUNTERS)
    config = kit.node_config_dict(**{"metrics.intervalSeconds": 1})
    (tmp_path / "etc/cluster").mkdir(parents=True)
    (tmp_path / "etc/cluster/node-config.json").write_text(json.dumps(config))
    assert main(["--root", str(tmp_path), "--instance-id", "i-0123", "--samples", "1"]) == 0
    (path,) = (tmp_path / "var/log/cluster/metrics").iterdir()
    document = parse_emf_line(path.read_text().strip())
    assert document["EfaTxBytes"] == 0 and document["InstanceId"] == "i-0123"


def test_main_names_a_bad_node_config(tmp_path, capsys):
    assert main(["--root", str(tmp_path), "--instance-id", "i-0123", "--samples", "1"]) == 2
    assert "cannot read node config" in capsys.readouterr().err


@pytest.mark.skipif(not os.path.exists(PYTHON39), reason=f"{PYTHON39} is not installed here")
def test_runs_under_python39(tmp_path, kit):
    FakeSysfs(tmp_path).set("rdmap79s0", P5_COUNTERS)
    (tmp_path / "etc/cluster").mkdir(parents=True)
    (tmp_path / "etc/cluster/node-config.json").write_text(
        json.dumps(kit.node_config_dict(**{"metrics.intervalSeconds": 1})))
    result = subprocess.run([PYTHON39, "-m", "node_bootstrap.efa_metrics", "--root", str(tmp_path),
                             "--instance-id", "i-0123", "--samples", "1"], cwd=REPO, capture_output=True,
                            text=True, timeout=60, env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"})
    assert result.returncode == 0, result.stderr
    (path,) = (tmp_path / "var/log/cluster/metrics").iterdir()
    parse_emf_line(path.read_text().strip())
    assert sys.version_info >= (3, 11)  # the test process itself; the collector ran under 3.9
