"""The node config keys jobs need, read from the node config JSON with paths resolved under a root."""

import os
from dataclasses import dataclass

from node_bootstrap.config import (
    DEFAULT_JOB_HANG_FLOOR_SECONDS,
    DEFAULT_JOB_STEP_HANG_FLOOR_SECONDS,
    ConfigError,
    load_node_config,
)
from node_bootstrap.jobs.errors import EXIT_USAGE, JobError
from node_bootstrap.jobs.job_output import JOB_LINE_MAX_BYTES, JOB_LOG_MAX_BYTES

DEFAULT_NODE_CONFIG = "/etc/cluster/node-config.json"
LOCAL_CHECKPOINTS = "checkpoints"  # under the node's scratch: the local checkpoint tier of the job running there
JOB_SCRATCH = "jobs"  # under the node's scratch: the scratch of the job running there, its HOME and TMPDIR


def under_root(root: str, path: str) -> str:
    """`path` (absolute, as on a real node) inside `root`; the identity for root "/"."""
    return os.path.join(root, path.lstrip("/")) if root != "/" else path


@dataclass(frozen=True)
class JobSettings:
    """The node config keys jobs need (docs/architecture.md section 2), with paths resolved under root."""

    root: str
    python: str  # training.python: the DLAMI interpreter that has torch
    bundle_dir: str  # training.bundleDir: on PYTHONPATH and the job's working directory
    env_file: str  # training.envFile: KEY=value lines sourced before torchrun (NCCL/EFA settings)
    jobs_dir: str  # training.jobsDir: <jobs_dir>/<job id>/status.json
    job_log_dir: str  # training.jobLogDir: <job_log_dir>/<job id>.log
    checkpoint_root: str  # training.checkpointRoot: checkpoints go to <checkpoint_root>/<job id>
    rendezvous_port: int  # training.rendezvousPort: c10d store port on the first node
    log_group_name: str  # logging.logGroupName: where the CloudWatch agent ships the job log
    # load_settings always reads these two from the node config; the defaults (the stack's) serve direct callers
    hang_timeout_s: float = 1800.0  # training.jobHangTimeoutSeconds: no trainer step for this long -> hung; 0: off
    start_timeout_s: float = 3600.0  # training.jobStartTimeoutSeconds: the same for the first step after a (re)start
    # training.jobHangFloorSeconds: the least a hang timeout learned from the step cadence can be (progress.py)
    hang_floor_s: float = float(DEFAULT_JOB_HANG_FLOOR_SECONDS)
    # training.jobStepHangFloorSeconds: the same for the steps between a trainer's phase records (progress.py)
    step_hang_floor_s: float = float(DEFAULT_JOB_STEP_HANG_FLOOR_SECONDS)
    # <scratch.mountPoint>/checkpoints: the local checkpoint tier's <root>/<job id> on the node's NVMe; "": none
    local_checkpoint_root: str = ""
    # <scratch.mountPoint>/jobs: each job's own scratch <root>/<job id>, its HOME and TMPDIR; "": none
    job_scratch_root: str = ""
    # the most of a job's output its log keeps on the root file system, all attempts together; and of one line
    # (job_output.py): the rest is counted in the status, not kept
    job_log_max_bytes: int = JOB_LOG_MAX_BYTES
    # training.jobTableName: the job table a `start` is checked against (job_table.py); "": none, unchecked
    job_table_name: str = ""
    region: str = ""  # the node's region: where the job table is
    # what the supervisor publishes a job's step metrics under (job_metrics.py): metrics.namespace, and the
    # Cluster dimension's value, the stack's name
    metrics_namespace: str = "TrainingCluster"
    stack_name: str = "local"
    job_line_max_bytes: int = JOB_LINE_MAX_BYTES


def load_settings(root: str = "/", node_config: str = DEFAULT_NODE_CONFIG) -> JobSettings:
    """The job keys of the node config, read and validated by node_bootstrap.config (the one loader of the
    contract), with node paths resolved under `root`."""
    try:
        config = load_node_config(under_root(root, node_config))
    except ConfigError as e:
        raise JobError(str(e), EXIT_USAGE) from None
    training = config.training
    return JobSettings(
        root=root,
        python=under_root(root, training.python),
        bundle_dir=under_root(root, training.bundle_dir),
        env_file=under_root(root, training.env_file),
        jobs_dir=under_root(root, training.jobs_dir),
        job_log_dir=under_root(root, training.job_log_dir),
        checkpoint_root=under_root(root, training.checkpoint_root),
        rendezvous_port=training.rendezvous_port,
        log_group_name=config.logging.log_group_name,
        hang_timeout_s=float(training.job_hang_timeout_seconds),
        start_timeout_s=float(training.job_start_timeout_seconds),
        hang_floor_s=float(training.job_hang_floor_seconds),
        step_hang_floor_s=float(training.job_step_hang_floor_seconds),
        local_checkpoint_root=os.path.join(under_root(root, config.scratch.mount_point), LOCAL_CHECKPOINTS),
        job_scratch_root=os.path.join(under_root(root, config.scratch.mount_point), JOB_SCRATCH),
        job_table_name=training.job_table_name,
        region=config.region,
        metrics_namespace=config.metrics.namespace,
        stack_name=config.stack_name,
    )
