"""Running ``python -m training`` under ``torchrun --nproc_per_node=2`` on the CPU (gloo, FSDP2, the tiny
model, synthetic data) and reading what it printed and saved: shared by the torchrun test modules."""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import torch
from preloaded_ranks import ForkedRank, start_rank
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

REPO = Path(__file__).resolve().parents[1]
RUN_TIMEOUT_S = 300  # a hung collective fails the test instead of the whole CI job

# The tiny-cpu default made smaller: 4 x 32 tokens per rank per micro-batch, 2 micro-batches per step
# (exercises gradient accumulation), metrics every step (the tests compare per-step losses).
SMALL = [
    "run.seq_len=32", "run.micro_batch_size=4", "run.grad_accum_steps=2", "run.log_interval_steps=1",
    "optim.lr=3e-3",
]


@dataclass
class Run:
    returncode: int
    output: str  # stdout and stderr of torchrun and both ranks, interleaved

    @property
    def steps(self) -> list[dict]:
        return [json.loads(line) for line in self.output.splitlines()
                if line.startswith("{") and '"event": "step"' in line]

    @property
    def resumes(self) -> list[dict]:
        """The trainer's resume lines: where each start of the trainer began (training.metrics.log_resume),
        without the times of its restart phases (tests/clusterctl/test_status_timeline.py, the drills)."""
        lines = [json.loads(line) for line in self.output.splitlines()
                 if line.startswith("{") and '"event": "resume"' in line]
        return [{k: v for k, v in line.items() if k != "phases"} for line in lines]

    @property
    def losses(self) -> dict[int, float]:
        return {s["step"]: s["loss"] for s in self.steps if "loss" in s}  # rank 0's lines (other nodes': no loss)

    @property
    def grad_norms(self) -> dict[int, float]:
        return {s["step"]: s["grad_norm"] for s in self.steps if "loss" in s}  # rank 0's, as losses


TRAINING = ("-m", "training")  # what torchrun starts on each rank; a script path works too


def torchrun_cmd(overrides: list[str], *, resume: str = "auto", entry: tuple[str, ...] = TRAINING) -> list[str]:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           *entry, "--resume", resume]
    for override in SMALL + overrides:
        cmd += ["--set", override]
    return cmd


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1", **extra}


def torchrun(overrides: list[str], *, resume: str = "auto", entry: tuple[str, ...] = TRAINING,
             extra_env: dict[str, str] | None = None) -> Run:
    """`extra_env`: variables the run gets on top of the test's environment."""
    proc = subprocess.run(torchrun_cmd(overrides, resume=resume, entry=entry), cwd=REPO, env=env(**extra_env or {}),
                          text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S)
    return Run(proc.returncode, proc.stdout)


def torchrun_and_signal(overrides: list[str], *, sig: int, after_step: int, resume: str = "auto",
                        ctrl_c: bool = False) -> Run:
    """Start a long run, send ``sig`` to rank 1's process once rank 0 has logged ``after_step``, and wait.
    ``ctrl_c``: instead, SIGINT to the whole process group (torchrun and both ranks), as a terminal's Ctrl-C."""
    proc = subprocess.Popen(torchrun_cmd(overrides, resume=resume), cwd=REPO, env=env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=ctrl_c)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + RUN_TIMEOUT_S
        for line in proc.stdout:
            lines.append(line)
            if line.startswith('{"event": "step"') and json.loads(line)["step"] >= after_step:
                if ctrl_c:
                    os.killpg(proc.pid, signal.SIGINT)
                else:
                    os.kill(worker_pid(proc.pid, rank=1), sig)
                break
            assert time.monotonic() < deadline, "".join(lines)
        rest, _ = proc.communicate(timeout=RUN_TIMEOUT_S)
        lines.append(rest)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    return Run(proc.returncode, "".join(lines))


def worker_pid(torchrun_pid: int, *, rank: int) -> int:
    """The pid of torchrun's worker process with RANK=rank (its child, found through /proc)."""
    for stat in Path("/proc").glob("[0-9]*/stat"):
        try:
            ppid = int(stat.read_text().rsplit(")", 1)[1].split()[1])
            if ppid != torchrun_pid:
                continue
            environ = (stat.parent / "environ").read_bytes().split(b"\0")
        except (OSError, IndexError, ValueError):
            continue  # the process ended while we looked
        if f"RANK={rank}".encode() in environ:
            return int(stat.parent.name)
    raise AssertionError(f"no worker with RANK={rank} under torchrun pid {torchrun_pid}")


def complete_steps(root: Path) -> list[int]:
    return sorted(int(p.name.split("-")[1]) for p in root.glob("step-*")
                  if (p / ".metadata").is_file() and (p / "train_state.json").is_file())


def load_checkpoint(path: Path, tmp: Path) -> dict:
    out = tmp / f"{path.parent.name}-{path.name}.pt"
    dcp_to_torch_save(path, out)
    return torch.load(out, weights_only=False)


def free_port() -> int:
    import socket

    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def _start_ranks(argvs: list[list[str]], logs: dict[int, Path],
                 extra_env: dict[str, str] | None = None) -> list[ForkedRank]:
    """Rank K runs ``python *argvs[K]``, forked from a process that has the trainer imported already
    (tests/preloaded_ranks.py), with torchrun's worker environment (and ``extra_env``); its output goes to
    ``logs[K]``."""
    port = free_port()
    ranks = []
    for rank, argv in enumerate(argvs):
        worker_env = {**env(**extra_env or {}), "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(len(argvs)),
                      "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        ranks.append(start_rank(argv, env=worker_env, cwd=REPO, log=logs[rank]))
    return ranks


def _trainer_argvs(per_node: list[list[str]], resume: str, entry: tuple[str, ...]) -> list[list[str]]:
    argvs = []
    for overrides in per_node:
        argv = [*entry, "--resume", resume]
        for override in SMALL + overrides:
            argv += ["--set", override]
        argvs.append(argv)
    return argvs


def _kill_left(ranks: list[ForkedRank]) -> None:
    for rank in ranks:
        if rank.poll() is None:
            rank.kill()
            rank.wait()


@contextlib.contextmanager
def _rank_logs(count: int) -> Iterator[dict[int, Path]]:
    """A file per rank for its output, so that no rank blocks on a full pipe while the others wait for it in a
    collective; removed after the block."""
    with tempfile.TemporaryDirectory() as tmp:
        yield {rank: Path(tmp) / f"rank{rank}.log" for rank in range(count)}


def _read_back(logs: dict[int, Path]) -> str:
    return "".join(logs[rank].read_text() if logs[rank].exists() else "" for rank in sorted(logs))


def run_ranks(argvs: list[list[str]], *, extra_env: dict[str, str] | None = None) -> Run:
    """A job of one rank per ``python *argv`` in ``argvs``, each with the environment torchrun gives a worker
    (RANK, LOCAL_RANK 0, WORLD_SIZE, LOCAL_WORLD_SIZE 1, the store's MASTER_ADDR and MASTER_PORT) but without
    torchrun's agent processes, which would only add a torch import each; each rank is forked from a process
    that has imported the trainer already (tests/preloaded_ranks.py). Their outputs are joined, rank 0's first.
    `extra_env`: variables the ranks get on top of the test's environment."""
    with _rank_logs(len(argvs)) as logs:
        ranks: list[ForkedRank] = []
        try:
            ranks = _start_ranks(argvs, logs, extra_env)
            codes = [rank.wait(timeout=RUN_TIMEOUT_S) for rank in ranks]
        finally:
            _kill_left(ranks)
        output = _read_back(logs)
    return Run(max(codes, key=abs), output)


def run_as_nodes(per_node: list[list[str]], *, resume: str = "auto", entry: tuple[str, ...] = TRAINING,
                 extra_env: dict[str, str] | None = None) -> Run:
    """``python -m training`` (or ``entry``) as a job of one rank per "node" (run_ranks), node K with the
    overrides ``per_node[K]`` after SMALL: the layout of a multi-node job, where each node has its own
    checkpoint.local_dir."""
    return run_ranks(_trainer_argvs(per_node, resume, entry), extra_env=extra_env)


def run_as_nodes_and_signal(per_node: list[list[str]], *, sig: int, after_step: int, resume: str = "auto",
                            entry: tuple[str, ...] = TRAINING) -> Run:
    """run_as_nodes, and ``sig`` to rank 1 once rank 0 has logged ``after_step`` (torchrun_and_signal without
    the agent)."""
    with _rank_logs(len(per_node)) as logs:
        ranks: list[ForkedRank] = []
        try:
            ranks = _start_ranks(_trainer_argvs(per_node, resume, entry), logs)
            _wait_for_step(logs[0], ranks[0], after_step)
            ranks[1].send_signal(sig)
            codes = [rank.wait(timeout=RUN_TIMEOUT_S) for rank in ranks]
        finally:
            _kill_left(ranks)
        output = _read_back(logs)
    return Run(max(codes, key=abs), output)


def _wait_for_step(log: Path, rank: ForkedRank, step: int) -> None:
    """Until ``log`` (rank 0's output, as it is written) has the step line of ``step`` or a later one."""
    deadline = time.monotonic() + RUN_TIMEOUT_S
    seen = ""
    while True:
        seen = log.read_text() if log.exists() else ""
        for line in seen.splitlines(keepends=True):
            if line.startswith('{"event": "step"') and line.endswith("\n") and json.loads(line)["step"] >= step:
                return
        assert rank.poll() is None, f"rank 0 ended with {rank.returncode} before step {step}:\n{seen[-3000:]}"
        assert time.monotonic() < deadline, seen[-3000:]
        time.sleep(0.02)
