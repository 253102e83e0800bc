"""The metrics the dashboard, the alarms and `clusterctl top` read, by namespace, name and dimensions.

Who produces them:
- namespace CWAgent: the CloudWatch agent on every node (cluster_constructs/cloudwatch_agent.py), rolled up
  to {AutoScalingGroupName, InstanceId, index}, {AutoScalingGroupName, InstanceId} and {AutoScalingGroupName};
  disk metrics carry {AutoScalingGroupName, InstanceId, fstype, path}; memory {AutoScalingGroupName, InstanceId}.
- namespace TrainingCluster, EFA: node_bootstrap/efa_metrics.py writes Embedded Metric Format (EMF) lines per
  EFA device, with the dimension sets {AutoScalingGroupName, InstanceId, device} (bytes and errors only),
  {AutoScalingGroupName, InstanceId} and {AutoScalingGroupName}. Values are per-interval deltas: Sum over a
  period, divided by the period, is a rate.
- namespace TrainingCluster, training: rank 0's EMF step record (training/metrics.py), dimensions
  {Cluster, JobId}, and {Cluster} for the metrics the alarms watch.
- namespace AWS/AutoScaling (group metrics, 1-minute granularity) and AWS/FSx: AWS.

This module only names them; tests/cluster_constructs/test_metric_contract.py checks every name the dashboard
and the alarms use against what the agent config and the EMF records really produce. Plain Python: clusterctl
imports it without aws-cdk.
"""

from __future__ import annotations

from collections.abc import Mapping

AGENT_NAMESPACE = "CWAgent"
TRAINING_NAMESPACE = "TrainingCluster"
AUTOSCALING_NAMESPACE = "AWS/AutoScaling"
FSX_NAMESPACE = "AWS/FSx"

# Dimension names
GROUP = "AutoScalingGroupName"
INSTANCE = "InstanceId"
GPU_INDEX = "index"
EFA_DEVICE = "device"
CLUSTER = "Cluster"
JOB = "JobId"

# The CloudWatch agent: nvidia_smi_<measurement>, cpu_<m>, mem_<m>, disk_<m>
GPU_UTILIZATION = "nvidia_smi_utilization_gpu"  # percent of time a kernel ran
GPU_MEMORY_UTILIZATION = "nvidia_smi_utilization_memory"
GPU_MEMORY_USED = "nvidia_smi_memory_used"  # MiB
GPU_MEMORY_TOTAL = "nvidia_smi_memory_total"  # MiB
GPU_TEMPERATURE = "nvidia_smi_temperature_gpu"  # degrees C
GPU_POWER = "nvidia_smi_power_draw"  # W
GPU_SM_CLOCK = "nvidia_smi_clocks_current_sm"  # MHz
CPU_ACTIVE = "cpu_usage_active"
CPU_IOWAIT = "cpu_usage_iowait"
MEM_USED_PERCENT = "mem_used_percent"
DISK_USED_PERCENT = "disk_used_percent"

# EFA (node_bootstrap/efa_metrics.py): bytes and counts per metrics interval
EFA_TX_BYTES = "EfaTxBytes"
EFA_RX_BYTES = "EfaRxBytes"
EFA_RDMA_READ_BYTES = "EfaRdmaReadBytes"
EFA_RDMA_WRITE_BYTES = "EfaRdmaWriteBytes"
EFA_RX_DROPS = "EfaRxDrops"
EFA_RETRANSMITTED_PACKETS = "EfaRetransmittedPackets"
EFA_ERROR_EVENTS = "EfaErrorEvents"

# Training (training/metrics.py): rank 0's step record
TOKENS_PER_SECOND = "TokensPerSecond"
MFU = "MFU"  # percent of the catalog's dense BF16 peak
LOSS = "Loss"
STEP = "Step"
RUN_STEPS = "RunSteps"
ETA_SECONDS = "EtaSeconds"
STEP_TIME_MAX = "StepTimeMax"
STEP_TIME_MEDIAN = "StepTimeMedian"
STEP_TIME_MIN = "StepTimeMin"
STRAGGLER_RATIO = "StragglerRatio"  # slowest rank's step time / the median rank's
SLOWEST_RANK = "SlowestRank"
VALIDATION_LOSS = "ValidationLoss"  # the held-out loss ([validation]), at the steps that evaluated it
VALIDATION_PERPLEXITY = "ValidationPerplexity"  # exp(ValidationLoss)
GOODPUT = "Goodput"  # percent of the trainer process's wall time in counted steps (training/goodput_line.py)

# AWS
GROUP_IN_SERVICE = "GroupInServiceInstances"
GROUP_DESIRED = "GroupDesiredCapacity"
FSX_FREE_STORAGE = "FreeDataStorageCapacity"
FSX_READ_BYTES = "DataReadBytes"
FSX_WRITE_BYTES = "DataWriteBytes"


def search(namespace: str, dimensions: tuple[str, ...], metric_name: str, filters: Mapping[str, str],
           statistic: str, period_seconds: int, *, extra: str = "") -> str:
    """A CloudWatch SEARCH expression over exactly one dimension schema: `{Namespace,Dim1,Dim2}` matches only
    metrics with exactly those dimensions (CloudWatch User Guide, "CloudWatch search expression syntax").
    `filters` pins dimension values (the cluster's group); `extra` adds search terms."""
    schema = ",".join([_quote_schema(namespace), *sorted(dimensions)])
    terms = [f'MetricName="{metric_name}"'] + [f'{k}="{v}"' for k, v in filters.items()]
    if extra:
        terms.append(extra)
    return f"SEARCH('{{{schema}}} {' '.join(terms)}', '{statistic}', {period_seconds})"


def _quote_schema(namespace: str) -> str:
    # a namespace with a slash or other special characters is quoted in the schema
    return f'"{namespace}"' if "/" in namespace else namespace
