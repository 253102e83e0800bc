"""`status` and `cancel`: read a job's recorded state (and, from the current attempt's part of its log, the
last step, the last held-out loss, the checkpoint step the trainer resumed from, or a commcheck's all_reduce bus
bandwidth, and the network NCCL chose: each value through job_report's schema), and stop it."""

import os
import re
import shutil
import signal
import subprocess
import time
from typing import NamedTuple, Optional

from node_bootstrap.job_contract import COMPILE_CACHE_STATES
from node_bootstrap.jobs.attempt_log import attempt_part
from node_bootstrap.jobs.errors import EXIT_NOT_FOUND, EXIT_USAGE, JobError
from node_bootstrap.jobs.job_report import (  # noqa: F401 - the finders are re-exported (node_bootstrap.jobs)
    NCCL_NETWORK_RE,
    OFI_PROVIDER_RE,
    RESUME_TIERS,
    Rejections,
    checked_int,
    checked_name,
    checked_network,
    checked_phase_seconds,
    checked_provider,
    checked_recorded_phases,
    find_busbw,
    find_last_event,
    find_last_step,
    find_last_validation,
    find_resumed_from_step,
    find_resumed_from_tier,
    resume_report,
    step_report,
)
from node_bootstrap.jobs.processes import descendants, sigkill
from node_bootstrap.jobs.settings import JobSettings
from node_bootstrap.jobs.spec import (
    CANCEL_ABORT,
    CANCEL_MODES,
    CANCEL_SAVE,
    COMMCHECK_MODULE,
    STOP_GRACE_SECONDS,
    TRAINING_MODULE,
    JobFiles,
    read_json,
    utc_now,
    validate_cancel_timeout,
    validate_job_id,
    write_json_atomic,
)

LOG_TAIL_BYTES = 512 * 1024  # how much of the job log's end `status` scans (last step, NCCL's network)
LOG_HEAD_BYTES = 4 * 1024 * 1024  # and of its start: NCCL logs its network when the first communicator is made
# aws-ofi-nccl's plugin is "Libfabric"; releases <= 1.11.0 named it "AWS Libfabric", and it answers to "OFI"
# when NCCL_NET=OFI (src/nccl_ofi_interface_nvidia.cpp).
NCCL_NETWORK_ALIASES = {"AWS Libfabric": "Libfabric", "OFI": "Libfabric"}


class LogEnds(NamedTuple):
    """The start and the end of a job log as text; `head` is empty when the whole log fits in `tail`."""

    head: str
    tail: str


class NcclNetwork(NamedTuple):
    network: Optional[str]  # NCCL's network: "Libfabric" (EFA through aws-ofi-nccl), "Socket" (TCP), "IB"
    provider: Optional[str]  # aws-ofi-nccl's libfabric provider ("efa"), only when network is Libfabric


def read_log_ends(log_path: str, head_bytes: int = LOG_HEAD_BYTES,
                  tail_bytes: int = LOG_TAIL_BYTES, start: int = 0) -> Optional[LogEnds]:
    """At most head_bytes + tail_bytes of the log from byte `start` on (where this attempt's part begins),
    whatever its size; None when it cannot be read."""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            start = min(max(start, 0), f.tell())
            size = f.tell() - start
            f.seek(start)
            if size <= head_bytes + tail_bytes:
                return LogEnds("", f.read(size).decode("utf-8", "replace"))
            head = f.read(head_bytes)
            f.seek(start + size - tail_bytes)
            tail = f.read(tail_bytes)
    except OSError:
        return None
    return LogEnds(head.decode("utf-8", "replace"), tail.decode("utf-8", "replace"))


def last_step(log_path: str) -> Optional[dict[str, object]]:
    """The last trainer progress line in the log's tail, as printed (job_report checks its values)."""
    ends = read_log_ends(log_path, head_bytes=0)
    return find_last_step(ends.tail) if ends else None


def _newest(pattern: "re.Pattern[str]", ends: LogEnds) -> Optional[str]:
    for text in (ends.tail, ends.head):  # the tail is newer: after a torchrun restart NCCL logs again
        matches = pattern.findall(text)
        if matches:
            return str(matches[-1])
    return None


def find_nccl_network(ends: LogEnds, rejected: Optional[Rejections] = None) -> NcclNetwork:
    """The network NCCL chose on this node, from the newest "Using network" line in the log's tail, else in
    its head; NcclNetwork(None, None) before NCCL has made a communicator (or with NCCL_DEBUG below INFO).
    A restart in the middle of a log larger than head + tail is not seen until it reaches the tail. A name
    outside job_report's schema (an escape sequence, a long string) is dropped and counted in `rejected`."""
    rejected = rejected if rejected is not None else Rejections()
    name = checked_network(_newest(NCCL_NETWORK_RE, ends), rejected)
    if name is None:
        return NcclNetwork(None, None)
    network = NCCL_NETWORK_ALIASES.get(name, name)
    provider = checked_provider(_newest(OFI_PROVIDER_RE, ends), rejected) if network == "Libfabric" else None
    return NcclNetwork(network, provider)


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


def attempt_ends(status: dict[str, object], log_path: str) -> Optional[LogEnds]:
    """The part of the job log the status's attempt wrote. The supervisor records where it began
    (logOffsetBytes, in root's status.json), so nothing in the job's output can move that boundary; a status
    recorded before the offset existed falls back to the attempt markers (attempt_log.py)."""
    offset, attempt = status.get("logOffsetBytes"), status.get("attempt", 1)
    if isinstance(offset, int) and not isinstance(offset, bool):
        return read_log_ends(log_path, start=offset)
    ends = read_log_ends(log_path)
    if ends is not None and isinstance(attempt, int):
        ends = LogEnds(*attempt_part(ends.head, ends.tail, attempt))
    return ends


def job_status(settings: JobSettings, job_id: str) -> dict[str, object]:
    """The supervisor's record of the job, with what the current attempt's part of the job log says, every
    value of that through job_report's schema: a value that fails it is None, counted in rejectedValues."""
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
    # statuses recorded before attempts existed are their job's first
    result["attempt"] = status.get("attempt", 1)
    rejected = Rejections()
    rejected.merge(status.get("rejectedValues"))  # what the supervisor dropped as it watched the output
    ends = attempt_ends(status, files.log_path)
    tail = ends.tail if ends else ""
    step = step_report(find_last_step(tail), rejected)
    # the log's tail while the resume line is in it; after that what the supervisor recorded when it saw it
    resume_event = find_last_event(tail, ("resume",))
    resume = resume_report(resume_event, rejected) if resume_event else None
    if resume is not None and resume.step is not None:
        result["resumedFromStep"], result["resumedFromTier"] = resume.step, resume.tier
    else:  # the supervisor's record, which it checked when it saw the line (legacy records: checked again)
        result["resumedFromStep"] = checked_int(status.get("resumedFromStep"), "resumedFromStep", rejected)
        result["resumedFromTier"] = checked_name(status.get("resumedFromTier"), "resumedFromTier", rejected,
                                                 RESUME_TIERS)
    result["compileCache"] = checked_name(status.get("compileCache"), "compileCache", rejected,
                                          COMPILE_CACHE_STATES)
    if "phases" in status:
        result["phases"] = checked_recorded_phases(status.get("phases"), rejected)
    if "phaseSeconds" in status:  # the supervisor's seconds per phase after the first step (progress.py)
        result["phaseSeconds"] = checked_phase_seconds(status.get("phaseSeconds"), rejected)
    # when the job last printed (the log's last write, to the millisecond): a job that went silent went so then;
    # the job's goodput counts its silence before a fault was seen as failure detection (cluster_jobs/goodput.py)
    result["lastOutputAt"] = last_output_at(files.log_path)
    result["lastStep"], result["lastLoss"] = step
    # the newest held-out loss while its step line is in the log's tail (LOG_TAIL_BYTES); None without one
    validation = step_report(find_last_validation(tail), rejected, "lastValStep", "val_loss", "lastValLoss")
    result["lastValStep"], result["lastValLoss"] = validation
    spec = read_json(files.spec_path) or {}
    result["module"] = spec.get("module", TRAINING_MODULE)  # jobs started before the module existed: training
    if result["module"] == COMMCHECK_MODULE:
        # Only rank 0 prints: on the other nodes of the job both stay None.
        busbw = find_busbw(tail, rejected) or {}
        result["busbwGbps"] = busbw.get("busbwGbps")
        result["busbwSizeBytes"] = busbw.get("busbwSizeBytes")
    nccl = find_nccl_network(ends, rejected) if ends else NcclNetwork(None, None)
    result["ncclNetwork"] = nccl.network  # None: no "Using network" line yet
    result["ncclProvider"] = nccl.provider
    result["rejectedValues"] = rejected.as_dict()  # {}: every value read from the job passed the schema
    result["logPath"] = files.log_path
    return result


def last_output_at(log_path: str) -> Optional[str]:
    """The job log's last modification, UTC to the millisecond (the trainer's phase time form); None without one."""
    try:
        ns = os.stat(log_path).st_mtime_ns
    except OSError:
        return None
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(ns // 10**9)) + f".{ns // 10**6 % 1000:03d}Z"


def wait_for_end(status_path: str, job_id: str, timeout_seconds: float) -> Optional[dict[str, object]]:
    deadline = time.monotonic() + timeout_seconds
    while True:
        status = read_json(status_path) or {}
        if status.get("state") != "running":
            return status
        if not process_alive(status.get("supervisorPid"), job_id) or time.monotonic() >= deadline:
            return None
        time.sleep(0.2)


# What an abort's stop request says (the supervisor records it in the status).
ABORT_REQUEST_BY = "cancel --mode abort"
ABORT_REQUEST_REASON = ("the job's attempt ended (a node lost, unhealthy or hung): the job restarts from its newest "
                        "checkpoint, so no checkpoint is saved")


def cancel_job(settings: JobSettings, job_id: str, timeout_seconds: float = STOP_GRACE_SECONDS,
               mode: str = CANCEL_SAVE) -> dict[str, object]:
    """mode save: SIGTERM to the supervisor, which forwards it to torchrun so the trainer checkpoints. mode
    abort: a stop request with mode "abort" first, so the supervisor SIGKILLs torchrun and its workers at once.
    Either way, after `timeout_seconds`, SIGKILL to everything the job started, then stop the unit."""
    validate_cancel_timeout(timeout_seconds)
    if mode not in CANCEL_MODES:
        raise JobError(f"mode={mode!r}: allowed: {', '.join(CANCEL_MODES)}", EXIT_USAGE)
    status = job_status(settings, job_id)
    if status.get("state") != "running":
        status["cancel"] = "already {}".format(status.get("state"))
        return status
    files = JobFiles.of(settings, job_id)
    supervisor_pid = int(status["supervisorPid"])  # type: ignore[call-overload]
    if mode == CANCEL_ABORT:
        write_json_atomic(files.stop_request_path, {"by": ABORT_REQUEST_BY, "reason": ABORT_REQUEST_REASON,
                                                    "at": utc_now(), "mode": CANCEL_ABORT})
    if status.get("launcher") == "systemd" and shutil.which("systemctl"):
        subprocess.run(["systemctl", "kill", "--kill-whom=main", "--signal=SIGTERM", files.unit + ".service"],
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=60)
    else:
        try:
            os.kill(supervisor_pid, signal.SIGTERM)
        except ProcessLookupError:
            pass
    ended = wait_for_end(files.status_path, job_id, timeout_seconds)
    how = "aborted: SIGKILL at once" if mode == CANCEL_ABORT else "stopped by SIGTERM"
    if ended is None:
        how = f"SIGKILL after {timeout_seconds:.0f} s"
        if process_alive(supervisor_pid, job_id):
            sigkill(descendants(supervisor_pid))
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
