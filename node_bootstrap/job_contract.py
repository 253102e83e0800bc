"""The job contract between the cluster and its nodes: what a job may be asked to run, the names of its states
and files, the patterns its parameters follow, and the exit codes of `python3 -m node_bootstrap.jobs`.

Both sides import it: node_bootstrap.jobs (the launcher, the supervisor, status and cancel on the nodes) and
cluster_jobs (the job model clusterctl and the job keeper share). It imports nothing of the project, so a
reader of one constant ships this module alone: the keeper's Lambda asset holds it and not the launcher, the
supervisor or their CLI (cluster_constructs/bundle.py builds the asset from the keeper's imports). The SSM
document's allowedPatterns (cluster_constructs/jobs.py) are the same expressions: SSM rejects a bad value
before anything runs, and the nodes reject it again for direct callers.

Runs on the nodes' system Python (>= 3.9), standard library only.
"""

import re

# What `python3 -m node_bootstrap.jobs` exits with (the keeper and clusterctl read them from SSM's answers).
EXIT_OK = 0
EXIT_FAILED = 1  # the job failed to start, or an operation on it failed
EXIT_USAGE = 2  # invalid arguments or node config
EXIT_NOT_FOUND = 3  # no such job on this node

# A job's state on a node (status.json "state"). hung: the supervisor stopped a job whose trainer logged no
# step for the hang timeout (node_bootstrap/jobs/progress.py).
STATES = ("running", "succeeded", "failed", "cancelled", "hung")
# A job's states in the job table (cluster_jobs/table.py) in which it may run an attempt: clusterctl and the
# keeper hold the cluster's lock in them, and a node starts only a job the table holds in one of them
# (node_bootstrap/jobs/job_table.py).
TABLE_ACTIVE_STATES = ("starting", "running", "restarting")
# The trainer's resume line with torch.compile (training/metrics.py log_resume, training/compile_cache.py): the
# node's Inductor directory held the job's compile-cache snapshot before the first compile, or there was none.
COMPILE_CACHE_STATES = ("snapshot", "cold")
# What every rank of the trainer logs when it stopped at a stop request, its own SIGTERM's or another rank's,
# after the checkpoint was saved (training/__main__.py).
TRAINER_STOPPED_LINE = "stopped by SIGTERM after step"
# The trainer's phase records (training/phases.py), one JSON line each from local rank 0 of every node when a
# phase longer than a step starts and ends: {"event": "phase", "phase": NAME, "state": "start", "bound_s": S}
# and {"event": "phase", "phase": NAME, "state": "end"}; bound_s (optional, seconds) is the phase's own bound
# where the trainer knows one. The supervisor's hang watch holds a phase to that bound and the steps between
# phases to their cadence (node_bootstrap/jobs/progress.py); job_report.py checks every record.
PHASE_EVENT = "phase"
PHASE_NAMES = ("compile", "checkpoint_load", "checkpoint_save", "validation", "export", "data_wait")
PHASE_STATES = ("start", "end")
MAX_PHASE_BOUND_SECONDS = 86400
# The seconds an attempt spent in each phase after its first step (the supervisor's sum, status "phaseSeconds":
# {NAME: seconds}, NAME one of PHASE_NAMES): the job's goodput moves them out of its productive time
# (cluster_jobs/goodput.py). At most this many per phase: a year, far past any attempt.
MAX_PHASE_SECONDS = 366 * 86400
# The trainer's beat (training/phases.py): {"event": "beat", "step": N}, one JSON line from local rank 0 of every
# node after every step that printed no step line (those come every run.log_interval_steps steps), so the hang
# watch learns the cadence of single steps, not of ten; `status` reads the step and loss from the step lines only.
BEAT_EVENT = "beat"
# Where the supervisor of a job it called hung found the hang (status "hangOrigin", with one line of evidence in
# "hangEvidence": node_bootstrap/jobs/hang_origin.py): "here", a rank on this node is stopped, stuck in
# uninterruptible sleep or in a wait of its own (the node the job keeper restarts without where it can, and
# whose health monitor checks it); "peer", every rank here sleeps, blocked on a peer; "unknown", the host
# cannot tell (a rank spins).
HANG_HERE, HANG_PEER, HANG_UNKNOWN = "here", "peer", "unknown"
HANG_ORIGINS = (HANG_HERE, HANG_PEER, HANG_UNKNOWN)
# A job's files in <jobsDir>/<job id>/ on a node.
STATUS_FILE = "status.json"
# Written next to the status by whoever stops a job for a reason of its own (the node health monitor, before
# its SIGTERM): {"by": ..., "reason": ..., "at": ...}; the supervisor records it in the status.
STOP_REQUEST_FILE = "stop-request.json"

# The one budget from SIGTERM to SIGKILL for a job: systemd's TimeoutStopSec for its unit, and within it
# torchrun's --shutdown-timeout (torch.distributed.run: SIGTERM to the workers, then SIGKILL after that many
# seconds; without the option torchrun takes TORCH_ELASTIC_SHUTDOWN_TIMEOUT or 30 s, torch/distributed/
# launcher/api.py), so the trainer's SIGTERM checkpoint gets almost all of it.
STOP_GRACE_SECONDS = 120

# How `cancel` stops a job. save: SIGTERM, and the trainer's collective checkpoint within the stop grace (a
# user's cancel, a Capacity Block's end, a lone SIGTERM). abort: the job keeper's stop of an ended attempt's
# survivors, whose job restarts from the local or durable tier: a collective save cannot finish without the
# lost node (its ranks block inside it), so the supervisor SIGKILLs torchrun and every worker at once.
CANCEL_SAVE = "save"
CANCEL_ABORT = "abort"
CANCEL_MODES = (CANCEL_SAVE, CANCEL_ABORT)
# The abort's bound: how long `cancel --mode abort` waits for the supervisor to record the end before it
# SIGKILLs what is left itself (the keeper's `cancelTimeoutSeconds` for an abort).
ABORT_STOP_SECONDS = 10

JOB_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{2,62}$")
CONFIG_RE = re.compile(r"^[A-Za-z0-9_./-]+\.toml$")
HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,252}$")
OVERRIDE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.]*=[A-Za-z0-9_.:/+,@%-]*$")
# A job's attempt: 1 for the submit, one more for each restart on a new node set (the job keeper's). The
# document's `attempt` parameter takes the same values.
MAX_ATTEMPT = 1000
ATTEMPT_RE = re.compile(r"^(?:[1-9][0-9]{0,2}|1000)$")

# What a job runs: torchrun's `-m MODULE`, the trainer or the all_reduce bandwidth check (training/commcheck.py);
# or, with no torchrun, one process of the Hugging Face export (training/export.py) on one node.
TRAINING_MODULE = "training"
COMMCHECK_MODULE = "training.commcheck"
EXPORT_MODULE = "training.export"
MODULES = (TRAINING_MODULE, COMMCHECK_MODULE, EXPORT_MODULE)
# An export job writes its Hugging Face directory here, inside its own checkpoint directory (the data repository
# association carries <checkpointRoot>/<job id>/hf to the checkpoint bucket's <job id>/hf/); it reads the
# source job's directory (resume_from), which is sealed read-only to the job user.
EXPORT_OUT_DIR = "hf"
# An export's only option: the checkpoint step to export (none: the newest complete one).
EXPORT_OPTION_RE = re.compile(r"^step=(0|[1-9][0-9]{0,11})$")
# A job's checkpoints go to <checkpointRoot>/<job id> and nowhere else: the launcher sets this key itself.
CHECKPOINT_DIR_KEY = "checkpoint.dir"
# ... and its local checkpoint tier to <scratch>/checkpoints/<job id> on each node (training.checkpoint.local_tier)
LOCAL_CHECKPOINT_DIR_KEY = "checkpoint.local_dir"


class JobError(Exception):
    """A problem the caller can act on; the message is printed as one line."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def check_not_checkpoint_dir(item: str) -> None:
    """A --set of checkpoint.dir is refused: jobs write only their own directory, and --resume auto loads
    only from there (a directory another job or the checkpoint bucket fills is trusted only on request)."""
    key = item.split("=", 1)[0].strip()
    if key == LOCAL_CHECKPOINT_DIR_KEY:
        raise JobError(f"overrides item {item!r}: not allowed: a job's local checkpoints go to the node's scratch, "
                       "<scratch>/checkpoints/<job id>; set checkpoint.local_interval_steps to use them (0: off)",
                       EXIT_USAGE)
    if key == CHECKPOINT_DIR_KEY:
        raise JobError(f"overrides item {item!r}: not allowed: a job's checkpoints go to <checkpoint root>/<job "
                       "id>; to start from another job's checkpoints, resume from that job (clusterctl submit "
                       "--resume-from JOB)", EXIT_USAGE)
