"""`supervise`: the process behind a job's systemd unit (or the direct launcher's daemon). It sources the
training env file, runs torchrun, tees its output to the job log, records status.json, and forwards SIGTERM
to torchrun so the trainer checkpoints before it exits."""

import os
import signal
import socket
import subprocess
import sys
from typing import BinaryIO, Optional

from node_bootstrap.jobs.errors import EXIT_FAILED, EXIT_NOT_FOUND, JobError
from node_bootstrap.jobs.settings import JobSettings
from node_bootstrap.jobs.spec import JobFiles, read_json, utc_now, write_json_atomic


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


def job_identity(user: object) -> dict[str, object]:
    """Popen's user, group and extra_groups for the job user recorded in job.json (plus its name and home
    for the environment); empty when the supervisor already runs as that user (a test's fake root maps the
    job user to whoever runs the tests)."""
    if not isinstance(user, dict):
        raise JobError("job.json names no user to run the job as; jobs never run as root")
    uid, gid = int(user["uid"]), int(user["gid"])
    if (uid, gid) == (os.geteuid(), os.getegid()):
        return {}
    return {"user": uid, "group": gid, "extra_groups": [int(g) for g in user.get("groups", [])],
            "name": str(user["name"]), "home": str(user["home"])}


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
        try:
            identity = job_identity(self.spec.get("user"))
        except JobError as e:
            return self._finish("failed", None, error=str(e))
        if identity:
            name, home = str(identity.pop("name")), str(identity.pop("home"))
            env.update(HOME=home, USER=name, LOGNAME=name)
        command = build_job_command(str(self.spec["envFile"]), argv)
        with open(str(self.spec["logPath"]), "ab") as log:
            log.write(("[node_bootstrap.jobs] {} start on {}: {}\n".format(
                utc_now(), self.status["hostname"], " ".join(argv))).encode())
            log.flush()
            try:
                # the job runs as the job user: setgroups, setgid, setuid in the child before exec
                self.child = subprocess.Popen(command, cwd=cwd, env=env, stdin=subprocess.DEVNULL,
                                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                                              start_new_session=True, **identity)
            except OSError as e:
                who = f" as {env.get('USER')}" if identity else ""
                message = f"cannot run {command[0]}{who}: {e.strerror}"
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
