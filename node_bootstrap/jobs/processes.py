"""What /proc says of a job's processes: torchrun's children and descendants (torchrun starts its workers in
new sessions, so a process group does not reach them), their states, and SIGKILL to those that are left.

Runs on the nodes' system Python (>= 3.9), standard library only.
"""

from __future__ import annotations

import os
import signal
from collections.abc import Iterable

PROC = "/proc"


def _parents(proc: str) -> dict[int, list[int]]:
    """Each pid's children, from every process's stat."""
    children: dict[int, list[int]] = {}
    for entry in os.listdir(proc):
        if not entry.isdigit():
            continue
        try:
            with open(os.path.join(proc, entry, "stat")) as f:
                stat = f.read()
        except OSError:
            continue
        ppid = int(stat[stat.rindex(")") + 2:].split()[1])  # comm may contain spaces and parentheses
        children.setdefault(ppid, []).append(int(entry))
    return children


def children(pid: int, proc: str = PROC) -> list[int]:
    """The processes whose parent is `pid` (torchrun's: its workers, the local ranks), by pid."""
    return sorted(_parents(proc).get(pid, []))


def descendants(pid: int, proc: str = PROC) -> list[int]:
    """All processes below `pid`."""
    below = _parents(proc)
    found: list[int] = []
    stack = [pid]
    while stack:
        for child in below.get(stack.pop(), []):
            found.append(child)
            stack.append(child)
    return found


def state_of(stat_path: str) -> str:
    """The state letter in a stat file (R, S, D, T, t, Z, ...); "" once the process is gone."""
    try:
        with open(stat_path) as f:
            return f.read().rsplit(")", 1)[1].split()[0]
    except (OSError, IndexError):
        return ""


def thread_states(pid: int, proc: str = PROC) -> str:
    """The process's state letter, then each of its threads' (the main thread's comes twice: harmless)."""
    states = state_of(os.path.join(proc, str(pid), "stat"))
    try:
        tasks = sorted(os.listdir(os.path.join(proc, str(pid), "task")), key=lambda t: int(t) if t.isdigit() else 0)
    except OSError:
        return states
    return states + "".join(state_of(os.path.join(proc, str(pid), "task", t, "stat")) for t in tasks)


def running(pid: int) -> bool:
    """Whether `pid` exists and is not a zombie."""
    return state_of(os.path.join(PROC, str(pid), "stat")) not in ("", "Z")


def sigkill(pids: Iterable[int]) -> None:
    """SIGKILL to each of `pids` that still exists."""
    for pid in pids:
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
