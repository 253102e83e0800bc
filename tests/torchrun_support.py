"""Running ``python -m training`` under ``torchrun --nproc_per_node=2`` on the CPU (gloo, FSDP2, the tiny
model, synthetic data) and reading what it printed and saved: shared by the torchrun test modules."""

from __future__ import annotations

import contextlib
import json
import os
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import TextIO

import torch
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


def torchrun_and_signal(overrides: list[str], *, sig: int, after_step: int, resume: str = "auto") -> Run:
    """Start a long run, send ``sig`` to rank 1's process once rank 0 has logged ``after_step``, and wait."""
    proc = subprocess.Popen(torchrun_cmd(overrides, resume=resume), cwd=REPO, env=env(), text=True,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        deadline = time.monotonic() + RUN_TIMEOUT_S
        for line in proc.stdout:
            lines.append(line)
            if line.startswith('{"event": "step"') and json.loads(line)["step"] >= after_step:
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


def _start_nodes(per_node: list[list[str]], resume: str, entry: tuple[str, ...], stdout) -> list[subprocess.Popen]:
    """One process of ``entry`` per "node" (see run_as_nodes); ``stdout(rank)``: where rank's output goes."""
    port = free_port()
    procs = []
    for rank, overrides in enumerate(per_node):
        cmd = [sys.executable, *entry, "--resume", resume]
        for override in SMALL + overrides:
            cmd += ["--set", override]
        worker_env = {**env(), "RANK": str(rank), "LOCAL_RANK": "0", "WORLD_SIZE": str(len(per_node)),
                      "LOCAL_WORLD_SIZE": "1", "MASTER_ADDR": "127.0.0.1", "MASTER_PORT": str(port)}
        procs.append(subprocess.Popen(cmd, cwd=REPO, env=worker_env, text=True, stdout=stdout(rank),
                                      stderr=subprocess.STDOUT))
    return procs


def _kill_left(procs: list[subprocess.Popen]) -> None:
    for proc in procs:
        if proc.poll() is None:
            proc.kill()
            proc.wait()


@contextlib.contextmanager
def _rank_logs(ranks: range) -> Iterator[dict[int, TextIO]]:
    """A file per rank in ``ranks`` for its output, so that no rank blocks on a full pipe while the others wait
    for it in a collective; closed and removed after the block."""
    with tempfile.TemporaryDirectory() as tmp:
        files = {rank: open(Path(tmp) / f"rank{rank}.log", "w+") for rank in ranks}
        try:
            yield files
        finally:
            for f in files.values():
                f.close()


def _read_back(files: dict[int, TextIO]) -> list[str]:
    outputs = []
    for rank in sorted(files):
        files[rank].seek(0)
        outputs.append(files[rank].read())
    return outputs


def run_as_nodes(per_node: list[list[str]], *, resume: str = "auto", entry: tuple[str, ...] = TRAINING) -> Run:
    """``python -m training`` (or ``entry``) as a job of one rank per "node", node K with the overrides
    ``per_node[K]`` after SMALL: the layout of a multi-node job, where each node has its own
    checkpoint.local_dir. The ranks get the environment torchrun gives a worker (RANK, LOCAL_RANK 0, WORLD_SIZE,
    LOCAL_WORLD_SIZE 1, the store's MASTER_ADDR and MASTER_PORT) without torchrun's agent processes, which would
    only add a torch import each. Their outputs are joined, rank 0's first; each goes to a file."""
    with _rank_logs(range(len(per_node))) as files:
        procs: list[subprocess.Popen] = []
        try:
            procs = _start_nodes(per_node, resume, entry, lambda rank: files[rank])
            codes = [proc.wait(timeout=RUN_TIMEOUT_S) for proc in procs]
        finally:
            _kill_left(procs)
        outputs = _read_back(files)
    return Run(max(codes, key=abs), "".join(outputs))


def run_as_nodes_and_signal(per_node: list[list[str]], *, sig: int, after_step: int, resume: str = "auto",
                            entry: tuple[str, ...] = TRAINING) -> Run:
    """run_as_nodes, and ``sig`` to rank 1 once rank 0 has logged ``after_step`` (torchrun_and_signal without
    the agent). Rank 0's output is read as it comes; the other ranks write to files."""
    with _rank_logs(range(1, len(per_node))) as files:
        lines: list[str] = []
        procs: list[subprocess.Popen] = []
        try:
            procs = _start_nodes(per_node, resume, entry, lambda k: subprocess.PIPE if k == 0 else files[k])
            assert procs[0].stdout is not None
            deadline = time.monotonic() + RUN_TIMEOUT_S
            for line in procs[0].stdout:
                lines.append(line)
                if line.startswith('{"event": "step"') and json.loads(line)["step"] >= after_step:
                    procs[1].send_signal(sig)
                    break
                assert time.monotonic() < deadline, "".join(lines)
            rest, _ = procs[0].communicate(timeout=RUN_TIMEOUT_S)
            lines.append(rest)
            codes = [procs[0].returncode] + [proc.wait(timeout=RUN_TIMEOUT_S) for proc in procs[1:]]
        finally:
            _kill_left(procs)
        lines += _read_back(files)
    return Run(max(codes, key=abs), "".join(lines))
