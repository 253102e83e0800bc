"""Where a hang is: on this node, or on a peer (issue 45).

When the hang watch (progress.py) calls a job hung, every node of the job goes silent at once: the rank that
stopped, and the ranks that wait for it inside a collective. The step lines cannot tell them apart (each node's
last step is the same), but the host can, from the state of torchrun's workers (the local ranks) in /proc:

- a rank that is stopped (state T: SIGSTOP, a debugger, a job-control stop) or in uninterruptible sleep in any
  of its threads (state D: a read stuck on the file system, a driver call that does not return) is stuck on
  this node; so is a trainer whose own wait ran past its bound (the data_wait phase: its loader's read, which
  no peer shares);
- ranks that all sleep (state S, every thread: blocked in a socket's receive, as a collective over gloo, or on
  a futex) wait for something outside this node: a peer;
- a rank that runs (state R) may spin on a hung GPU or spin in a collective waiting on a peer (NCCL's kernels
  and a CUDA synchronize spin): the host cannot tell those apart, and says so.

A state has to hold in every one of SAMPLES samples SAMPLE_GAP_S apart: a page fault on a memory-mapped shard
is in D for a moment. The verdict goes into the job's status (job_contract.HANG_ORIGINS) with one line of
evidence that the supervisor writes from what it read here: pids, state letters and the rank, nothing the job
printed. The rank comes from the worker's environment (RANK, as torchrun sets it), which lives in the job's
own memory: only a small decimal number is taken from it.

A node that finds the hang here asks its health monitor for a check (HEALTH_CHECK_REQUEST_PATH): the monitor's
next round reads the request, logs what it finds after the hang, and removes it; a fault found then makes the
node unhealthy and replaced, as any round's would (node_bootstrap/monitor/rounds.py). Under systemd the
supervisor starts that round at once.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass

from node_bootstrap.job_contract import HANG_HERE, HANG_PEER, HANG_UNKNOWN
from node_bootstrap.jobs.processes import children, thread_states
from node_bootstrap.jobs.spec import write_json_atomic
from node_bootstrap.monitor.service import SERVICE
from node_bootstrap.monitor.state import CHECK_REQUEST_PATH

# The request (the monitor's state directory: root's) and the monitor's round as a systemd service, which the
# supervisor of a job run under systemd starts at once rather than at the timer's next round
# (healthCheckIntervalSeconds).
HEALTH_CHECK_REQUEST_PATH = CHECK_REQUEST_PATH
HEALTH_MONITOR_SERVICE = SERVICE
DATA_WAIT_PHASE = "data_wait"  # = training/phases.py DATA_WAIT: a wait of this node's own loader
SAMPLES = 3
SAMPLE_GAP_S = 0.1
# A node that did not find the hang on itself waits this long before it stops its job: the node at fault, whose
# watch fires within a poll (at most 1 s, progress.py) of this one's (the same last step, the same cadence),
# stops first and says so. Stopped first, a peer would end that node's job from outside (its sockets reset,
# torchrun's rendezvous store gone) before its supervisor had looked at it: a failed job, the hang unplaced.
PEER_WAIT_S = 5.0
_STOPPED, _DISK, _RUNNING = "Tt", "D", "R"
_RANK_DIGITS = 7  # a rank has at most this many digits (the largest world is far below 10**7)


@dataclass(frozen=True)
class RankProcess:
    """One of torchrun's workers as /proc shows it: its states (the process's own, then each thread's)."""

    pid: int
    rank: int | None  # its RANK, where the environment held a small decimal number
    states: str  # one letter per thread, the main thread first; "" once it is gone

    def name(self) -> str:
        return f"rank {self.rank} (pid {self.pid})" if self.rank is not None else f"a rank (pid {self.pid})"


def rank_of(pid: int, proc: str = "/proc") -> int | None:
    """RANK from the worker's environment (the job's memory): a small decimal number, else None."""
    try:
        with open(os.path.join(proc, str(pid), "environ"), "rb") as f:
            environ = f.read(1 << 20)
    except OSError:
        return None
    for item in environ.split(b"\0"):
        if item.startswith(b"RANK="):
            value = item[len(b"RANK="):]
            return int(value) if value.isdigit() and len(value) <= _RANK_DIGITS else None
    return None


def sample_workers(torchrun_pid: int, proc: str = "/proc", samples: int = SAMPLES, gap_s: float = SAMPLE_GAP_S,
                   sleep: Callable[[float], None] = time.sleep) -> list[RankProcess]:
    """torchrun's workers (its direct children with a RANK, or all of them where none has one), each with the
    states that held in every sample: a letter not in every sample is "S", so a moment in D or R is not a state."""
    ranks = {pid: rank_of(pid, proc) for pid in children(torchrun_pid, proc)}
    if any(rank is not None for rank in ranks.values()):  # the workers, not a helper (multiprocessing's tracker)
        ranks = {pid: rank for pid, rank in ranks.items() if rank is not None}
    seen: dict[int, list[str]] = {pid: [] for pid in ranks}
    for i in range(samples):
        if i:
            sleep(gap_s)
        for pid in ranks:
            seen[pid].append(thread_states(pid, proc))
    return [RankProcess(pid, rank, _held(seen[pid])) for pid, rank in ranks.items()]


def _held(samples: Sequence[str]) -> str:
    """Per thread, its letter where every sample agrees, else "S" (it moved: not stuck in one state)."""
    if not samples or any(not s for s in samples):
        return ""
    width = min(len(s) for s in samples)
    return "".join(samples[0][i] if all(s[i] == samples[0][i] for s in samples) else "S" for i in range(width))


def hang_origin(workers: Sequence[RankProcess], open_phase: str | None) -> tuple[str, str]:
    """(job_contract.HANG_ORIGINS verdict, one line of evidence) for a job the hang watch called hung."""
    live = [w for w in workers if w.states]
    for worker in live:
        if worker.states[0] in _STOPPED:
            return HANG_HERE, (f"{worker.name()} is stopped (state {worker.states[0]}: SIGSTOP, a debugger or a "
                               "job-control stop)")
    for worker in live:
        if _DISK in worker.states:
            return HANG_HERE, (f"{worker.name()} is in uninterruptible sleep in {worker.states.count(_DISK)} "
                               "thread(s) (state D: a file system read or a driver call that does not return)")
    if open_phase == DATA_WAIT_PHASE:
        return HANG_HERE, "the trainer's data wait did not end: its loader's read on this node"
    if not live:
        return HANG_UNKNOWN, "no worker of torchrun is left to look at"
    for worker in live:
        if _RUNNING in worker.states:
            return HANG_UNKNOWN, (f"{worker.name()} is running (state R): a spin on a hung GPU and a spin waiting "
                                  "on a peer look alike from the host")
    ranks = ", ".join(w.name() for w in live)
    return HANG_PEER, f"every rank here sleeps ({ranks}): blocked on a peer, as inside a collective"


def request_health_check(path: str, under_systemd: bool, **request: object) -> None:
    """Ask the node's health monitor for a check in its next round (HEALTH_CHECK_REQUEST_PATH), started at once
    under systemd. A node that cannot write the request (its disk full) still stops the job, and says so."""
    try:
        os.makedirs(os.path.dirname(path), exist_ok=True)
        write_json_atomic(path, request)
    except OSError as e:
        print(f"[node_bootstrap.jobs] cannot ask the health monitor for a check: {e}", file=sys.stderr, flush=True)
        return
    if not under_systemd:
        return  # the direct launcher's node has no systemd: the monitor's next round reads the request
    try:
        subprocess.run(["systemctl", "start", "--no-block", HEALTH_MONITOR_SERVICE], stdin=subprocess.DEVNULL,
                       stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, timeout=10, check=False)
    except (OSError, subprocess.TimeoutExpired) as e:
        print(f"[node_bootstrap.jobs] cannot start {HEALTH_MONITOR_SERVICE}: {e}", file=sys.stderr, flush=True)
