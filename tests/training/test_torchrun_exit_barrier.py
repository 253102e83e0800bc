"""training/torchrun.py: torchrun with a bounded exit barrier. Two real torchrun agents, two "nodes" on 127.0.0.1
with one worker each, in the race a stop that reaches one node first produces: node B's agent hosts the
rendezvous store; node A's agent is signalled and exits without joining the exit barrier; node B's worker then
ends with 0 (as a trainer does when its peer's stop request is agreed) and its agent waits in the barrier for A,
which never comes: 300 s with torchrun's default, the bound with the wrapper."""

from __future__ import annotations

import os
import signal
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest

from training.torchrun import EXIT_BARRIER_OPTION, exit_barrier_seconds

REPO = Path(__file__).resolve().parents[2]
BOUND_S = 2
# torchrun's default is 300 s: a B that is gone within this waited for the bound, not for the default
GONE_WITHIN_S = 90

# One worker per node, no torch: ready, then waits for its cue; exits 0 on the cue or on SIGTERM.
WORKER = """\
import os, signal, sys, time
from pathlib import Path
here = Path(sys.argv[1])
signal.signal(signal.SIGTERM, lambda *_: sys.exit(0))
(here / f"ready-{os.environ['GROUP_RANK']}").write_text(str(os.getpid()))
while not (here / f"finish-{os.environ['GROUP_RANK']}").exists():
    time.sleep(0.05)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_for(predicate, timeout_s: float, what: str):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def agent(port: int, work: Path, name: str, *wrapper: str) -> subprocess.Popen:
    module = ["-m", "training.torchrun", *wrapper] if wrapper else ["-m", "torch.distributed.run"]
    cmd = [sys.executable, *module, "--nnodes", "2", "--nproc-per-node", "1", "--rdzv-backend", "c10d",
           "--rdzv-endpoint", f"127.0.0.1:{port}", "--rdzv-id", "exit-barrier", "--max-restarts", "0",
           "--monitor-interval", "0.1", str(work / "worker.py"), str(work)]
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    return subprocess.Popen(cmd, cwd=REPO, env=env, stdout=open(work / f"{name}.log", "w"), stderr=subprocess.STDOUT)


def listening(port: int) -> bool:
    with socket.socket() as s:
        return s.connect_ex(("127.0.0.1", port)) == 0


@pytest.mark.slow
def test_an_agent_left_alone_in_the_exit_barrier_exits_after_the_bound(tmp_path):
    (tmp_path / "worker.py").write_text(WORKER)
    port = free_port()
    node_b = agent(port, tmp_path, "b", EXIT_BARRIER_OPTION, str(BOUND_S))
    node_a = None
    try:
        wait_for(lambda: listening(port), 60, "node B's agent to host the rendezvous store")
        node_a = agent(port, tmp_path, "a", EXIT_BARRIER_OPTION, str(BOUND_S))
        wait_for(lambda: len(list(tmp_path.glob("ready-*"))) == 2, 60, "both workers")
        # B hosts the store, so it is the first group rank's node: A's worker is the other one
        ready = {p.name: int(p.read_text()) for p in tmp_path.glob("ready-*")}
        assert sorted(ready) == ["ready-0", "ready-1"]
        a_rank = next(r for r in ("0", "1") if _child_of(ready[f"ready-{r}"], node_a.pid))
        node_a.send_signal(signal.SIGTERM)  # A is stopped first: its agent leaves without the barrier
        assert node_a.wait(timeout=60) != 0
        (tmp_path / f"finish-{'1' if a_rank == '0' else '0'}").write_text("")  # B's worker ends with 0
        started = time.monotonic()
        assert node_b.wait(timeout=GONE_WITHIN_S) == 0, (tmp_path / "b.log").read_text()[-3000:]
        waited_s = time.monotonic() - started
    finally:
        for proc in (node_a, node_b):
            if proc is not None and proc.poll() is None:
                proc.kill()
                proc.wait()
    log = (tmp_path / "b.log").read_text()
    assert f"wait timeout after {BOUND_S * 1000}ms" in log, log[-3000:]  # the barrier's store wait, bounded
    assert waited_s < GONE_WITHIN_S


def _child_of(pid: int, parent: int) -> bool:
    with open(f"/proc/{pid}/stat") as f:
        return int(f.read().rsplit(")", 1)[1].split()[1]) == parent


def test_the_option_is_read_first_and_checked():
    assert exit_barrier_seconds([EXIT_BARRIER_OPTION, "30", "--nnodes", "2"]) == (30, ["--nnodes", "2"])
    assert exit_barrier_seconds(["--nnodes", "2"]) == (None, ["--nnodes", "2"])
    for bad in ("0", "-1", "ten", "3601"):
        with pytest.raises(SystemExit, match=f"--exit-barrier-seconds='{bad}': allowed: seconds, 1-3600"):
            exit_barrier_seconds([EXIT_BARRIER_OPTION, bad])
