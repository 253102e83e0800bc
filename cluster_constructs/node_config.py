"""The node config: the one file that carries the stack's decisions to each node (/etc/cluster/node-config.json).

Rendered at synth time from the typed settings and the instance catalog; deploy-time values (the FSx DNS name,
the log group name) arrive as CloudFormation tokens. The schema is documented in docs/architecture.md section 2
and read by node_bootstrap; its golden file is tests/cluster_constructs/golden/node-config.json.
"""

from __future__ import annotations

from typing import Any

from cluster_constructs.cloudwatch_agent import EFA_METRICS_DIR, render_agent_config
from cluster_spec.metrics import TRAINING_NAMESPACE
from cluster_spec.settings import (
    BootstrapSettings,
    ComputeSettings,
    HealthSettings,
    ObservabilitySettings,
    StorageSettings,
)

# 2: expected.nvswitch and the bootstrap section (deadline, protected mode);
# 3: the monitor section and the jobs' hang timeouts (training.job*TimeoutSeconds);
# 4: "metrics" and "cloudwatchAgent" (node metrics through the CloudWatch agent);
# 5: expected.fp8 and the training lock (training.lockFile, wheelhouseDir, packagesDir, fp8Backends)
SCHEMA_VERSION = 5
BUNDLE_DIR = "/opt/cluster/bundle"
NODE_CONFIG_PATH = "/etc/cluster/node-config.json"
DLAMI_SCRATCH = (
    "/opt/dlami/nvme"  # where the Deep Learning AMI stripes the instance-store NVMe before user-data
)
DLAMI_PYTHON = (
    "/opt/pytorch/bin/python"  # the DLAMI's PyTorch environment (DLAMI release notes, python_location)
)
# The training lock and its wheels, inside the bundle (cluster_constructs/bundle.py stages both).
LOCK_FILE = f"{BUNDLE_DIR}/training/node-requirements.txt"
WHEELHOUSE_DIR = f"{BUNDLE_DIR}/wheelhouse"
PACKAGES_DIR = "/opt/cluster/python-packages"  # node_bootstrap's packages step installs the lock here
RENDEZVOUS_PORT = 29400  # torchrun c10d rendezvous on the first node


def checkpoint_root(storage: StorageSettings) -> str:
    """Where the nodes put every job's checkpoints (``<root>/<job id>``), on the shared file system. Also the
    stack's ``CheckpointRoot`` output: clusterctl records each job's directory from it."""
    return f"{storage.fsx_mount_point}/checkpoints"


def render_node_config(
    *,
    stack_name: str,
    region: str,
    compute: ComputeSettings,
    storage: StorageSettings,
    observability: ObservabilitySettings,
    file_system_dns_name: str,
    file_system_mount_name: str,
    log_group_name: str,
    bootstrap: BootstrapSettings,
    auto_scaling_group_name: str,
    health: HealthSettings,
    fp8_backends: list[str],
    job_table_name: str,
) -> dict[str, Any]:
    """The node config as a JSON-ready dict (values may be CDK tokens)."""
    instance = compute.instance_type
    fsx = storage.fsx_mount_point
    interval_s = observability.metrics_interval_seconds
    # scratch is mounted at scratchMountPoint by node_bootstrap, or left where the DLAMI mounted it (and
    # linked): the agent reports whichever is the mount point
    disks = tuple(dict.fromkeys(("/", compute.scratch_mount_point, DLAMI_SCRATCH, fsx)))
    return {
        "schemaVersion": SCHEMA_VERSION,
        "stackName": stack_name,
        "region": region,
        "instanceType": instance.name,
        "expected": {
            "gpuCount": instance.gpu_count,
            "gpuMemoryGiB": instance.gpu_memory_gib,
            "efaInterfaceCount": instance.efa_interfaces,
            "nvmeDeviceCount": instance.nvme_devices,
            "nvswitch": instance.nvswitch,
            "fp8": instance.supports_fp8,
        },
        "scratch": {"mountPoint": compute.scratch_mount_point, "dlamiMountPoint": DLAMI_SCRATCH},
        "lustre": {
            "dnsName": file_system_dns_name,
            "mountName": file_system_mount_name,
            "mountPoint": fsx,
            "efaEnabled": storage.fsx_efa_enabled,
        },
        "logging": {"logGroupName": log_group_name},
        "metrics": {
            "intervalSeconds": interval_s,
            "namespace": TRAINING_NAMESPACE,
            "efaMetricsDir": EFA_METRICS_DIR,
        },
        "cloudwatchAgent": render_agent_config(
            log_group_name=log_group_name, interval_seconds=interval_s, disk_mount_points=disks
        ),
        "training": {
            "bundleDir": BUNDLE_DIR,
            "envFile": "/etc/cluster/training.env",
            "python": DLAMI_PYTHON,
            "lockFile": LOCK_FILE,
            "wheelhouseDir": WHEELHOUSE_DIR,
            "packagesDir": PACKAGES_DIR,
            "fp8Backends": list(fp8_backends),
            "jobsDir": "/var/lib/cluster/jobs",
            "jobLogDir": "/var/log/cluster/jobs",
            "checkpointRoot": checkpoint_root(storage),
            "dataRoot": f"{fsx}/data",
            "rendezvousPort": RENDEZVOUS_PORT,
            "jobHangTimeoutSeconds": health.job_hang_timeout_minutes * 60,
            "jobStartTimeoutSeconds": health.job_start_timeout_minutes * 60,
            "jobHangFloorSeconds": health.job_hang_floor_seconds,
            "jobStepHangFloorSeconds": health.job_step_hang_floor_seconds,
            # a `start` runs only the attempt this table holds as its job's current one (node_bootstrap/jobs/
            # job_table.py)
            "jobTableName": job_table_name,
        },
        "bootstrap": {
            "deadlineSeconds": bootstrap.timeout_seconds,
            "autoScalingGroupName": auto_scaling_group_name,
            "protectedModeFailures": bootstrap.protected_mode_failures,
            "protectedModeWindowSeconds": bootstrap.protected_mode_window_minutes * 60,
        },
        "monitor": {"intervalSeconds": health.check_interval_seconds},
    }
