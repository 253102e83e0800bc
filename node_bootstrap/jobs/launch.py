"""`start`: write the job's spec file, then launch its supervisor detached and wait until it runs. Only on a
node whose metadata block holds (metadata_gate.py), and only the attempt the job table holds as the job's
current one, of an active job, starts (job_table.py); one start at a time per node (start_lock); on a node that
already ran the job, only a later attempt of a job that ended there starts (attempts.py).

Launchers: `systemd` (systemd-run; the default wherever systemd is PID 1) and `direct` (double fork and
setsid; for containers and tests, where systemd is not running). Both run the same supervisor.

The job itself runs as the unprivileged job user (node_bootstrap/accounts.py), never as root: `start` gives
that user the job's own directories and log file (job_paths.py), and the supervisor (root, so that what root later
reads and acts on, status.json and job.json, stays root's) starts torchrun as that user.
"""

import contextlib
import fcntl
import os
import shutil
import subprocess
import sys
import time
from collections.abc import Iterator
from typing import Optional

from node_bootstrap.accounts import JOB_USER, Account, AccountError, read_account
from node_bootstrap.jobs.attempts import keep_previous_attempt
from node_bootstrap.jobs.errors import JobError
from node_bootstrap.jobs.job_paths import prepare_job_paths
from node_bootstrap.jobs.job_table import check_start_allowed
from node_bootstrap.jobs.logs import maybe_ship_job_log
from node_bootstrap.jobs.metadata_gate import check_metadata_block
from node_bootstrap.jobs.settings import JobSettings, under_root
from node_bootstrap.jobs.spec import (
    STOP_GRACE_SECONDS,
    UNIT_PREFIX,
    JobFiles,
    JobSpec,
    build_torchrun_argv,
    read_json,
    utc_now,
    write_json_atomic,
)

START_WAIT_SECONDS = 30.0  # how long `start` waits for the supervisor to record the running state
# how long a `start` waits for another one on the node to finish (that one waits at most START_WAIT_SECONDS)
START_LOCK_WAIT_SECONDS = START_WAIT_SECONDS + 30.0


def systemd_available(root: str) -> bool:
    """sd_booted(3): systemd is PID 1 when /run/systemd/system exists."""
    return os.path.isdir(under_root(root, "/run/systemd/system")) and shutil.which("systemd-run") is not None


def supervisor_argv(settings: JobSettings, node_config: str, job_id: str) -> list[str]:
    return [sys.executable, "-m", "node_bootstrap.jobs", "--root", settings.root,
            "--node-config", node_config, "supervise", "--job-id", job_id]


def package_parent() -> str:
    """The directory that holds node_bootstrap/, so the supervisor imports this same code (this file is
    node_bootstrap/jobs/launch.py: three levels up)."""
    return os.path.dirname(os.path.dirname(os.path.dirname(os.path.abspath(__file__))))


def launch_systemd(files: JobFiles, argv: list[str], stop_grace_seconds: int = STOP_GRACE_SECONDS) -> None:
    # KillMode=mixed: `systemctl stop` and shutdown (capacity-block end, node drain) send SIGTERM to the
    # supervisor only, which forwards it to torchrun; SIGKILL reaches the rest after TimeoutStopSec, the same
    # grace torchrun's --shutdown-timeout is cut from (build_torchrun_argv).
    command = [
        "systemd-run", "--unit=" + files.unit, "--collect", "--no-block",
        "--description=training job " + files.unit[len(UNIT_PREFIX):],
        "--property=KillMode=mixed", f"--property=TimeoutStopSec={stop_grace_seconds}",
        # The job user may pin all the memory EFA registers: ib_uverbs charges pinned pages to an unprivileged
        # process's RLIMIT_MEMLOCK (kernel Documentation/infiniband/user_verbs.rst), and systemd's default is
        # 8 MiB. NoNewPrivileges: nothing the job runs can gain privileges (setuid binaries such as sudo).
        # PrivateTmp: the unit gets /tmp and /var/tmp of its own, so nothing a job leaves there reaches the next
        # job (its HOME and TMPDIR are already its own /scratch/jobs/<id>; /dev/shm, which NCCL uses, is not
        # affected).
        "--property=LimitMEMLOCK=infinity", "--property=NoNewPrivileges=yes", "--property=PrivateTmp=yes",
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


def job_account(settings: JobSettings) -> Account:
    """The user jobs run as; a node without it (the jobuser boot step did not run) runs no job."""
    try:
        account = read_account(settings.root, JOB_USER)
    except AccountError as e:
        raise JobError(str(e)) from None
    if account is None:
        raise JobError(f"no user {JOB_USER} on this node, and jobs never run as root: create it with `sudo "
                       "PYTHONPATH=/opt/cluster/bundle python3 -m node_bootstrap run --only jobuser`")
    return account


@contextlib.contextmanager
def start_lock(jobs_dir: str, wait_seconds: float = START_LOCK_WAIT_SECONDS) -> Iterator[None]:
    """One `start` at a time on a node, so that two deliveries of the same start (or two starts of one job)
    cannot both find the job absent or ended and launch two supervisors. flock(2) on the jobs directory
    itself: no lock file among the job directories, and a lock that dies with the process holding it."""
    os.makedirs(jobs_dir, exist_ok=True)
    fd = os.open(jobs_dir, os.O_RDONLY)  # not inherited across exec: the supervisor does not hold it
    try:
        deadline = time.monotonic() + wait_seconds
        while True:
            try:
                fcntl.flock(fd, fcntl.LOCK_EX | fcntl.LOCK_NB)
                break
            except BlockingIOError:
                if time.monotonic() >= deadline:
                    raise JobError(f"another start on this node still holds {jobs_dir} after {wait_seconds:.0f} s; "
                                   "try again when it has returned") from None
                time.sleep(0.1)
        yield
    finally:
        with contextlib.suppress(OSError):
            fcntl.flock(fd, fcntl.LOCK_UN)  # also for a copy a forked launcher child may still hold
        os.close(fd)


def start_job(settings: JobSettings, spec: JobSpec, node_config: str, launcher: str = "auto",
              wait_seconds: float = START_WAIT_SECONDS) -> dict[str, object]:
    spec.validate()
    # Before any path is touched: the job user is kept from the instance metadata service (metadata_gate.py),
    # and only the job and attempt the job table holds as current start (job_table.py).
    check_metadata_block(settings, spec.job_id)
    check_start_allowed(settings, spec.job_id, spec.attempt)
    with start_lock(settings.jobs_dir):
        return _start_locked(settings, spec, node_config, launcher, wait_seconds)


def _start_locked(settings: JobSettings, spec: JobSpec, node_config: str, launcher: str,
                  wait_seconds: float) -> dict[str, object]:
    files = JobFiles.of(settings, spec.job_id)
    previous_status = keep_previous_attempt(settings, spec, files)
    if launcher == "auto":
        launcher = "systemd" if systemd_available(settings.root) else "direct"
    account = job_account(settings)
    home = prepare_job_paths(settings, spec, files, account)

    os.makedirs(files.job_dir, exist_ok=previous_status is not None)
    write_json_atomic(files.spec_path, {
        "jobId": spec.job_id,
        "attempt": spec.attempt,
        "module": spec.module,
        "argv": build_torchrun_argv(settings, spec),
        "cwd": settings.bundle_dir,
        "envFile": settings.env_file,
        "logPath": files.log_path,
        "unit": files.unit,
        "launcher": launcher,
        "stopGraceSeconds": spec.stop_grace_seconds,
        # home: the HOME (and TMPDIR) the job gets, its own scratch; the account's own home is root's
        "user": {"name": account.name, "uid": account.uid, "gid": account.gid, "groups": list(account.groups),
                 "home": home or account.home},
        "createdAt": utc_now(),
    })
    cloudwatch = maybe_ship_job_log(settings, spec.job_id, files.log_path, files.metrics_path)
    argv = supervisor_argv(settings, node_config, spec.job_id)
    try:
        if launcher == "systemd":
            launch_systemd(files, argv, spec.stop_grace_seconds)
        else:
            launch_direct(files, argv)
    except (JobError, OSError, subprocess.TimeoutExpired) as e:
        write_json_atomic(files.status_path, {"jobId": spec.job_id, "attempt": spec.attempt, "state": "failed",
                                              "exitCode": None, "startedAt": utc_now(), "endedAt": utc_now(),
                                              "pid": None, "launcher": launcher, "error": f"launch failed: {e}"})
        raise JobError(f"job {spec.job_id}: launch failed: {e}") from None

    def recorded() -> Optional[dict[str, object]]:
        """This attempt's status; None while status.json is absent or still the previous attempt's."""
        status = read_json(files.status_path)
        return status if status is not None and status.get("attempt", 1) == spec.attempt else None

    deadline = time.monotonic() + wait_seconds
    status = recorded()
    # Wait until the child runs (pid recorded) or the job has already ended.
    while (status is None or status.get("state") == "running" and status.get("pid") is None) and (
            time.monotonic() < deadline):
        time.sleep(0.1)
        status = recorded()
    if status is None:
        raise JobError("the supervisor did not record the job within {:.0f} s; see {}".format(
            wait_seconds, "journalctl -u " + files.unit if launcher == "systemd" else files.supervisor_log))
    result = dict(status)
    result["cloudwatch"] = cloudwatch
    result["logPath"] = files.log_path
    result["previousStatusPath"] = previous_status  # where the previous attempt's status was kept; None: none
    if status.get("state") == "failed":
        raise JobError("job {} failed to start: {}".format(spec.job_id, status.get("error") or result))
    return result
