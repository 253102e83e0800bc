"""`status` and `cancel`: read a job's recorded state (and the last step from its log), and stop it."""

import json
import os
import shutil
import signal
import subprocess
import time
from typing import Optional

from node_bootstrap.jobs.errors import EXIT_NOT_FOUND, JobError
from node_bootstrap.jobs.settings import JobSettings
from node_bootstrap.jobs.spec import (
    STOP_GRACE_SECONDS,
    JobFiles,
    read_json,
    utc_now,
    validate_job_id,
    write_json_atomic,
)

LOG_TAIL_BYTES = 512 * 1024  # how much of the job log `status` scans for the last step line


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
