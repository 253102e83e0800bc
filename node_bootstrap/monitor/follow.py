"""The kernel-log follower: a fatal Xid is answered the moment the driver logs it, not at the next round.

The round (rounds.py, every monitor.intervalSeconds, 60 s by default) reads the kernel log since its cursor,
so a GPU that falls off the bus mid-step would stop the job up to a minute late, while the other nodes' ranks
wait inside a collective. `python3 -m node_bootstrap monitor --follow` runs as its own service next to the
round's timer and reads the kernel log as it is written:
- /dev/kmsg, opened at its end (lseek SEEK_END: only what the kernel logs from now on; what came before is the
  boot gate's and the rounds'): a blocking read returns one record, `PRIORITY,SEQ,TIMESTAMP,FLAGS;MESSAGE`
  (kernel Documentation/ABI/testing/dev-kmsg); EPIPE means records were overwritten before this reader got
  them, and the next read goes on with the oldest one left;
- else `journalctl -k -f -n 0` (journalctl(1): --follow, --lines=0 shows only new entries).
Each line with an Xid is classified by the round's own check (checks.xid_check): a replace- or reset-class
Xid makes the node unhealthy with the round's reason and runs the round's responses (actions.py: stop the
job, tag, log, set-instance-health) under the state lock, so whichever of the two sees it first responds,
once; other Xids are only logged (the round counts them in its warning metric). The round stays for
everything nvidia-smi and fi_info report, and as the safety net: an Xid logged while the follower was down
(between its restarts) is still in the round's next read.
"""

from __future__ import annotations

import errno
import logging
import os
import subprocess
from collections.abc import Iterator

from node_bootstrap.health import FAIL, WARN
from node_bootstrap.host import Host
from node_bootstrap.jobs.spec import utc_now
from node_bootstrap.monitor.actions import RESPONSES, Responder, unhealthy_reason
from node_bootstrap.monitor.checks import xid_check
from node_bootstrap.monitor.kernel_log import KMSG_PATH, parse_kmsg_records
from node_bootstrap.monitor.state import Unhealthy, load_state, save_state, state_lock
from node_bootstrap.runner import Runner
from node_bootstrap.xid import parse_xid_lines

LOG = logging.getLogger("node_bootstrap")

FOLLOW_JOURNAL = ("journalctl", "-k", "-f", "-n", "0", "--no-pager", "-o", "short-iso")
_KMSG_READ_BYTES = 16384  # larger than the kernel's longest record (PRINTK_MESSAGE_MAX)


class KernelLogStream:
    """The kernel log's new lines, as they are written; ends only when its source does (a journalctl that
    exited; a test's pipe whose writer closed). /dev/kmsg never ends."""

    def __init__(self, source: str, fd: int, process: subprocess.Popen | None = None) -> None:
        self.source = source  # for the log: /dev/kmsg or the journalctl command
        self._fd = fd
        self._process = process
        self._kmsg = process is None

    def lines(self) -> Iterator[str]:
        pending = b""
        while True:
            try:
                chunk = os.read(self._fd, _KMSG_READ_BYTES)
            except OSError as e:
                if e.errno == errno.EPIPE:  # records overwritten before we read them: go on with the oldest
                    LOG.warning("monitor: the kernel log outran this reader: some records were lost")
                    continue
                if e.errno == errno.EINTR:
                    continue
                raise
            if not chunk:
                return
            pending += chunk
            complete, newline, pending = pending.rpartition(b"\n")
            if not newline:  # no whole line yet
                pending = complete + pending
                continue
            text = complete.decode("utf-8", "replace") + "\n"
            if self._kmsg:
                yield from (message for _, message in parse_kmsg_records(text))
            else:
                yield from text.splitlines()

    def close(self) -> None:
        os.close(self._fd)
        if self._process is not None:
            self._process.kill()
            self._process.wait()
            if self._process.stdout is not None:
                self._process.stdout.close()


def open_kernel_log_stream(host: Host, runner: Runner) -> KernelLogStream:
    """/dev/kmsg under the host's root, from its end; journalctl -k -f where it cannot be opened. OSError
    when neither can be read."""
    path = host.path(KMSG_PATH)
    try:
        fd = os.open(path, os.O_RDONLY | os.O_CLOEXEC)
    except OSError as e:
        if runner.which("journalctl") is None:
            raise OSError(e.errno, f"{KMSG_PATH}: {e.strerror}; and no journalctl") from None
        LOG.warning("monitor: %s cannot be read (%s): following the journal instead", KMSG_PATH, e.strerror)
        process = subprocess.Popen(FOLLOW_JOURNAL, stdin=subprocess.DEVNULL, stdout=subprocess.PIPE,
                                   stderr=subprocess.DEVNULL)
        assert process.stdout is not None
        return KernelLogStream(" ".join(FOLLOW_JOURNAL), os.dup(process.stdout.fileno()), process)
    try:
        os.lseek(fd, 0, os.SEEK_END)  # from now on: the rounds read what came before
    except OSError:
        pass  # a pipe has no position (a test feeding lines)
    return KernelLogStream(KMSG_PATH, fd)


def follow_kernel_log(host: Host, responder: Responder, stream: KernelLogStream) -> None:
    """Answer each fatal Xid in `stream` at once; returns when the stream ends."""
    LOG.info("monitor: following the kernel log (%s): a fatal Xid is answered at once", stream.source)
    for line in stream.lines():
        events = parse_xid_lines(line)
        if not events:
            continue
        check = xid_check(events)
        if check.status == FAIL:
            respond_now(host, responder, f"{check.name}: {check.detail}")
        elif check.status == WARN:
            LOG.warning("monitor: WARN %s (kernel log): %s", check.name, check.detail)


def respond_now(host: Host, responder: Responder, finding: str) -> Unhealthy:
    """What a round does with a fatal finding, now: record it (unless one is recorded already) and run the
    responses not yet done."""
    with state_lock(host):
        state = load_state(host)  # the round's cursor and any earlier finding stay as they are
        if state.unhealthy is None:
            state.unhealthy = Unhealthy(unhealthy_reason(finding), utc_now())
            LOG.error("monitor: node UNHEALTHY (from the kernel log, at once): %s", state.unhealthy.reason)
            save_state(host, state)  # before the responses, as a round does: a kill mid-response loses nothing
        else:
            LOG.error("monitor: still unhealthy (found %s: %s); new: %s", state.unhealthy.since,
                      state.unhealthy.reason, finding)
        if any(r not in state.unhealthy.done for r in RESPONSES):
            responder.respond(state.unhealthy)
            save_state(host, state)
        return state.unhealthy
