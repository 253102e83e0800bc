"""What the monitor remembers between rounds (each round is a new process: systemd's timer starts it).

/var/lib/cluster/health-monitor/state.json holds:
- `kernelLog`: where the next round starts reading the kernel log (kernel_log.py), so an Xid is acted on
  once, and a restarted monitor does not read old events again;
- `unhealthy`: once a round found the node unhealthy, the reason and which of the responses are done. A
  node never becomes healthy again in the monitor's eyes (it is being replaced); a later round only retries
  a response that failed (a throttled API call), so nothing is done twice.
The file is replaced atomically; a missing or unreadable one is a first round.
"""

from __future__ import annotations

import json
import logging
import os
from dataclasses import dataclass, field

from node_bootstrap.host import Host

LOG = logging.getLogger("node_bootstrap")

STATE_PATH = "/var/lib/cluster/health-monitor/state.json"


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
