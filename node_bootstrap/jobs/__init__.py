"""Training jobs on one node: start torchrun detached, report its status, cancel it.

The stack's SSM document (cluster_constructs/jobs.py) runs this package on every node of a job with one
ssm:SendCommand (docs/architecture.md section 5):

    python3 -m node_bootstrap.jobs start  --job-id J --config training/configs/X.toml --nodes N \
        --gpus-per-node G --rendezvous-host IP --max-restarts R [--overrides "k=v k=v"] [--resume-from J0] \
        [--attempt K]
    python3 -m node_bootstrap.jobs start  --job-id J --module training.commcheck --nodes N \
        --gpus-per-node G --rendezvous-host IP --max-restarts 0 [--overrides "min_busbw_gbps=350"]
    python3 -m node_bootstrap.jobs start  --job-id J-hf-xxxx --module training.export --nodes 1 \
        --gpus-per-node G --rendezvous-host IP --resume-from J [--overrides "step=N"]
    python3 -m node_bootstrap.jobs status --job-id J
    python3 -m node_bootstrap.jobs cancel --job-id J [--timeout-seconds 120]

Why detached: SSM Run Command stops a command after at most 48 hours and truncates its output, and a
restart of the SSM agent kills the processes in its cgroup. So `start` only launches a supervisor
(`python3 -m node_bootstrap.jobs supervise`) in its own systemd unit `training-job-<id>` and returns. The
supervisor sources the training env file, runs torchrun, tees its output to the job log (which the
CloudWatch agent ships to the stream `jobs/<id>/{instance_id}`), records status.json, and forwards SIGTERM
to torchrun so the trainer checkpoints before it exits. torchrun and the trainer run as the unprivileged job
user (node_bootstrap/accounts.py), which owns the job's own directories, never as root; the job log is root's,
and only the supervisor writes the job's output there, capped (job_output.py). Root touches the user's paths
only through descriptors that follow no link of that user's (safe_paths.py, job_paths.py).

Launchers: `systemd` (systemd-run; the default wherever systemd is PID 1) and `direct` (double fork and
setsid; for containers and tests, where systemd is not running). Both run the same supervisor.

A job restarted on a new node set (the job keeper's `start --attempt K`, K > 1) runs again under the same job
id, checkpoint directory and rendezvous id; on a node that ran an earlier attempt, the previous status is
kept aside and the job log is appended to (attempts.py, attempt_log.py).

What the cluster side reads (modules, states, file names, parameter patterns, exit codes) is the job contract,
node_bootstrap/job_contract.py, outside this package: its readers (the job keeper) ship it without the launcher.

Modules, in dependency order: errors (exit codes, JobError), job_output (how much of a job's output its log keeps),
settings (node config), spec (JobSpec, JobFiles, the torchrun argv), logs (the job log to CloudWatch), attempt_log
(where an attempt begins in the job log), job_report (the one parser, with its schema, of every value read from a
job's output), job_metrics (the trainer's step metrics, published by the supervisor: never a job's EMF as printed),
job_table (whether the job table allows a start), processes (the job's processes in /proc, SIGKILL to them),
control (`status`, `cancel`), attempts (a later attempt on a node that ran the job), safe_paths (root's operations on
paths the job user can write), job_paths (what the job user gets at a start), launch (`start`), progress (hang
detection from the trainer's step lines), hang_origin (whether a hang is on this node, and the health check it asks
for), supervise (`supervise`), cli (the argument parser and main; __main__ runs it). This package re-exports their
public names, so `from node_bootstrap import jobs; jobs.JOB_ID_RE` keeps working.

Runs on the node's system Python (>= 3.9), standard library only.
"""

from node_bootstrap.jobs.attempt_log import attempt_marker, attempt_part
from node_bootstrap.jobs.attempts import keep_previous_attempt
from node_bootstrap.jobs.cli import build_parser, main
from node_bootstrap.jobs.control import (
    LOG_HEAD_BYTES,
    LOG_TAIL_BYTES,
    NCCL_NETWORK_ALIASES,
    LogEnds,
    NcclNetwork,
    cancel_job,
    descendants,
    find_busbw,
    find_last_event,
    find_last_step,
    find_nccl_network,
    find_resumed_from_step,
    find_resumed_from_tier,
    job_status,
    last_step,
    process_alive,
    read_log_ends,
    wait_for_end,
)
from node_bootstrap.jobs.errors import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, JobError
from node_bootstrap.jobs.job_paths import prepare_job_paths
from node_bootstrap.jobs.launch import (
    START_LOCK_WAIT_SECONDS,
    START_WAIT_SECONDS,
    job_account,
    launch_direct,
    launch_systemd,
    package_parent,
    start_job,
    start_lock,
    supervisor_argv,
    systemd_available,
)
from node_bootstrap.jobs.logs import (
    CLOUDWATCH_AGENT_CTL,
    CLOUDWATCH_JOBS_CONFIG_DIR,
    build_cloudwatch_config,
    maybe_ship_job_log,
)
from node_bootstrap.jobs.progress import ProgressWatch
from node_bootstrap.jobs.settings import DEFAULT_NODE_CONFIG, JobSettings, load_settings, under_root
from node_bootstrap.jobs.spec import (
    ABORT_STOP_SECONDS,
    ATTEMPT_RE,
    CANCEL_ABORT,
    CANCEL_AFTER_WAIT_SECONDS,
    CANCEL_MODES,
    CANCEL_SAVE,
    CHECKPOINT_DIR_KEY,
    COMMAND_TIMEOUT_SECONDS,
    COMMCHECK_MODULE,
    CONFIG_RE,
    EXPORT_MODULE,
    EXPORT_OPTION_RE,
    EXPORT_OUT_DIR,
    HOST_RE,
    JOB_ID_RE,
    LOCAL_CHECKPOINT_DIR_KEY,
    MAX_ATTEMPT,
    MAX_CANCEL_TIMEOUT_SECONDS,
    MODULES,
    OVERRIDE_RE,
    STATES,
    STOP_GRACE_SECONDS,
    TORCHRUN_EXIT_SECONDS,
    TRAINING_MODULE,
    UNIT_PREFIX,
    JobFiles,
    JobSpec,
    build_option_args,
    build_torchrun_argv,
    check_not_checkpoint_dir,
    checkpoint_dir,
    export_out_dir,
    local_checkpoint_dir,
    parse_attempt,
    read_json,
    torchrun_shutdown_timeout,
    utc_now,
    validate_cancel_timeout,
    validate_job_id,
    write_json_atomic,
)
from node_bootstrap.jobs.supervise import Supervisor, build_job_command, exit_code_of

__all__ = [
    "ABORT_STOP_SECONDS",
    "ATTEMPT_RE",
    "CANCEL_ABORT",
    "CANCEL_AFTER_WAIT_SECONDS",
    "CANCEL_MODES",
    "CANCEL_SAVE",
    "CHECKPOINT_DIR_KEY",
    "LOCAL_CHECKPOINT_DIR_KEY",
    "CLOUDWATCH_AGENT_CTL",
    "CLOUDWATCH_JOBS_CONFIG_DIR",
    "COMMAND_TIMEOUT_SECONDS",
    "COMMCHECK_MODULE",
    "CONFIG_RE",
    "DEFAULT_NODE_CONFIG",
    "EXIT_FAILED",
    "EXIT_NOT_FOUND",
    "EXIT_OK",
    "EXIT_USAGE",
    "EXPORT_MODULE",
    "EXPORT_OPTION_RE",
    "EXPORT_OUT_DIR",
    "HOST_RE",
    "JOB_ID_RE",
    "LOG_HEAD_BYTES",
    "LOG_TAIL_BYTES",
    "MAX_ATTEMPT",
    "MAX_CANCEL_TIMEOUT_SECONDS",
    "MODULES",
    "NCCL_NETWORK_ALIASES",
    "OVERRIDE_RE",
    "ProgressWatch",
    "START_LOCK_WAIT_SECONDS",
    "START_WAIT_SECONDS",
    "STATES",
    "STOP_GRACE_SECONDS",
    "TORCHRUN_EXIT_SECONDS",
    "TRAINING_MODULE",
    "UNIT_PREFIX",
    "JobError",
    "JobFiles",
    "JobSettings",
    "JobSpec",
    "LogEnds",
    "NcclNetwork",
    "Supervisor",
    "attempt_marker",
    "attempt_part",
    "build_cloudwatch_config",
    "build_job_command",
    "build_option_args",
    "build_parser",
    "build_torchrun_argv",
    "cancel_job",
    "check_not_checkpoint_dir",
    "checkpoint_dir",
    "local_checkpoint_dir",
    "descendants",
    "exit_code_of",
    "export_out_dir",
    "find_busbw",
    "find_last_event",
    "find_last_step",
    "find_nccl_network",
    "find_resumed_from_step",
    "find_resumed_from_tier",
    "job_account",
    "job_status",
    "keep_previous_attempt",
    "last_step",
    "launch_direct",
    "launch_systemd",
    "load_settings",
    "main",
    "maybe_ship_job_log",
    "package_parent",
    "parse_attempt",
    "prepare_job_paths",
    "process_alive",
    "read_json",
    "read_log_ends",
    "start_job",
    "start_lock",
    "supervisor_argv",
    "systemd_available",
    "torchrun_shutdown_timeout",
    "under_root",
    "utc_now",
    "validate_cancel_timeout",
    "validate_job_id",
    "wait_for_end",
    "write_json_atomic",
]
