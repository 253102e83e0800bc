"""Training jobs on one node: start torchrun detached, report its status, cancel it.

The stack's SSM document (cluster_constructs/jobs.py) runs this module on every node of a job with one
ssm:SendCommand (docs/architecture.md section 5):

    python3 -m node_bootstrap.jobs start  --job-id J --config training/configs/X.toml --nodes N \
        --gpus-per-node G --rendezvous-host IP --max-restarts R [--overrides "k=v k=v"]
    python3 -m node_bootstrap.jobs status --job-id J
    python3 -m node_bootstrap.jobs cancel --job-id J [--timeout-seconds 120]

Why detached: SSM Run Command stops a command after at most 48 hours and truncates its output, and a
restart of the SSM agent kills the processes in its cgroup. So `start` only launches a supervisor
(`python3 -m node_bootstrap.jobs supervise`) in its own systemd unit `training-job-<id>` and returns. The
supervisor sources the training env file, runs torchrun, tees its output to the job log (which the
CloudWatch agent ships to the stream `jobs/<id>/{instance_id}`), records status.json, and forwards SIGTERM
to torchrun so the trainer checkpoints before it exits.

Launchers: `systemd` (systemd-run; the default wherever systemd is PID 1) and `direct` (double fork and
setsid; for containers and tests, where systemd is not running). Both run the same supervisor.

Runs on the node's system Python (>= 3.9), standard library only.
"""

import argparse
import datetime
import json
import os
import re
import shutil
import signal
import socket
import subprocess
import sys
import time
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import BinaryIO, Optional

DEFAULT_NODE_CONFIG = "/etc/cluster/node-config.json"
CLOUDWATCH_AGENT_CTL = "/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl"
CLOUDWATCH_JOBS_CONFIG_DIR = "/etc/cluster/cloudwatch-agent-jobs"
UNIT_PREFIX = "training-job-"
STATES = ("running", "succeeded", "failed", "cancelled")

# The SSM document's allowedPatterns (cluster_constructs/jobs.py) are the same expressions: SSM rejects a
# bad value before anything runs, and this module rejects it again for direct callers.
JOB_ID_RE = re.compile(r"^[a-z0-9][a-z0-9-]{2,62}$")
CONFIG_RE = re.compile(r"^[A-Za-z0-9_./-]+\.toml$")
HOST_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9.-]{0,252}$")
OVERRIDE_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_.]*=[A-Za-z0-9_.:/+,@%-]*$")

EXIT_OK = 0
EXIT_FAILED = 1  # the job failed to start, or an operation on it failed
EXIT_USAGE = 2  # invalid arguments or node config
EXIT_NOT_FOUND = 3  # no such job on this node

LOG_TAIL_BYTES = 512 * 1024  # how much of the job log `status` scans for the last step line
START_WAIT_SECONDS = 30.0  # how long `start` waits for the supervisor to record the running state
STOP_GRACE_SECONDS = 120  # systemd TimeoutStopSec: SIGTERM to the supervisor, then SIGKILL to the unit


class JobError(Exception):
    """A problem the caller can act on; the message is printed as one line."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


def utc_now() -> str:
    return datetime.datetime.now(datetime.timezone.utc).strftime("%Y-%m-%dT%H:%M:%SZ")


def under_root(root: str, path: str) -> str:
    """`path` (absolute, as on a real node) inside `root`; the identity for root "/"."""
    return os.path.join(root, path.lstrip("/")) if root != "/" else path


# --- node config ---------------------------------------------------------------------------------------


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


def load_settings(root: str = "/", node_config: str = DEFAULT_NODE_CONFIG) -> JobSettings:
    path = under_root(root, node_config)
    try:
        with open(path) as f:
            config = json.load(f)
    except OSError as e:
        raise JobError(f"cannot read node config {path}: {e.strerror}", EXIT_USAGE) from None
    except ValueError as e:
        raise JobError(f"node config {path} is not valid JSON: {e}", EXIT_USAGE) from None

    kind_names = {int: "an integer", str: "a string"}

    def get(section: str, key: str, kind: type) -> object:
        value = config.get(section, {}).get(key) if isinstance(config.get(section), dict) else None
        if not isinstance(value, kind) or isinstance(value, bool):
            raise JobError(
                f"node config {path}: {section}.{key}={value!r}: expected {kind_names[kind]}",
                EXIT_USAGE,
            )
        return value

    def node_path(section: str, key: str) -> str:
        value = str(get(section, key, str))
        if not value.startswith("/"):
            raise JobError(f"node config {path}: {section}.{key}={value!r}: expected an absolute path",
                           EXIT_USAGE)
        return under_root(root, value)

    port = int(get("training", "rendezvousPort", int))  # type: ignore[call-overload]
    if not 1 <= port <= 65535:
        raise JobError(f"node config {path}: training.rendezvousPort={port}: expected 1-65535", EXIT_USAGE)
    return JobSettings(
        root=root,
        python=node_path("training", "python"),
        bundle_dir=node_path("training", "bundleDir"),
        env_file=node_path("training", "envFile"),
        jobs_dir=node_path("training", "jobsDir"),
        job_log_dir=node_path("training", "jobLogDir"),
        checkpoint_root=node_path("training", "checkpointRoot"),
        rendezvous_port=port,
        log_group_name=str(get("logging", "logGroupName", str)),
    )


# --- job spec and files --------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobSpec:
    """What one `start` asks for; the same on every node of the job."""

    job_id: str
    config: str  # training TOML, relative to the bundle dir (training/configs/X.toml) or absolute
    nodes: int
    gpus_per_node: int
    rendezvous_host: str  # private IP of the node that hosts the c10d store
    max_restarts: int  # torchrun --max-restarts: whole-job restarts after a worker failure
    overrides: tuple[str, ...] = field(default_factory=tuple)  # training --set key=value items

    def validate(self) -> None:
        validate_job_id(self.job_id)
        checks = [
            ("config", self.config, bool(CONFIG_RE.match(self.config)) and ".." not in self.config.split("/"),
             "a .toml path of letters, digits, _ . / - without '..'"),
            ("nodes", self.nodes, 1 <= self.nodes <= 4096, "1-4096"),
            ("gpus-per-node", self.gpus_per_node, 1 <= self.gpus_per_node <= 64, "1-64"),
            ("rendezvous-host", self.rendezvous_host, bool(HOST_RE.match(self.rendezvous_host)),
             "an IP address or host name"),
            ("max-restarts", self.max_restarts, 0 <= self.max_restarts <= 100, "0-100"),
        ]
        for name, value, ok, allowed in checks:
            if not ok:
                raise JobError(f"{name}={value!r}: allowed: {allowed}", EXIT_USAGE)
        for item in self.overrides:
            if not OVERRIDE_RE.match(item):
                raise JobError(
                    f"overrides item {item!r}: allowed: key=value with a dotted key and a value of letters, "
                    "digits and _ . : / + , @ % -",
                    EXIT_USAGE,
                )


def validate_job_id(job_id: str) -> None:
    if not JOB_ID_RE.match(job_id):
        raise JobError(f"job-id={job_id!r}: allowed: 3-63 of a-z 0-9 -, starting with a letter or digit",
                       EXIT_USAGE)


@dataclass(frozen=True)
class JobFiles:
    """Where one job's files live on the node (docs/architecture.md section 5)."""

    job_dir: str
    status_path: str  # state, exit code, times, pids: written atomically by the supervisor
    spec_path: str  # job.json: the argv and paths the supervisor runs, written by `start`
    supervisor_log: str  # the supervisor's own stderr (direct launcher); systemd keeps it in the journal
    log_path: str  # torchrun's output, shipped to CloudWatch
    unit: str  # systemd unit name

    @classmethod
    def of(cls, settings: JobSettings, job_id: str) -> "JobFiles":
        job_dir = os.path.join(settings.jobs_dir, job_id)
        return cls(
            job_dir=job_dir,
            status_path=os.path.join(job_dir, "status.json"),
            spec_path=os.path.join(job_dir, "job.json"),
            supervisor_log=os.path.join(job_dir, "supervisor.log"),
            log_path=os.path.join(settings.job_log_dir, job_id + ".log"),
            unit=UNIT_PREFIX + job_id,
        )


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


def build_torchrun_argv(settings: JobSettings, spec: JobSpec) -> list[str]:
    """The command every node runs. c10d rendezvous on the first node: the same argv on every node, node
    ranks assigned by the rendezvous (torchrun docs, "Usage: multi-node multi-worker")."""
    argv = [
        settings.python, "-m", "torch.distributed.run",
        "--nnodes", str(spec.nodes),
        "--nproc-per-node", str(spec.gpus_per_node),
        "--rdzv-backend", "c10d",
        "--rdzv-endpoint", f"{spec.rendezvous_host}:{settings.rendezvous_port}",
        "--rdzv-id", spec.job_id,
        "--max-restarts", str(spec.max_restarts),
        "-m", "training",
        "--config", spec.config,
        "--resume", "auto",
        "--set", f"checkpoint.dir={settings.checkpoint_root.rstrip('/')}/{spec.job_id}",
    ]
    for item in spec.overrides:
        argv += ["--set", item]
    return argv


# --- CloudWatch ----------------------------------------------------------------------------------------


def build_cloudwatch_config(settings: JobSettings, job_id: str, log_path: str) -> dict[str, object]:
    """An agent config fragment that ships this job's log; `append-config` merges it with the bootstrap's."""
    return {
        "logs": {
            "logs_collected": {
                "files": {
                    "collect_list": [
                        {
                            "file_path": log_path,
                            "log_group_name": settings.log_group_name,
                            # {instance_id} is expanded by the agent (CloudWatch agent configuration docs).
                            "log_stream_name": f"jobs/{job_id}/{{instance_id}}",
                        }
                    ]
                }
            }
        }
    }


def maybe_ship_job_log(settings: JobSettings, job_id: str, log_path: str) -> str:
    """Adds the job log to the CloudWatch agent when the agent is installed; returns what happened. A
    failure here does not stop the job: its log is still on the node."""
    ctl = under_root(settings.root, CLOUDWATCH_AGENT_CTL)
    if not os.access(ctl, os.X_OK):
        return f"CloudWatch agent not installed: the job log is only on the node at {log_path}"
    config_dir = under_root(settings.root, CLOUDWATCH_JOBS_CONFIG_DIR)
    os.makedirs(config_dir, exist_ok=True)
    config_path = os.path.join(config_dir, job_id + ".json")
    write_json_atomic(config_path, build_cloudwatch_config(settings, job_id, log_path))
    argv = [ctl, "-a", "append-config", "-m", "ec2", "-c", "file:" + config_path, "-s"]
    try:
        result = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120,
                                text=True)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"CloudWatch agent append-config failed: {e}"
    if result.returncode != 0:
        tail = result.stdout.strip().splitlines()[-1:] or ["no output"]
        return f"CloudWatch agent append-config exited {result.returncode}: {tail[0]}"
    return f"shipping to CloudWatch Logs {settings.log_group_name} stream jobs/{job_id}/<instance id>"


# --- start ---------------------------------------------------------------------------------------------


def systemd_available(root: str) -> bool:
    """sd_booted(3): systemd is PID 1 when /run/systemd/system exists."""
    return os.path.isdir(under_root(root, "/run/systemd/system")) and shutil.which("systemd-run") is not None


def supervisor_argv(settings: JobSettings, node_config: str, job_id: str) -> list[str]:
    return [sys.executable, "-m", "node_bootstrap.jobs", "--root", settings.root,
            "--node-config", node_config, "supervise", "--job-id", job_id]


def package_parent() -> str:
    """The directory that holds node_bootstrap/, so the supervisor imports this same code."""
    return os.path.dirname(os.path.dirname(os.path.abspath(__file__)))


def launch_systemd(files: JobFiles, argv: list[str]) -> None:
    # KillMode=mixed: `systemctl stop` and shutdown (capacity-block end, node drain) send SIGTERM to the
    # supervisor only, which forwards it to torchrun; SIGKILL reaches the rest after TimeoutStopSec.
    command = [
        "systemd-run", "--unit=" + files.unit, "--collect", "--no-block",
        "--description=training job " + files.unit[len(UNIT_PREFIX):],
        "--property=KillMode=mixed", f"--property=TimeoutStopSec={STOP_GRACE_SECONDS}",
        "--setenv=PYTHONPATH=" + package_parent(), "--",
    ] + argv
    result = subprocess.run(command, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True,
                            timeout=60)
    if result.returncode != 0:
        raise JobError(f"systemd-run exited {result.returncode}: {result.stdout.strip()}")


def launch_direct(files: JobFiles, argv: list[str]) -> None:
    """Double fork and setsid: the supervisor belongs to no terminal and no parent that waits for it."""
    env = dict(os.environ)
    env["PYTHONPATH"] = os.pathsep.join(p for p in (package_parent(), env.get("PYTHONPATH", "")) if p)
    pid = os.fork()
    if pid == 0:  # first child
        code = 0
        try:
            os.setsid()
            if os.fork() == 0:  # grandchild: becomes the supervisor
                code = 127
                null_fd = os.open(os.devnull, os.O_RDONLY)
                log_fd = os.open(files.supervisor_log, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
                os.dup2(null_fd, 0)
                os.dup2(log_fd, 1)
                os.dup2(log_fd, 2)
                os.chdir("/")
                os.execve(argv[0], argv, env)
        except BaseException as e:  # noqa: B036 - nothing may escape a forked child
            os.write(2, (f"cannot start the supervisor: {e}\n").encode())
        finally:
            os._exit(code)
    os.waitpid(pid, 0)


def start_job(settings: JobSettings, spec: JobSpec, node_config: str, launcher: str = "auto",
              wait_seconds: float = START_WAIT_SECONDS) -> dict[str, object]:
    spec.validate()
    files = JobFiles.of(settings, spec.job_id)
    if os.path.exists(files.job_dir):
        raise JobError(f"job {spec.job_id} already exists on this node ({files.job_dir})")
    if launcher == "auto":
        launcher = "systemd" if systemd_available(settings.root) else "direct"

    os.makedirs(files.job_dir)
    os.makedirs(settings.job_log_dir, exist_ok=True)
    write_json_atomic(files.spec_path, {
        "jobId": spec.job_id,
        "argv": build_torchrun_argv(settings, spec),
        "cwd": settings.bundle_dir,
        "envFile": settings.env_file,
        "logPath": files.log_path,
        "unit": files.unit,
        "launcher": launcher,
        "createdAt": utc_now(),
    })
    cloudwatch = maybe_ship_job_log(settings, spec.job_id, files.log_path)
    argv = supervisor_argv(settings, node_config, spec.job_id)
    try:
        if launcher == "systemd":
            launch_systemd(files, argv)
        else:
            launch_direct(files, argv)
    except (JobError, OSError, subprocess.TimeoutExpired) as e:
        write_json_atomic(files.status_path, {"jobId": spec.job_id, "state": "failed", "exitCode": None,
                                              "startedAt": utc_now(), "endedAt": utc_now(), "pid": None,
                                              "launcher": launcher, "error": f"launch failed: {e}"})
        raise JobError(f"job {spec.job_id}: launch failed: {e}") from None

    deadline = time.monotonic() + wait_seconds
    status = read_json(files.status_path)
    # Wait until the child runs (pid recorded) or the job has already ended.
    while (status is None or status.get("state") == "running" and status.get("pid") is None) and (
            time.monotonic() < deadline):
        time.sleep(0.1)
        status = read_json(files.status_path)
    if status is None:
        raise JobError("the supervisor did not record the job within {:.0f} s; see {}".format(
            wait_seconds, "journalctl -u " + files.unit if launcher == "systemd" else files.supervisor_log))
    result = dict(status)
    result["cloudwatch"] = cloudwatch
    result["logPath"] = files.log_path
    if status.get("state") == "failed":
        raise JobError("job {} failed to start: {}".format(spec.job_id, status.get("error") or result))
    return result


# --- supervise -----------------------------------------------------------------------------------------


def build_job_command(env_file: str, argv: list[str]) -> list[str]:
    """Source the env file with `set -a` (every KEY=value becomes an environment variable, shell quoting
    as the file's writer intended), then exec the job so it keeps the supervisor's process group."""
    if not os.path.isfile(env_file):
        return list(argv)
    return ["/bin/bash", "-c", 'set -a && . "$0" && set +a && exec "$@"', env_file] + list(argv)


def exit_code_of(returncode: int) -> tuple[int, Optional[str]]:
    """Popen's negative returncode for a signal, as a shell exit code (128 + N) plus the signal name."""
    if returncode >= 0:
        return returncode, None
    try:
        name = signal.Signals(-returncode).name
    except ValueError:
        name = f"signal {-returncode}"
    return 128 - returncode, name


class Supervisor:
    """Runs one job: the process behind the systemd unit (or the direct launcher's daemon)."""

    def __init__(self, settings: JobSettings, job_id: str) -> None:
        self.files = JobFiles.of(settings, job_id)
        spec = read_json(self.files.spec_path)
        if spec is None:
            raise JobError(f"no job {job_id} on this node ({self.files.spec_path} missing)", EXIT_NOT_FOUND)
        self.spec = spec
        self.child: Optional[subprocess.Popen] = None  # type: ignore[type-arg]
        self.terminate_requested = False
        self.status: dict[str, object] = {
            "jobId": job_id,
            "state": "running",
            "exitCode": None,
            "startedAt": utc_now(),
            "endedAt": None,
            "pid": None,
            "supervisorPid": os.getpid(),
            "unit": spec.get("unit"),
            "launcher": spec.get("launcher"),
            "hostname": socket.gethostname(),
        }

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self.terminate_requested = True
        self._forward(signum)

    def _forward(self, signum: int) -> None:
        if self.child is not None and self.child.poll() is None:
            try:
                os.killpg(self.child.pid, signum)  # the child leads its own process group
            except ProcessLookupError:
                pass

    def _finish(self, state: str, exit_code: Optional[int], **extra: object) -> int:
        self.status.update(state=state, exitCode=exit_code, endedAt=utc_now(), **extra)
        write_json_atomic(self.files.status_path, self.status)
        return exit_code if exit_code is not None else EXIT_FAILED

    def run(self) -> int:
        signal.signal(signal.SIGTERM, self._on_sigterm)
        signal.signal(signal.SIGINT, self._on_sigterm)
        signal.signal(signal.SIGHUP, signal.SIG_IGN)  # a closed session must not end the job
        write_json_atomic(self.files.status_path, self.status)
        if self.terminate_requested:
            return self._finish("cancelled", None, error="SIGTERM before the job started")

        argv = [str(a) for a in self.spec["argv"]]  # type: ignore[union-attr]
        cwd = str(self.spec["cwd"])
        env = dict(os.environ)
        env["PYTHONPATH"] = os.pathsep.join(p for p in (cwd, env.get("PYTHONPATH", "")) if p)
        env["PYTHONUNBUFFERED"] = "1"  # step lines reach the log (and CloudWatch) as they happen
        env["CLUSTER_JOB_ID"] = str(self.status["jobId"])
        command = build_job_command(str(self.spec["envFile"]), argv)
        with open(str(self.spec["logPath"]), "ab") as log:
            log.write(("[node_bootstrap.jobs] {} start on {}: {}\n".format(
                utc_now(), self.status["hostname"], " ".join(argv))).encode())
            log.flush()
            try:
                self.child = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              start_new_session=True)
            except OSError as e:
                message = f"cannot run {command[0]}: {e.strerror}"
                log.write((f"[node_bootstrap.jobs] {message}\n").encode())
                return self._finish("failed", 127, error=message)
            if self.terminate_requested:  # SIGTERM arrived while the child was being created
                self._forward(signal.SIGTERM)
            self.status["pid"] = self.child.pid
            write_json_atomic(self.files.status_path, self.status)
            self._tee(self.child, log)
            returncode = self.child.wait()
            exit_code, signal_name = exit_code_of(returncode)
            suffix = f" ({signal_name})" if signal_name else ""
            log.write(f"[node_bootstrap.jobs] {utc_now()} exit code {exit_code}{suffix}\n".encode())
        if self.terminate_requested:
            return self._finish("cancelled", exit_code, signal=signal_name)
        return self._finish("succeeded" if exit_code == 0 else "failed", exit_code, signal=signal_name)

    @staticmethod
    def _tee(child: "subprocess.Popen[bytes]", log: BinaryIO) -> None:
        out = getattr(sys.stdout, "buffer", None)
        assert child.stdout is not None
        for line in iter(child.stdout.readline, b""):
            log.write(line)
            log.flush()
            if out is not None:
                try:
                    out.write(line)
                    out.flush()
                except (OSError, ValueError):
                    out = None  # the journal or terminal went away; the log file still has it


# --- status and cancel ---------------------------------------------------------------------------------


def last_step(log_path: str) -> Optional[dict[str, object]]:
    """The last trainer progress line, {"event": "step", "step": ..., "loss": ...}, in the log's tail.
    torchrun may prefix lines (e.g. "[rank0]:"), so the JSON starts at the first "{"."""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            f.seek(max(0, size - LOG_TAIL_BYTES))
            tail = f.read().decode("utf-8", "replace")
    except OSError:
        return None
    for line in reversed(tail.splitlines()):
        start = line.find("{")
        if start < 0 or '"step"' not in line:
            continue
        try:
            event = json.loads(line[start:])
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == "step":
            return event
    return None


def process_alive(pid: object, job_id: str) -> bool:
    """Whether `pid` is still this job's supervisor (its command line names the job: no pid reuse)."""
    if not isinstance(pid, int) or pid <= 0:
        return False
    try:
        with open(f"/proc/{pid}/cmdline", "rb") as f:
            cmdline = f.read().split(b"\0")
    except OSError:
        return False
    return job_id.encode() in cmdline


def job_status(settings: JobSettings, job_id: str) -> dict[str, object]:
    validate_job_id(job_id)
    files = JobFiles.of(settings, job_id)
    status = read_json(files.status_path)
    if status is None:
        raise JobError(f"no job {job_id} on this node ({files.status_path} missing)", EXIT_NOT_FOUND)
    result = dict(status)
    if result.get("state") == "running" and not process_alive(result.get("supervisorPid"), job_id):
        # The node rebooted or the supervisor was killed: the recorded state can no longer change.
        result["state"] = "failed"
        pid = result.get("supervisorPid")
        result["error"] = f"the supervisor (pid {pid}) is gone without recording an end state"
    step = last_step(files.log_path)
    result["lastStep"] = step.get("step") if step else None
    result["lastLoss"] = step.get("loss") if step else None
    result["logPath"] = files.log_path
    return result


def descendants(pid: int) -> list[int]:
    """All processes below `pid`, from /proc (torchrun starts its workers in new sessions, so killing a
    process group does not reach them)."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir("/proc"):
        if not entry.isdigit():
            continue
        try:
            with open(f"/proc/{entry}/stat") as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])  # comm may contain spaces and parentheses
        children.setdefault(ppid, []).append(int(entry))
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in children.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def wait_for_end(status_path: str, job_id: str, timeout_seconds: float) -> Optional[dict[str, object]]:
    deadline = time.monotonic() + timeout_seconds
    while True:
        status = read_json(status_path) or {}
        if status.get("state") != "running":
            return status
        if not process_alive(status.get("supervisorPid"), job_id) or time.monotonic() >= deadline:
            return None
        time.sleep(0.2)


def cancel_job(settings: JobSettings, job_id: str,
               timeout_seconds: float = STOP_GRACE_SECONDS) -> dict[str, object]:
    """SIGTERM to the supervisor, which forwards it to torchrun so the trainer checkpoints; after
    `timeout_seconds`, SIGKILL to everything the job started, then stop the unit."""
    status = job_status(settings, job_id)
    if status.get("state") != "running":
        status["cancel"] = "already {}".format(status.get("state"))
        return status
    files = JobFiles.of(settings, job_id)
    supervisor_pid = int(status["supervisorPid"])  # type: ignore[call-overload]
    if status.get("launcher") == "systemd" and shutil.which("systemctl"):
        subprocess.run(["systemctl", "kill", "--kill-whom=main", "--signal=SIGTERM", files.unit + ".service"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    else:
        try:
            os.kill(supervisor_pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    ended = wait_for_end(files.status_path, job_id, timeout_seconds)
    how = "stopped by SIGTERM"
    if ended is None:
        how = f"SIGKILL after {timeout_seconds:.0f} s"
        if process_alive(supervisor_pid, job_id):
            for pid in descendants(supervisor_pid):
                try:
                    os.kill(pid, signal.SIGKILL)
                except ProcessLookupError:
                    pass
        ended = wait_for_end(files.status_path, job_id, 10.0)
        if status.get("launcher") == "systemd" and shutil.which("systemctl"):
            subprocess.run(["systemctl", "stop", files.unit + ".service"], stdout=subprocess.DEVNULL,
                           stderr=subprocess.DEVNULL, timeout=STOP_GRACE_SECONDS + 30)
        if ended is None:  # the supervisor itself is gone: record the end on its behalf
            recorded = read_json(files.status_path) or dict(status)
            recorded.update(state="cancelled", endedAt=utc_now(), error=how)
            write_json_atomic(files.status_path, recorded)
    result = job_status(settings, job_id)
    result["cancel"] = how
    return result


# --- CLI -----------------------------------------------------------------------------------------------


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m node_bootstrap.jobs",
        description="Start, inspect and cancel a training job on this node (run by the stack's SSM "
        "document).",
        epilog="Exit codes: 0 ok, 1 the job failed to start or the operation failed, 2 invalid arguments or "
        "node config, 3 no such job on this node. Every command prints one JSON object on stdout.",
    )
    parser.add_argument("--root", default="/", help="prefix for every absolute path (tests; default /)")
    parser.add_argument("--node-config", default=DEFAULT_NODE_CONFIG,
                        help="node config JSON (default %(default)s)")
    sub = parser.add_subparsers(dest="command", required=True)

    start = sub.add_parser("start", help="launch torchrun detached and return once it runs")
    start.add_argument("--job-id", required=True)
    start.add_argument("--config", required=True,
                       help="training TOML, relative to the bundle dir or absolute")
    start.add_argument("--nodes", type=int, required=True, help="torchrun --nnodes")
    start.add_argument("--gpus-per-node", type=int, required=True, help="torchrun --nproc-per-node")
    start.add_argument("--rendezvous-host", required=True,
                       help="private IP of the node hosting the c10d store")
    start.add_argument("--max-restarts", type=int, default=3, help="torchrun --max-restarts (default 3)")
    start.add_argument("--overrides", default="", help='space-separated training overrides: "k=v k2=v2"')
    start.add_argument(
        "--launcher", choices=("auto", "systemd", "direct"), default="auto",
        help="systemd: systemd-run unit training-job-<id>; direct: double fork + setsid, for hosts where "
        "systemd is not PID 1 (containers, tests); auto (default): systemd when it runs, else direct",
    )

    status = sub.add_parser("status", help="print the job's state, exit code and last step and loss")
    status.add_argument("--job-id", required=True)

    cancel = sub.add_parser("cancel", help="SIGTERM (the trainer checkpoints), wait, then kill")
    cancel.add_argument("--job-id", required=True)
    cancel.add_argument("--timeout-seconds", type=float, default=float(STOP_GRACE_SECONDS),
                        help="how long to wait after SIGTERM before SIGKILL (default %(default).0f)")

    supervise = sub.add_parser("supervise", help="internal: the process `start` launches")
    supervise.add_argument("--job-id", required=True)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(args.root, args.node_config)
        if args.command == "supervise":
            return Supervisor(settings, args.job_id).run()
        if args.command == "start":
            spec = JobSpec(job_id=args.job_id, config=args.config, nodes=args.nodes,
                           gpus_per_node=args.gpus_per_node, rendezvous_host=args.rendezvous_host,
                           max_restarts=args.max_restarts, overrides=tuple(args.overrides.split()))
            result = start_job(settings, spec, args.node_config, args.launcher)
        elif args.command == "status":
            result = job_status(settings, args.job_id)
        else:
            result = cancel_job(settings, args.job_id, args.timeout_seconds)
    except JobError as e:
        print(json.dumps({"jobId": getattr(args, "job_id", None), "error": str(e)}, sort_keys=True))
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(json.dumps(result, sort_keys=True))
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
