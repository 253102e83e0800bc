"""Where a hang is (node_bootstrap/jobs/hang_origin.py): torchrun's workers read from /proc, for real (a
stand-in torchrun whose workers sleep, stop or spin) and on a fake /proc whose states change between the
samples (uninterruptible sleep is not something a test can cause on purpose)."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from node_jobs_support import wait_until

from node_bootstrap.job_contract import HANG_HERE, HANG_PEER, HANG_UNKNOWN
from node_bootstrap.jobs.hang_origin import (
    DATA_WAIT_PHASE,
    RankProcess,
    hang_origin,
    rank_of,
    request_health_check,
    sample_workers,
)
from node_bootstrap.jobs.processes import thread_states
from training.phases import DATA_WAIT

# A stand-in for torchrun: one worker per argument ("sleep", "stop" or "spin"), RANK=10+i in each one's
# environment as torchrun sets it; it prints their pids, then waits as torchrun does.
TORCHRUN = """
import json, os, subprocess, sys, time
workers = {
    "sleep": "import time; time.sleep(600)",
    "stop": "import os, signal; os.kill(os.getpid(), signal.SIGSTOP)",
    "spin": "while True: pass",
    "threads": "import threading, time; [threading.Thread(target=time.sleep, args=(600,), daemon=True).start() "
               "for _ in range(3)]; time.sleep(600)",
}
procs = [subprocess.Popen([sys.executable, "-c", workers[kind]], env={**os.environ, "RANK": str(10 + i)})
         for i, kind in enumerate(sys.argv[1:])]
print(json.dumps([p.pid for p in procs]), flush=True)
time.sleep(600)
"""


@pytest.fixture
def torchrun():
    """Start a stand-in torchrun with the given workers; returns (its pid, the workers' pids)."""
    started = []

    def start(*kinds):
        proc = subprocess.Popen([sys.executable, "-c", TORCHRUN, *kinds], stdout=subprocess.PIPE, text=True)
        started.append(proc)
        pids = json.loads(proc.stdout.readline())
        started.extend(pids)
        return proc.pid, pids

    yield start
    for each in started:
        pid = each if isinstance(each, int) else each.pid
        try:
            os.kill(pid, signal.SIGKILL)
        except ProcessLookupError:
            pass
        if not isinstance(each, int):
            each.wait()


def settled(pids, letter):
    """Wait until each pid's main thread shows `letter` (a new process runs its imports first)."""
    wait_until(lambda: all(thread_states(p)[:1] == letter for p in pids), 10, f"workers in state {letter}")


def test_a_stopped_rank_is_a_hang_on_this_node_and_is_named(torchrun):
    parent, (sleeping, stopped) = torchrun("sleep", "stop")
    settled([sleeping], "S")
    settled([stopped], "T")
    workers = sample_workers(parent, gap_s=0.01)
    assert [(w.pid, w.rank) for w in workers] == sorted([(sleeping, 10), (stopped, 11)])
    assert hang_origin(workers, open_phase=None) == (
        HANG_HERE, f"rank 11 (pid {stopped}) is stopped (state T: SIGSTOP, a debugger or a job-control stop)")


def test_ranks_that_all_sleep_wait_on_a_peer(torchrun):
    parent, pids = torchrun("sleep", "threads")
    settled(pids, "S")
    wait_until(lambda: len(thread_states(pids[1])) >= 5, 10, "the worker's threads")  # main twice + 3
    workers = sample_workers(parent, gap_s=0.01)
    assert all(set(w.states) == {"S"} for w in workers)
    ranks = ", ".join(f"rank {10 + i} (pid {pid})" for i, pid in sorted(enumerate(pids), key=lambda x: x[1]))
    assert hang_origin(workers, open_phase=None) == (
        HANG_PEER, f"every rank here sleeps ({ranks}): blocked on a peer, as inside a collective")
    # a data wait that did not end is this node's own read, whatever the ranks' states (the trainer's phase name)
    assert DATA_WAIT_PHASE == DATA_WAIT
    assert hang_origin(workers, open_phase="data_wait") == (
        HANG_HERE, "the trainer's data wait did not end: its loader's read on this node")


def test_a_spinning_rank_cannot_be_told_apart_from_the_host(torchrun):
    parent, (sleeping, spinning) = torchrun("sleep", "spin")
    settled([sleeping], "S")
    settled([spinning], "R")
    verdict, evidence = hang_origin(sample_workers(parent, gap_s=0.01), open_phase=None)
    assert verdict == HANG_UNKNOWN
    assert evidence == (f"rank 11 (pid {spinning}) is running (state R): a spin on a hung GPU and a spin waiting "
                        "on a peer look alike from the host")


def test_a_torchrun_without_workers_is_unknown():
    assert hang_origin(sample_workers(os.getpid() + 10**6, gap_s=0), open_phase=None) == (
        HANG_UNKNOWN, "no worker of torchrun is left to look at")


# --- a fake /proc ---------------------------------------------------------------------------------------------


class FakeProc:
    """A /proc with one torchrun (pid 100) and the workers given, each thread's state settable."""

    def __init__(self, root: Path):
        self.root = root
        self.process(100, parent=1, states="S", environ=b"")

    def process(self, pid, *, parent, states, environ=b"RANK=0\0"):
        base = self.root / str(pid)
        (base / "task").mkdir(parents=True, exist_ok=True)
        (base / "environ").write_bytes(environ)
        self.set(pid, states, parent=parent)

    def set(self, pid, states, parent=100):
        # comm with a space and a parenthesis, as a process may name itself: the parser reads past the last ")"
        stat = f"{pid} (pt main) {states[0]} {parent} 1 1 0 -1\n"
        (self.root / str(pid) / "stat").write_text(stat)
        for i, letter in enumerate(states):
            task = self.root / str(pid) / "task" / str(pid + i)
            task.mkdir(exist_ok=True)
            (task / "stat").write_text(f"{pid + i} (pt thread) {letter} {parent} 1 1 0 -1\n")


def test_uninterruptible_sleep_that_holds_in_every_sample_is_a_hang_here(tmp_path):
    proc = FakeProc(tmp_path)
    proc.process(101, parent=100, states="SSDS", environ=b"HOME=/x\0RANK=3\0")
    proc.process(102, parent=100, states="SSS", environ=b"RANK=4\0")
    workers = sample_workers(100, proc=str(tmp_path), sleep=lambda s: None)
    assert workers == [RankProcess(101, 3, "SSSDS"), RankProcess(102, 4, "SSSS")]
    assert hang_origin(workers, None) == (
        HANG_HERE, "rank 3 (pid 101) is in uninterruptible sleep in 1 thread(s) (state D: a file system read or a "
                   "driver call that does not return)")


def test_a_state_seen_in_one_sample_only_is_not_a_state(tmp_path):
    proc = FakeProc(tmp_path)
    proc.process(101, parent=100, states="SD")  # a page fault on a memory-mapped shard: D for a moment
    flips = iter(["SS", "SS"])
    workers = sample_workers(100, proc=str(tmp_path), sleep=lambda s: proc.set(101, next(flips)))
    assert workers == [RankProcess(101, 0, "SSS")]
    assert hang_origin(workers, None)[0] == HANG_PEER


def test_a_rank_is_taken_from_the_environment_only_as_a_small_number(tmp_path):
    proc = FakeProc(tmp_path)
    for pid, environ in ((101, b"RANK=12345678\0"), (102, b"RANK=\x1b[2J\0"), (103, b"LOCAL_RANK=1\0"),
                         (104, b"RANK=7")):
        proc.process(pid, parent=100, states="T", environ=environ)
    assert [rank_of(pid, str(tmp_path)) for pid in (101, 102, 103, 104, 999)] == [None, None, None, 7, None]
    # the workers are the children with a RANK (not multiprocessing's tracker beside them)
    assert sample_workers(100, proc=str(tmp_path), sleep=lambda s: None) == [RankProcess(104, 7, "TT")]
    (tmp_path / "104/environ").write_bytes(b"")
    workers = sample_workers(100, proc=str(tmp_path), sleep=lambda s: None)  # none has one: all of them
    assert [w.pid for w in workers] == [101, 102, 103, 104]
    assert hang_origin(workers, None)[1].startswith("a rank (pid 101) is stopped (state T: ")


def test_the_health_check_request_is_written_and_a_failure_to_write_it_is_said(tmp_path, capsys):
    path = tmp_path / "var/lib/cluster/health-monitor/check-request.json"
    request_health_check(str(path), under_systemd=False, jobId="j-1", attempt=2, evidence="rank 3 is stopped",
                         at="2026-12-04T10:00:00Z")
    assert json.loads(path.read_text()) == {"jobId": "j-1", "attempt": 2, "evidence": "rank 3 is stopped",
                                            "at": "2026-12-04T10:00:00Z"}
    (tmp_path / "file").write_text("")
    request_health_check(str(tmp_path / "file/check-request.json"), under_systemd=True, jobId="j-1")
    assert "cannot ask the health monitor for a check: " in capsys.readouterr().err
