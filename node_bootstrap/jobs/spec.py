"""What one `start` asks for (JobSpec, validated), where a job's files live on the node (JobFiles), how
they are written and read, and the torchrun command line the spec becomes."""

import datetime
import json
import os
import re
from dataclasses import dataclass, field
from typing import Optional

# The contract with the cluster lives at the bottom (node_bootstrap/job_contract.py): re-exported here for
# the package's own modules and its callers.
from node_bootstrap.job_contract import (  # noqa: F401
    ABORT_STOP_SECONDS,
    ATTEMPT_RE,
    CANCEL_ABORT,
    CANCEL_MODES,
    CANCEL_SAVE,
    CHECKPOINT_DIR_KEY,
    COMMCHECK_MODULE,
    CONFIG_RE,
    EXPORT_MODULE,
    EXPORT_OPTION_RE,
    EXPORT_OUT_DIR,
    HOST_RE,
    JOB_ID_RE,
    LOCAL_CHECKPOINT_DIR_KEY,
    MAX_ATTEMPT,
    MODULES,
    OVERRIDE_RE,
    STATES,
    STATUS_FILE,
    STOP_GRACE_SECONDS,
    STOP_REQUEST_FILE,
    TRAINING_MODULE,
    check_not_checkpoint_dir,
)
from node_bootstrap.jobs.errors import EXIT_USAGE, JobError
from node_bootstrap.jobs.settings import JobSettings

UNIT_PREFIX = "training-job-"
TORCHRUN_EXIT_SECONDS = 10  # of the stop grace: torchrun's own exit and the supervisor's status write after it
# torchrun as the nodes run it: torch.distributed.run with its agents' exit barrier bounded (300 s by default, and
# deaf to SIGTERM: a node whose workers ended while another node's agent was being stopped waited it out;
# training/torchrun.py says when that happens)
TORCHRUN_MODULE = "training.torchrun"
TORCHRUN_EXIT_BARRIER_SECONDS = 30
# The SSM document's step (aws:runShellScript timeoutSeconds) stops a node command after this long.
COMMAND_TIMEOUT_SECONDS = 900
# What `cancel` may still need after its SIGTERM wait: up to 10 s for the end to be recorded after SIGKILL,
# `systemctl stop` (bounded at STOP_GRACE_SECONDS + 30 s), and 60 s for start-up and the status reads.
CANCEL_AFTER_WAIT_SECONDS = 10 + (STOP_GRACE_SECONDS + 30) + 60
# The longest SIGTERM wait `cancel` takes: the rest of the step's time, so a cancel is never cut off by it.
MAX_CANCEL_TIMEOUT_SECONDS = COMMAND_TIMEOUT_SECONDS - CANCEL_AFTER_WAIT_SECONDS
# commcheck's overrides become its options (key=value -> --key value, _ -> -): a plain key, no dots.
_OPTION_KEY_RE = re.compile(r"^[a-z][a-z0-9_]*$")


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def phase_time() -> str:
    """Now, UTC to the millisecond: the trainer's phase times have the same form (training/metrics.py)."""
    now = datetime.datetime.now(datetime.timezone.utc)
    return now.strftime("%Y-%m-%dT%H:%M:%S") + f".{now.microsecond // 1000:03d}Z"


@dataclass(frozen=True)
class JobSpec:
    """What one `start` asks for; the same on every node of the job."""

    job_id: str
    config: str  # training TOML, relative to the bundle dir (training/configs/X.toml) or absolute
    nodes: int
    gpus_per_node: int
    rendezvous_host: str  # private IP of the node that hosts the c10d store
    max_restarts: int  # torchrun --max-restarts: whole-job restarts after a worker failure
    # key=value items: training's --set overrides, or commcheck's options (build_option_args)
    overrides: tuple[str, ...] = field(default_factory=tuple)
    module: str = TRAINING_MODULE  # one of MODULES: what torchrun runs
    stop_grace_seconds: int = STOP_GRACE_SECONDS  # SIGTERM to SIGKILL: the unit's and (less its exit) torchrun's
    # training: another job whose checkpoints this one starts from when its own directory has none (the
    # operator's explicit choice to load what that job's directory holds); "" = only its own
    resume_from: str = ""
    # 1 for the job's first start; a later attempt restarts the job under the same id, checkpoint directory
    # and rendezvous id (attempts.py)
    attempt: int = 1

    def validate(self) -> None:
        validate_job_id(self.job_id)
        if self.module not in MODULES:
            raise JobError(f"module={self.module!r}: allowed: {', '.join(MODULES)}", EXIT_USAGE)
        if self.module == TRAINING_MODULE:
            config_ok = bool(CONFIG_RE.fullmatch(self.config)) and ".." not in self.config.split("/")
            config_allowed = "a .toml path of letters, digits, _ . / - without '..'"
        else:
            config_ok, config_allowed = self.config == "", f"empty: {self.module} takes no training config"
        export = self.module == EXPORT_MODULE
        checks = [
            ("config", self.config, config_ok, config_allowed),
            ("nodes", self.nodes, 1 <= self.nodes <= 4096 and (self.nodes == 1 or not export),
             f"1 for {self.module} (one process on one node)" if export else "1-4096"),
            ("gpus-per-node", self.gpus_per_node, 1 <= self.gpus_per_node <= 64, "1-64"),
            ("rendezvous-host", self.rendezvous_host, bool(HOST_RE.fullmatch(self.rendezvous_host)),
             "an IP address or host name"),
            ("max-restarts", self.max_restarts, 0 <= self.max_restarts <= 100, "0-100"),
            ("attempt", self.attempt, 1 <= self.attempt <= MAX_ATTEMPT, f"an integer 1-{MAX_ATTEMPT}"),
            ("stop-grace-seconds", self.stop_grace_seconds,
             TORCHRUN_EXIT_SECONDS < self.stop_grace_seconds <= 3600, f"{TORCHRUN_EXIT_SECONDS + 1}-3600"),
        ]
        for name, value, ok, allowed in checks:
            if not ok:
                raise JobError(f"{name}={value!r}: allowed: {allowed}", EXIT_USAGE)
        for item in self.overrides:
            if not OVERRIDE_RE.fullmatch(item):
                raise JobError(
                    f"overrides item {item!r}: allowed: key=value with a dotted key and a value of letters, "
                    "digits and _ . : / + , @ % -",
                    EXIT_USAGE,
                )
            if self.module == COMMCHECK_MODULE and not _OPTION_KEY_RE.fullmatch(item.split("=", 1)[0]):
                raise JobError(f"overrides item {item!r}: allowed for {self.module}: option=value with an "
                               "option name of a-z 0-9 _ (e.g. min_busbw_gbps=350)", EXIT_USAGE)
            if export and not EXPORT_OPTION_RE.fullmatch(item):
                raise JobError(f"overrides item {item!r}: allowed for {self.module}: step=N, the checkpoint step "
                               "to export", EXIT_USAGE)
            check_not_checkpoint_dir(item)
        if export and len(self.overrides) > 1:
            raise JobError(f"overrides={' '.join(self.overrides)!r}: allowed for {self.module}: one step=N at most",
                           EXIT_USAGE)
        if export and not self.resume_from:
            raise JobError(f"resume-from='': {self.module} needs the id of the job whose checkpoint it exports",
                           EXIT_USAGE)
        if self.resume_from:
            if self.module == COMMCHECK_MODULE:
                raise JobError(f"resume-from={self.resume_from!r}: allowed only for {TRAINING_MODULE} and "
                               f"{EXPORT_MODULE}", EXIT_USAGE)
            if not JOB_ID_RE.fullmatch(self.resume_from) or self.resume_from == self.job_id:
                raise JobError(f"resume-from={self.resume_from!r}: allowed: the id of another job, whose "
                               "checkpoint directory this job " + ("exports" if export else "starts from"),
                               EXIT_USAGE)


def parse_attempt(text: str) -> int:
    """`start --attempt`: a decimal integer 1-MAX_ATTEMPT, or one line saying what is allowed."""
    if not ATTEMPT_RE.fullmatch(text):
        raise JobError(f"attempt={text!r}: allowed: an integer 1-{MAX_ATTEMPT}", EXIT_USAGE)
    return int(text)


def validate_cancel_timeout(timeout_seconds: float) -> None:
    if not 0 <= timeout_seconds <= MAX_CANCEL_TIMEOUT_SECONDS:  # false for nan
        raise JobError(f"timeout-seconds={timeout_seconds!r}: allowed: 0-{MAX_CANCEL_TIMEOUT_SECONDS} (the SSM "
                       f"command's {COMMAND_TIMEOUT_SECONDS} s less what cancel needs after SIGKILL)", EXIT_USAGE)


def validate_job_id(job_id: str) -> None:
    if not JOB_ID_RE.fullmatch(job_id):
        raise JobError(f"job-id={job_id!r}: allowed: 3-63 of a-z 0-9 -, starting with a letter or digit",
                       EXIT_USAGE)


def local_checkpoint_dir(settings: JobSettings, job_id: str) -> str:
    """The job's local checkpoint tier on this node ("" when the settings name no scratch)."""
    root = settings.local_checkpoint_root
    return os.path.join(root, job_id) if root else ""


def job_scratch_dir(settings: JobSettings, job_id: str) -> str:
    """The job's own scratch on this node, its HOME and TMPDIR ("" when the settings name no scratch)."""
    root = settings.job_scratch_root
    return os.path.join(root, job_id) if root else ""


def checkpoint_dir(settings: JobSettings, job_id: str) -> str:
    """The job's own checkpoint directory: the only one it writes, and the one --resume auto reads."""
    return f"{settings.checkpoint_root.rstrip('/')}/{job_id}"


def export_out_dir(settings: JobSettings, job_id: str) -> str:
    """Where an export job writes the Hugging Face directory: inside its own checkpoint directory."""
    return f"{checkpoint_dir(settings, job_id)}/{EXPORT_OUT_DIR}"


@dataclass(frozen=True)
class JobFiles:
    """Where one job's files live on the node (docs/architecture.md section 5)."""

    job_dir: str
    status_path: str  # state, exit code, times, pids: written atomically by the supervisor
    spec_path: str  # job.json: the argv and paths the supervisor runs, written by `start`
    supervisor_log: str  # the supervisor's own stderr (direct launcher); systemd keeps it in the journal
    stop_request_path: str  # STOP_REQUEST_FILE: why someone other than `cancel` stopped the job
    log_path: str  # torchrun's output, shipped to CloudWatch
    # the trainer's step metrics as the supervisor publishes them (EMF; job_metrics.py), root's, shipped too
    metrics_path: str
    unit: str  # systemd unit name

    @classmethod
    def of(cls, settings: JobSettings, job_id: str) -> "JobFiles":
        job_dir = os.path.join(settings.jobs_dir, job_id)
        return cls(
            job_dir=job_dir,
            status_path=os.path.join(job_dir, STATUS_FILE),
            spec_path=os.path.join(job_dir, "job.json"),
            supervisor_log=os.path.join(job_dir, "supervisor.log"),
            stop_request_path=os.path.join(job_dir, STOP_REQUEST_FILE),
            log_path=os.path.join(settings.job_log_dir, job_id + ".log"),
            metrics_path=os.path.join(settings.job_log_dir, job_id + ".metrics.log"),
            unit=UNIT_PREFIX + job_id,
        )

    def kept_aside(self, path: str, attempt: int) -> str:
        """Where a later attempt's `start` keeps attempt `attempt`'s copy of `path` (status.json ->
        status.attempt-1.json): next to it, in the job's directory."""
        stem, ext = os.path.splitext(os.path.basename(path))
        return os.path.join(self.job_dir, f"{stem}.attempt-{attempt}{ext}")


def write_json_atomic(path: str, data: dict[str, object]) -> None:
    """Readers (status, cancel, clusterctl through SSM) never see a half-written file."""
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w") as f:
        json.dump(data, f, indent=2, sort_keys=True)
        f.write("\n")
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


def read_json(path: str) -> Optional[dict[str, object]]:
    try:
        with open(path) as f:
            data = json.load(f)
    except (OSError, ValueError):
        return None
    return data if isinstance(data, dict) else None


def torchrun_shutdown_timeout(stop_grace_seconds: int) -> int:
    """torchrun's --shutdown-timeout inside a job's stop grace: the workers' time to save after SIGTERM."""
    return stop_grace_seconds - TORCHRUN_EXIT_SECONDS


def build_torchrun_argv(settings: JobSettings, spec: JobSpec) -> list[str]:
    """The command every node runs. c10d rendezvous on the first node: the same argv on every node, node
    ranks assigned by the rendezvous (torchrun docs, "Usage: multi-node multi-worker"). The trainer gets
    its config, resume (from its own directory; from another job's only with resume_from) and its own
    checkpoint directory; commcheck gets only its options. An export runs no torchrun: one process, whose
    paths the launcher makes from the two job ids (the source's directory, read; its own, written)."""
    if spec.module == EXPORT_MODULE:
        return [settings.python, "-m", EXPORT_MODULE, "--checkpoint", checkpoint_dir(settings, spec.resume_from),
                "--out", export_out_dir(settings, spec.job_id)] + build_option_args(spec.overrides)
    argv = [
        settings.python, "-m", TORCHRUN_MODULE, "--exit-barrier-seconds", str(TORCHRUN_EXIT_BARRIER_SECONDS),
        "--nnodes", str(spec.nodes),
        "--nproc-per-node", str(spec.gpus_per_node),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{spec.rendezvous_host}:{settings.rendezvous_port}",
        "--rdzv-id", spec.job_id,
        "--max-restarts", str(spec.max_restarts),
        "--shutdown-timeout", str(torchrun_shutdown_timeout(spec.stop_grace_seconds)),
        "-m", spec.module,
    ]
    if spec.module == COMMCHECK_MODULE:
        return argv + build_option_args(spec.overrides)
    argv += ["--config", spec.config, "--resume", "auto"]
    if spec.resume_from:
        argv += ["--resume-from-dir", checkpoint_dir(settings, spec.resume_from)]
    for item in spec.overrides:
        argv += ["--set", item]
    # last, so that they win over the config file and anything before (the trainer's --set: the last wins)
    local = local_checkpoint_dir(settings, spec.job_id)
    if local:
        argv += ["--set", f"{LOCAL_CHECKPOINT_DIR_KEY}={local}"]
    return argv + ["--set", f"{CHECKPOINT_DIR_KEY}={checkpoint_dir(settings, spec.job_id)}"]


def build_option_args(overrides: tuple[str, ...]) -> list[str]:
    """key=value items as command-line options: min_busbw_gbps=350 -> --min-busbw-gbps 350."""
    args: list[str] = []
    for item in overrides:
        key, value = item.split("=", 1)
        args += ["--" + key.replace("_", "-"), value]
    return args
