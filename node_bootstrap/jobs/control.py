"""`status` and `cancel`: read a job's recorded state (and, from the current attempt's part of its log, the
last step, the last held-out loss, the checkpoint step the trainer resumed from, or a commcheck's all_reduce bus
bandwidth, and the network NCCL chose), and stop it."""

import json
import os
import re
import shutil
import signal
import subprocess
import time
from typing import NamedTuple, Optional

from node_bootstrap.jobs.attempt_log import attempt_part
from node_bootstrap.jobs.errors import EXIT_NOT_FOUND, EXIT_USAGE, JobError
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

# NCCL prints, at NCCL_DEBUG=INFO with the INIT subsystem, one line per communicator naming the network it
# chose: INFO(NCCL_INIT, "Using network %s", comm->ncclNet->name) in NVIDIA/nccl src/init.cc. src/debug.cc
# prefixes it with "<hostname>:<pid>:<tid> [<cudaDev>] NCCL INFO " (and a timestamp, or torchrun a "[rank0]:",
# where configured), so the pattern is not anchored at the line start. It must end in a newline: a line still
# being written is not read as a shorter name.
_NCCL_NETWORK_RE = re.compile(r"NCCL INFO Using network ([^\r\n]+?)[ \t]*\r?\n")
# aws-ofi-nccl, when its plugin initialises: NCCL_OFI_INFO(NCCL_INIT | NCCL_NET, "Selected provider is %s,
# fabric is %s (found %d nics)") (src/nccl_ofi_net.cpp; "Selected Provider is %s (found %d nics)" in older
# releases), prefixed with "NET/OFI " by its logging macro (include/nccl_ofi_log.h).
_OFI_PROVIDER_RE = re.compile(r"NCCL INFO NET/OFI Selected [Pp]rovider is ([^\s,]+)")
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
                  tail_bytes: int = LOG_TAIL_BYTES) -> Optional[LogEnds]:
    """At most head_bytes + tail_bytes of the log, whatever its size; None when it cannot be read."""
    try:
        with open(log_path, "rb") as f:
            f.seek(0, os.SEEK_END)
            size = f.tell()
            if size <= head_bytes + tail_bytes:
                f.seek(0)
                return LogEnds("", f.read().decode("utf-8", "replace"))
            f.seek(0)
            head = f.read(head_bytes)
            f.seek(size - tail_bytes)
            tail = f.read()
    except OSError:
        return None
    return LogEnds(head.decode("utf-8", "replace"), tail.decode("utf-8", "replace"))


def find_last_event(text: str, events: tuple[str, ...]) -> Optional[dict[str, object]]:
    """The last JSON line in `text` whose "event" is one of `events`. torchrun may prefix lines (e.g.
    "[rank0]:"), so the JSON starts at the first "{"."""
    for line in reversed(text.splitlines()):
        start = line.find("{")
        if start < 0 or not any(f'"{name}"' in line for name in events):
            continue
        try:
            event = json.loads(line[start:])
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") in events:
            return event
    return None


def find_last_step(text: str) -> Optional[dict[str, object]]:
    """The last trainer progress line, {"event": "step", "step": ..., "loss": ...}, in `text`."""
    return find_last_event(text, ("step",))


def find_last_validation(text: str) -> Optional[dict[str, object]]:
    """The last step line that carries a held-out loss ("val_loss": the trainer's [validation] evaluated it
    after that step) in `text`; None without one. Later step lines carry none, so the last step line alone
    would not do."""
    for line in reversed(text.splitlines()):
        start = line.find("{")
        if start < 0 or '"val_loss"' not in line:
            continue
        try:
            event = json.loads(line[start:])
        except ValueError:
            continue
        if isinstance(event, dict) and event.get("event") == "step":
            return event
    return None


def find_resumed_from_step(text: str) -> Optional[object]:
    """The checkpoint step of the trainer's last resume line, {"event": "resume", "step": N, "path": ...,
    "tier": ...} (training/metrics.py; step 0, path null and no tier when it started fresh), in `text`; None
    before it printed one."""
    event = find_last_event(text, ("resume",))
    return event.get("step") if event else None


def find_resumed_from_tier(text: str) -> Optional[object]:
    """The checkpoint tier of that line: "local" or "durable"; None for a fresh start or before the line."""
    event = find_last_event(text, ("resume",))
    return event.get("tier") if event else None


def find_busbw(text: str) -> Optional[dict[str, object]]:
    """A commcheck's bus bandwidth from its JSON lines (training/commcheck.py): the summary's busbw at the
    largest size once it is printed, before that the newest size's; None before the first size ends."""
    event = find_last_event(text, ("allreduce_summary", "allreduce"))
    if event is None:
        return None
    size_key = "largest_size_bytes" if event["event"] == "allreduce_summary" else "size_bytes"
    return {"busbwGbps": event.get("busbw_gbps"), "busbwSizeBytes": event.get(size_key)}


def last_step(log_path: str) -> Optional[dict[str, object]]:
    """The last trainer progress line in the log's tail."""
    ends = read_log_ends(log_path, head_bytes=0)
    return find_last_step(ends.tail) if ends else None


def _newest(pattern: "re.Pattern[str]", ends: LogEnds) -> Optional[str]:
    for text in (ends.tail, ends.head):  # the tail is newer: after a torchrun restart NCCL logs again
        matches = pattern.findall(text)
        if matches:
            return str(matches[-1])
    return None


def find_nccl_network(ends: LogEnds) -> NcclNetwork:
    """The network NCCL chose on this node, from the newest "Using network" line in the log's tail, else in
    its head; NcclNetwork(None, None) before NCCL has made a communicator (or with NCCL_DEBUG below INFO).
    A restart in the middle of a log larger than head + tail is not seen until it reaches the tail."""
    name = _newest(_NCCL_NETWORK_RE, ends)
    if name is None:
        return NcclNetwork(None, None)
    network = NCCL_NETWORK_ALIASES.get(name, name)
    provider = _newest(_OFI_PROVIDER_RE, ends) if network == "Libfabric" else None
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
    # statuses recorded before attempts existed are their job's first
    attempt = status.get("attempt", 1)
    result["attempt"] = attempt
    ends = read_log_ends(files.log_path)
    if ends is not None and isinstance(attempt, int):
        ends = LogEnds(*attempt_part(ends.head, ends.tail, attempt))
    step = find_last_step(ends.tail) if ends else None
    # the log's tail while the resume line is in it; after that what the supervisor recorded when it saw it
    resumed = find_resumed_from_step(ends.tail) if ends else None
    result["resumedFromStep"] = resumed if resumed is not None else status.get("resumedFromStep")
    result["resumedFromTier"] = (find_resumed_from_tier(ends.tail) if resumed is not None and ends
                                 else status.get("resumedFromTier"))
    result["compileCache"] = status.get("compileCache")  # recorded by the supervisor from the resume line
    result["lastStep"] = step.get("step") if step else None
    result["lastLoss"] = step.get("loss") if step else None
    # the newest held-out loss while its step line is in the log's tail (LOG_TAIL_BYTES); None without one
    validation = find_last_validation(ends.tail) if ends else None
    result["lastValStep"] = validation.get("step") if validation else None
    result["lastValLoss"] = validation.get("val_loss") if validation else None
    spec = read_json(files.spec_path) or {}
    result["module"] = spec.get("module", TRAINING_MODULE)  # jobs started before the module existed: training
    if result["module"] == COMMCHECK_MODULE:
        # Only rank 0 prints: on the other nodes of the job both stay None.
        busbw = (find_busbw(ends.tail) if ends else None) or {}
        result["busbwGbps"] = busbw.get("busbwGbps")
        result["busbwSizeBytes"] = busbw.get("busbwSizeBytes")
    nccl = find_nccl_network(ends) if ends else NcclNetwork(None, None)
    result["ncclNetwork"] = nccl.network  # None: no "Using network" line yet
    result["ncclProvider"] = nccl.provider
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
