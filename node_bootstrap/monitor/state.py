"""What the monitor remembers between rounds (each round is a new process: systemd's timer starts it).

/var/lib/cluster/health-monitor/state.json holds:
- `kernelLog`: where the next round starts reading the kernel log (kernel_log.py), so an Xid is acted on
  once, and a restarted monitor does not read old events again;
- `unhealthy`: once a round found the node unhealthy, the reason and which of the responses are done. A
  node never becomes healthy again in the monitor's eyes (it is being replaced); a later round only retries
  a response that failed (a throttled API call), so nothing is done twice.
The file is replaced atomically; a missing or unreadable one is a first round.

Two processes change it: the round (systemd's timer) and the kernel-log follower (follow.py, a service that
answers a fatal Xid at once). Each takes `state_lock` to read the finding, record its own and run the
responses, so a response is done once whichever of them sees the fault first, and neither overwrites the
other's finding with an older state.
"""

from __future__ import annotations

import contextlib
import fcntl
import json
import logging
import os
from collections.abc import Iterator
from dataclasses import dataclass, field

from node_bootstrap.host import Host

LOG = logging.getLogger("node_bootstrap")

STATE_PATH = "/var/lib/cluster/health-monitor/state.json"
LOCK_PATH = "/var/lib/cluster/health-monitor/state.lock"
# Written by the supervisor of a job whose hang is on this node (node_bootstrap/jobs/hang_origin.py), read and
# removed by the next round (rounds.py): {"jobId": ..., "attempt": N, "evidence": ..., "at": ...}.
CHECK_REQUEST_PATH = "/var/lib/cluster/health-monitor/check-request.json"


@dataclass
class Unhealthy:
    reason: str  # one line: what was found
    since: str  # UTC time of the round that found it
    done: list[str] = field(default_factory=list)  # the responses completed (actions.RESPONSES)


@dataclass
class MonitorState:
    kernel_log: dict | None = None  # kernel_log.KernelLogRead.cursor of the last round
    unhealthy: Unhealthy | None = None

    def to_json(self) -> str:
        data: dict = {"kernelLog": self.kernel_log, "unhealthy": None}
        if self.unhealthy is not None:
            data["unhealthy"] = {"reason": self.unhealthy.reason, "since": self.unhealthy.since,
                                 "done": list(self.unhealthy.done)}
        return json.dumps(data, indent=2, sort_keys=True) + "\n"


def load_state(host: Host) -> MonitorState:
    try:
        data = json.loads(host.read_text(STATE_PATH, default="{}"))
        unhealthy = data.get("unhealthy")
        return MonitorState(
            kernel_log=data.get("kernelLog") if isinstance(data.get("kernelLog"), dict) else None,
            unhealthy=Unhealthy(str(unhealthy["reason"]), str(unhealthy["since"]), list(unhealthy["done"]))
            if isinstance(unhealthy, dict) else None,
        )
    except (ValueError, KeyError, TypeError, AttributeError, OSError) as e:
        LOG.warning("monitor state %s is unreadable (%s): starting afresh", STATE_PATH, e)
        return MonitorState()


def save_state(host: Host, state: MonitorState) -> None:
    """Atomically (a round killed mid-write leaves the previous state, never half of one)."""
    path = host.path(STATE_PATH)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    tmp = f"{path}.tmp-{os.getpid()}"
    with open(tmp, "w", encoding="utf-8") as f:
        f.write(state.to_json())
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


@contextlib.contextmanager
def state_lock(host: Host) -> Iterator[None]:
    """Held while a process reads the finding, records one and responds (flock: released when the process
    dies, so a round killed mid-response never blocks the follower)."""
    path = host.path(LOCK_PATH)
    os.makedirs(os.path.dirname(path), exist_ok=True)
    fd = os.open(path, os.O_RDWR | os.O_CREAT | os.O_CLOEXEC, 0o600)
    try:
        fcntl.flock(fd, fcntl.LOCK_EX)
        yield
    finally:
        os.close(fd)  # closing the descriptor releases the lock
