"""The CloudWatch agent configuration every node runs, rendered at synth time into the node config.

One agent, no exporter of our own (CloudWatch agent configuration file reference, "metrics" and "logs"
sections; the agent's allow-listed measurement names are in amazon-cloudwatch-agent's
translator/translate/metrics/config/registered_metrics.go, and an unknown name fails the whole config):

- `nvidia_gpu`: utilization, memory, temperature, power and SM clock per GPU. The agent reads them with
  nvidia-smi. It offers no clock-throttle reasons (they are not in its allow-list); a throttled GPU shows as
  an SM clock below its peers (docs/troubleshooting.md).
- `cpu`, `mem`, `disk`: host CPU and memory, and the space used on /, the NVMe scratch and FSx for Lustre.
- `logs`: the bootstrap log, the node health monitor's log (its findings too) and the EFA collector's
  Embedded Metric Format (EMF) lines (node_bootstrap/efa_metrics.py, one hourly file, the newest of which the
  agent tails). Job logs are added per job with `append-config` (node_bootstrap/jobs/logs.py), with the
  job's metrics file, where the job supervisor writes the trainer's step metrics as EMF (never the job log:
  node_bootstrap/jobs/job_metrics.py).

Dimensions: `append_dimensions` adds AutoScalingGroupName and InstanceId to every agent metric (and drops the
`host` dimension); `aggregation_dimensions` makes the agent also publish each metric rolled up to exactly
{AutoScalingGroupName, InstanceId, index} (one GPU), {AutoScalingGroupName, InstanceId} (one node) and
{AutoScalingGroupName} (the cluster). Those fixed dimension sets are what the dashboard, the alarms and
`clusterctl top` read, whatever extra dimensions an agent or driver version adds to the originals (newer
nvidia-smi adds `arch`); the per-GPU and per-CPU originals are dropped (`drop_original_metrics`) since the
roll-ups carry the same data. The agent drops a roll-up that has as many dimensions as the original
(plugins/outputs/cloudwatch ProcessRollup): memory's original already is {AutoScalingGroupName, InstanceId}.

The agent finds EMF in any log destination: a line that is a JSON object containing "CloudWatchMetrics"
switches its stream to EMF (plugins/outputs/cloudwatchlogs, cwDest.Publish), and CloudWatch Logs extracts the
metrics (CloudWatch User Guide, "Specification: Embedded metric format").

Plain Python without CDK imports: the tests interpret it without synthesizing a stack.
"""

from __future__ import annotations

from typing import Any

AGENT_NAMESPACE = "CWAgent"
BOOTSTRAP_LOG = "/var/log/cluster/bootstrap.log"  # node_bootstrap.logs.LOG_FILE
EFA_METRICS_DIR = "/var/log/cluster/metrics"  # the EFA collector's hourly EMF files
EFA_METRICS_FILE_GLOB = EFA_METRICS_DIR + "/efa-*.log"
MONITOR_LOG = "/var/log/cluster/health-monitor.log"  # node_bootstrap.logs.MONITOR_LOG_FILE
BOOTSTRAP_STREAM = "{instance_id}/bootstrap"  # the agent expands {instance_id}
MONITOR_STREAM = "{instance_id}/health"
EFA_METRICS_STREAM = "{instance_id}/efa-metrics"

# The roll-ups every agent metric is also published with (see the module docstring).
GPU_DIMENSIONS = ("AutoScalingGroupName", "InstanceId", "index")
NODE_DIMENSIONS = ("AutoScalingGroupName", "InstanceId")
CLUSTER_DIMENSIONS = ("AutoScalingGroupName",)

# (measurement, CloudWatch unit or None). Names as the agent's nvidia_gpu section takes them; CloudWatch
# names them nvidia_smi_<measurement>. Memory is in MiB as nvidia-smi reports it ("Megabytes" is the
# closest CloudWatch unit).
GPU_MEASUREMENTS = (
    ("utilization_gpu", "Percent"),
    ("utilization_memory", "Percent"),
    ("memory_used", "Megabytes"),
    ("memory_total", "Megabytes"),
    ("temperature_gpu", None),
    ("power_draw", None),
    ("clocks_current_sm", None),
)
CPU_MEASUREMENTS = (("usage_active", "Percent"), ("usage_iowait", "Percent"))
MEM_MEASUREMENTS = (("used_percent", "Percent"),)
DISK_MEASUREMENTS = (("used_percent", "Percent"), ("free", "Bytes"))


def _measurements(items: tuple[tuple[str, str | None], ...]) -> list[Any]:
    return [{"name": name, "unit": unit} if unit else name for name, unit in items]


def render_agent_config(
    *, log_group_name: str, interval_seconds: int, disk_mount_points: tuple[str, ...]
) -> dict[str, Any]:
    """The agent's JSON configuration. `disk_mount_points`: the mount points whose use is reported (the
    root, scratch as node_bootstrap or the DLAMI mounts it, and FSx)."""
    return {
        "agent": {"metrics_collection_interval": interval_seconds},
        "metrics": {
            "namespace": AGENT_NAMESPACE,
            "append_dimensions": {
                "AutoScalingGroupName": "${aws:AutoScalingGroupName}",
                "InstanceId": "${aws:InstanceId}",
            },
            "aggregation_dimensions": [list(GPU_DIMENSIONS), list(NODE_DIMENSIONS), list(CLUSTER_DIMENSIONS)],
            "metrics_collected": {
                "nvidia_gpu": {
                    "measurement": _measurements(GPU_MEASUREMENTS),
                    "metrics_collection_interval": interval_seconds,
                    "drop_original_metrics": [name for name, _ in GPU_MEASUREMENTS],
                },
                "cpu": {
                    "measurement": _measurements(CPU_MEASUREMENTS),
                    "totalcpu": True,
                    "metrics_collection_interval": interval_seconds,
                    "drop_original_metrics": [name for name, _ in CPU_MEASUREMENTS],
                },
                "mem": {
                    "measurement": _measurements(MEM_MEASUREMENTS),
                    "metrics_collection_interval": interval_seconds,
                },
                "disk": {
                    "measurement": _measurements(DISK_MEASUREMENTS),
                    "resources": list(disk_mount_points),
                    "drop_device": True,  # the path names the file system; device names vary per boot
                    "metrics_collection_interval": interval_seconds,
                },
            },
        },
        "logs": {
            "logs_collected": {
                "files": {
                    "collect_list": [
                        {
                            "file_path": BOOTSTRAP_LOG,
                            "log_group_name": log_group_name,
                            "log_stream_name": BOOTSTRAP_STREAM,
                            "timezone": "UTC",
                        },
                        {
                            "file_path": MONITOR_LOG,
                            "log_group_name": log_group_name,
                            "log_stream_name": MONITOR_STREAM,
                            "timezone": "UTC",
                        },
                        {
                            # a glob: the agent tails the most recently modified match (plugins/inputs/
                            # logfile getTargetFiles), so the collector's hourly files need no rotation here
                            "file_path": EFA_METRICS_FILE_GLOB,
                            "log_group_name": log_group_name,
                            "log_stream_name": EFA_METRICS_STREAM,
                        },
                    ]
                }
            }
        },
    }
