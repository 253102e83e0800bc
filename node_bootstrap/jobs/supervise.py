"""`supervise`: the process behind a job's systemd unit (or the direct launcher's daemon). It sources the
training env file, runs torchrun, tees its output to the job log, records status.json, and forwards SIGTERM
to torchrun so the trainer checkpoints before it exits.

A training job is also watched for progress (progress.py): when its trainer logs no step for the hang
timeout (learned from its step cadence, at most jobHangTimeoutSeconds; the start timeout before the first
step), the supervisor looks at where the hang is (hang_origin.py: a rank of this node stopped or stuck, or
every rank waiting on a peer), logs it with the last step seen, stops the job (a hang here: SIGKILL at once, as
an abort; else SIGTERM to torchrun and SIGKILL to everything the job started after a short bound) and records
the state `hung` with that verdict; a hang here also asks the node's health monitor for a check. A job stopped
by the node health monitor (a stop-request.json next to its status) is recorded `failed` with the monitor's
reason.

A stop request whose mode is "abort" (`cancel --mode abort`: the job keeper stopping an ended attempt's
survivors, whose job restarts from a checkpoint tier) turns the SIGTERM that follows it into SIGKILL for torchrun
and every process below it, so a rank blocked inside a collective is gone at once instead of after torchrun's
shutdown timeout; the job is recorded `cancelled` with stopMode "abort"."""

import os
import signal
import socket
import subprocess
import sys
import threading
import time
from typing import BinaryIO, Callable, Optional

from node_bootstrap.job_contract import HANG_HERE, TRAINER_STOPPED_LINE
from node_bootstrap.jobs.attempt_log import attempt_marker
from node_bootstrap.jobs.errors import EXIT_FAILED, EXIT_NOT_FOUND, JobError
from node_bootstrap.jobs.hang_origin import (
    HEALTH_CHECK_REQUEST_PATH,
    PEER_WAIT_S,
    hang_origin,
    request_health_check,
    sample_workers,
)
from node_bootstrap.jobs.job_metrics import MetricsFile, defused, looks_like_emf
from node_bootstrap.jobs.job_output import OutputCap, Piece, file_size
from node_bootstrap.jobs.job_report import Rejections, find_last_event, resume_report
from node_bootstrap.jobs.processes import descendants, running, sigkill
from node_bootstrap.jobs.progress import ProgressWatch
from node_bootstrap.jobs.settings import JobSettings, under_root
from node_bootstrap.jobs.spec import (
    ABORT_STOP_SECONDS,
    CANCEL_ABORT,
    STOP_GRACE_SECONDS,
    TRAINING_MODULE,
    JobFiles,
    phase_time,
    read_json,
    utc_now,
    write_json_atomic,
)

_RESUME_HINT = b'"resume"'  # cheap test before a line is parsed as the trainer's resume line
_PHASES_HINT = b'"phases"'  # the resume line and a start's first step line carry the trainer's restart phases
_TRAINER_STOPPED = TRAINER_STOPPED_LINE.encode()


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


def open_log(path: str) -> BinaryIO:
    """The job log for appending, never through a link (its directory and the file are root's)."""
    fd = os.open(path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
    return os.fdopen(fd, "ab")


class Supervisor:
    """Runs one job: the process behind the systemd unit (or the direct launcher's daemon)."""

    def __init__(self, settings: JobSettings, job_id: str) -> None:
        self.files = JobFiles.of(settings, job_id)
        self.health_check_request_path = under_root(settings.root, HEALTH_CHECK_REQUEST_PATH)
        spec = read_json(self.files.spec_path)
        if spec is None:
            raise JobError(f"no job {job_id} on this node ({self.files.spec_path} missing)", EXIT_NOT_FOUND)
        self.spec = spec
        self.child: Optional[subprocess.Popen] = None  # type: ignore[type-arg]
        self.terminate_requested = False
        # the job's own SIGTERM-to-SIGKILL budget (start --stop-grace-seconds), also systemd's TimeoutStopSec
        self.stop_grace_s = float(spec.get("stopGraceSeconds", STOP_GRACE_SECONDS))
        # Progress is the trainer's step lines: a commcheck prints none (its collectives are bounded by the
        # process-group timeout instead), and a hang timeout of 0 turns the watch off.
        watched = spec.get("module", TRAINING_MODULE) == TRAINING_MODULE and settings.hang_timeout_s > 0
        # values from the job's output that failed job_report's schema: dropped, counted in the status
        self.rejected = Rejections()
        self.watch = ProgressWatch(settings.hang_timeout_s, settings.start_timeout_s, floor_s=settings.hang_floor_s,
                                   step_floor_s=settings.step_hang_floor_s, rejected=self.rejected) if watched else None
        # the job's output as kept in its log: lines and the whole log bounded (job_output.py)
        self.cap = OutputCap(settings.job_log_max_bytes, settings.job_line_max_bytes)
        # the trainer's step metrics as the node publishes them, from the job's EMF lines (job_metrics.py)
        self.metrics = MetricsFile(self.files.metrics_path, settings.metrics_namespace, settings.stack_name, job_id,
                                   self.cap.log_max_bytes // 8, self.rejected)
        self._phase_changes = 0  # the watch's phase_changes last recorded in the status ("phaseSeconds")
        self.hung: Optional[str] = None  # why the job was declared hung
        self.hang_verdict = ("", "")  # then: where the hang is (job_contract.HANG_ORIGINS) and the evidence
        self.abort: Optional[dict[str, object]] = None  # the stop request of an abort, once one came
        self.trainer_stopped = False  # the trainer logged its checkpointed stop (a stop request, on any node)
        self._log_lock = threading.Lock()  # the output thread and the watchdog both write the job log
        self.attempt = int(spec.get("attempt", 1))  # type: ignore[call-overload]  # 1: a job.json before attempts
        self.status: dict[str, object] = {
            "jobId": job_id,
            "attempt": self.attempt,
            "resumedFromStep": None,  # the trainer's resume line, once it prints one (_observe)
            "state": "running",
            "exitCode": None,
            "startedAt": utc_now(),
            "endedAt": None,
            "pid": None,
            "supervisorPid": os.getpid(),
            "unit": spec.get("unit"),
            "launcher": spec.get("launcher"),
            "hostname": socket.gethostname(),
            # the restart timeline on this node: when the supervisor began, then the trainer's own phases (_observe)
            "phases": {"started": phase_time()},
        }

    def _on_sigterm(self, signum: int, frame: object) -> None:
        self.terminate_requested = True
        if self.abort is None:
            request = read_json(self.files.stop_request_path)
            if request is not None and request.get("mode") == CANCEL_ABORT:
                self.abort = request
        if self.abort is not None:
            self._kill_all()
        else:
            self._forward(signum)

    def _kill_all(self) -> None:
        """SIGKILL to torchrun and to every process below it: torchrun starts its workers in new sessions, so
        they are collected before torchrun dies (its orphans would no longer be its descendants)."""
        if self.child is None or self.child.poll() is not None:
            return
        started = descendants(self.child.pid)
        self._forward(signal.SIGKILL)
        sigkill(started)

    def _forward(self, signum: int) -> None:
        if self.child is not None and self.child.poll() is None:
            try:
                os.killpg(self.child.pid, signum)  # the child leads its own process group
            except ProcessLookupError:
                pass

    def _record(self) -> None:
        """status.json as the supervisor knows it now, with what it dropped of the job's output and values."""
        self.status["rejectedValues"] = self.rejected.as_dict()
        self.status["output"] = self.cap.counts()
        write_json_atomic(self.files.status_path, self.status)

    def _finish(self, state: str, exit_code: Optional[int], **extra: object) -> int:
        if self.watch is not None:
            self.status["phaseSeconds"] = self.watch.phase_totals()
        self.status.update(state=state, exitCode=exit_code, endedAt=utc_now(), **extra)
        self._record()
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
            # home: the job's own scratch (job_paths.py), so no job finds another's caches, ~/.local or temp
            # files (torch's compile cache defaults to $TMPDIR/torchinductor_<user>)
            name, home = str(identity.pop("name")), str(identity.pop("home"))
            env.update(HOME=home, TMPDIR=home, USER=name, LOGNAME=name)
        command = build_job_command(str(self.spec["envFile"]), argv)
        try:
            log = open_log(str(self.spec["logPath"]))
        except OSError as e:
            return self._finish("failed", None, error=f"cannot open the job log {self.spec['logPath']}: {e.strerror}")
        with log:
            # where this attempt begins in a log the job's attempts share (status reads only what follows)
            log.write(attempt_marker(self.attempt, utc_now(), str(self.status["hostname"]), argv).encode())
            log.flush()
            # Where this attempt's part of the log begins, in root's record: `status` reads the job's lines from
            # here on, so no line the job prints (a forged marker) moves the boundary (control.attempt_ends).
            self.status["logOffsetBytes"] = os.fstat(log.fileno()).st_size
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
                self._on_sigterm(signal.SIGTERM, None)
            self.status["pid"] = self.child.pid
            self._record()
            watchdog = None
            if self.watch is not None:
                watchdog = threading.Thread(target=self._watch_progress, args=(self.child, log),
                                            name="progress-watch", daemon=True)
                watchdog.start()
            self._tee(self.child, log, self._observe)
            returncode = self.child.wait()
            if watchdog is not None:  # a hung job's stop may still be killing what the job started
                watchdog.join(timeout=self.stop_grace_s + 10)
            exit_code, signal_name = exit_code_of(returncode)
            suffix = f" ({signal_name})" if signal_name else ""
            self._log_line(log, f"{utc_now()} exit code {exit_code}{suffix}")
        if self.hung is not None:
            assert self.watch is not None
            return self._finish("hung", exit_code, signal=signal_name, error="hung: " + self.hung,
                                lastStepSeen=self.watch.last_step, lastStepAt=self.watch.last_step_at,
                                quietSince=self.watch.quiet_since, hangOrigin=self.hang_verdict[0],
                                hangEvidence=self.hang_verdict[1])
        if self.abort is not None:
            return self._finish("cancelled", exit_code, signal=signal_name, stopMode=CANCEL_ABORT,
                                stopRequest=self.abort, error="aborted without a checkpoint by the {}: {}".format(
                                    self.abort.get("by"), self.abort.get("reason")))
        request = read_json(self.files.stop_request_path) if self.terminate_requested else None
        if request is not None:
            return self._finish("failed", exit_code, signal=signal_name, stopRequest=request,
                                error="stopped by the {}: {}".format(request.get("by"), request.get("reason")))
        if self.terminate_requested:
            return self._finish("cancelled", exit_code, signal=signal_name)
        if self.trainer_stopped and exit_code != 0:
            # Another node's stop: the trainer saved with it and stopped, then torchrun's own teardown failed (its
            # rendezvous store was on a node that had already left). The job was stopped, not broken.
            return self._finish("cancelled", exit_code, signal=signal_name,
                                error="stopped with a checkpoint at a stop request on another node")
        return self._finish("succeeded" if exit_code == 0 else "failed", exit_code, signal=signal_name)

    def _observe(self, line: bytes) -> None:
        """Each line of the job's output: progress for the hang watch, and the trainer's resume line (and the
        restart phases its resume and first step lines carry), recorded in the status as it comes (the line is
        printed once per start of the trainer, so on a long run it leaves the log tail that `status` reads).
        Every value goes through job_report's schema first: one that fails is dropped and counted."""
        if self.watch is not None:
            self.watch.observe(line)
            if self.watch.phase_changes != self._phase_changes:  # a phase ended: its seconds in the status
                self._phase_changes = self.watch.phase_changes
                self.status["phaseSeconds"] = self.watch.phase_totals()
                self._record()
        if _TRAINER_STOPPED in line:
            self.trainer_stopped = True
        if _RESUME_HINT not in line and _PHASES_HINT not in line:
            return
        event = find_last_event(line.decode("utf-8", "replace"), ("resume", "step"))
        if event is None:
            return
        report = resume_report(event, self.rejected) if event["event"] == "resume" else None
        if report is not None:
            self.status["resumedFromStep"] = report.step
            self.status["resumedFromTier"] = report.tier
            # with torch.compile: "snapshot" (warm from the job's compile cache) or "cold" (training/compile_cache.py)
            self.status["compileCache"] = report.compile_cache
        else:  # a step line: only its phases matter here
            report = resume_report({"phases": event.get("phases")}, self.rejected)
        if report.phases:  # the times the trainer took them: the restart timeline (cluster_jobs)
            recorded = self.status.setdefault("phases", {})
            assert isinstance(recorded, dict)
            recorded.update(report.phases)
        self._record()

    def _log_line(self, log: BinaryIO, text: str) -> None:
        with self._log_lock:
            try:
                log.write(f"[node_bootstrap.jobs] {text}\n".encode())
                log.flush()
            except (OSError, ValueError):  # the log is closed or its file system full: stderr still has it
                print(f"[node_bootstrap.jobs] {text}", file=sys.stderr, flush=True)

    def _watch_progress(self, child: "subprocess.Popen[bytes]", log: BinaryIO) -> None:
        """The watchdog thread: stop the job once the trainer is overdue (nothing to do once it exited)."""
        assert self.watch is not None
        poll_s = self.watch.poll_interval_s()
        while child.poll() is None:
            overdue = self.watch.overdue()
            if overdue is not None:
                self._stop_hung(child, log, overdue)
                return
            time.sleep(poll_s)

    def _stop_hung(self, child: "subprocess.Popen[bytes]", log: BinaryIO, reason: str) -> None:
        """Where the hang is first (hang_origin.py: before a signal changes the workers' states), then the stop.
        A hang here (a rank stopped or stuck): SIGKILL at once, as an abort (a stuck rank never reads SIGTERM), and
        a request for the health monitor's check. Otherwise, after PEER_WAIT_S, SIGTERM to torchrun and SIGKILL to
        whatever the job started after ABORT_STOP_SECONDS (or the stop grace if shorter): the grace is for the
        SIGTERM checkpoint at a step boundary, which a hung rank never reaches (the checkpoint tiers hold the state)."""
        assert self.watch is not None
        self.hung = reason
        origin, evidence = self.hang_verdict = hang_origin(sample_workers(child.pid), self.watch.open_phase())
        where = "on this node" if origin == HANG_HERE else f"not here ({origin})"
        bound_s = min(self.stop_grace_s, float(ABORT_STOP_SECONDS))
        stop = "SIGKILL" if origin == HANG_HERE else (f"SIGTERM in {PEER_WAIT_S:g} s (the node at fault first), "
                                                      f"SIGKILL after {bound_s:g} s")
        message = f"{utc_now()} hung: {reason}; {where}: {evidence}; stopping the job: {stop}"
        if origin == HANG_HERE:
            request_health_check(self.health_check_request_path, under_systemd=self.spec.get("launcher") == "systemd",
                                 jobId=self.status["jobId"], attempt=self.attempt, evidence=evidence, at=utc_now())
        self._log_line(log, message)
        print(f"[node_bootstrap.jobs] {message}", file=sys.stderr, flush=True)
        if origin == HANG_HERE:
            self._kill_all()
            return
        deadline = time.monotonic() + PEER_WAIT_S  # the node at fault stops first (hang_origin.py)
        while child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        # torchrun starts its workers in new sessions: collect them now, while they are still its children.
        started = set(descendants(child.pid))
        self._forward(signal.SIGTERM)
        deadline = time.monotonic() + bound_s
        while child.poll() is None and time.monotonic() < deadline:
            time.sleep(0.1)
        if child.poll() is None:
            started.update(descendants(child.pid))
        alive = [pid for pid in started if running(pid)]
        if child.poll() is None or alive:
            self._log_line(log, f"{utc_now()} still running {bound_s:g} s after SIGTERM: SIGKILL")
            self._forward(signal.SIGKILL)
            sigkill(alive)

    def _tee(self, child: "subprocess.Popen[bytes]", log: BinaryIO,
             observe: Optional[Callable[[bytes], None]] = None) -> None:
        """The job's output into its log (and the supervisor's stdout: the journal), through the cap: a line is
        read at most job_line_max_bytes at a time, so no line of any length is held in memory whole. Every whole
        line is observed, kept or not: a full log must not make a running trainer look hung."""
        out = getattr(sys.stdout, "buffer", None)
        assert child.stdout is not None
        for piece in self.cap.lines(child.stdout):
            first_cut, first_drop = self.cap.cut_lines == 0, self.cap.dropped_lines == 0
            if looks_like_emf(piece.data):  # never EMF in the job log: the supervisor publishes what it may
                if piece.whole:
                    self.metrics.publish(piece.data)
                kept = self.cap.admit(Piece(defused(piece.data), piece.whole), log_size=file_size(log))
            else:
                kept = self.cap.admit(piece, log_size=file_size(log))
            if observe is not None and piece.whole:
                observe(piece.data)
            if (first_cut and self.cap.cut_lines) or (first_drop and self.cap.dropped_lines):
                self._record()  # the status says so while the job runs; the end records the final counts
            if kept is None:
                continue
            with self._log_lock:
                log.write(kept)
                log.flush()
            if out is not None:
                try:
                    out.write(kept)
                    out.flush()
                except (OSError, ValueError):
                    out = None  # the journal or terminal went away; the log file still has it
        if self.cap.dropped_bytes:  # the supervisor's own line: written past the cap, once
            self._log_line(log, f"{utc_now()} job output not kept: {self.cap.describe()}")
        self.metrics.close()

