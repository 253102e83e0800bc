"""Sharded checkpoints with torch.distributed.checkpoint (DCP).

Layout (one directory per save; every rank writes its own shards, rank 0 the metadata and the marker):

    <checkpoint.dir>/step-<N>/          N = optimizer steps completed when it was taken
        __<rank>_<i>.distcp             DCP shards of the model and optimizer state (sharded like FSDP2)
        .metadata                       written by DCP on rank 0 after every rank's shards are written
        train_state.json                ours, written last: {"step": N, "world_size", "saved_at", "config"}

A checkpoint counts only when complete: ``.metadata`` (DCP's own last write) and ``train_state.json``
(written after the save returned, for async saves after its future resolved) both exist. A crash at any point
of a save leaves a directory without the marker, which ``find_latest_complete`` skips with a warning. The data
position is not saved: the batch order is a pure function of (seed, step, rank), so the step is all a resume
needs.

What is saved is ``checkpoint_state.build_state`` (FP8 weight wrappers unwrapped to their high-precision
tensors, Transformer Engine's extra state as bytes), and every save is verified before DCP writes it
(``checkpoint_verify``): a state that fails the check fails the save on every rank and is never marked
complete.
"""

from __future__ import annotations

import json
import logging
import os
import re
import shutil
import time
from concurrent.futures import Future
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException

from training.checkpoint_state import build_state, load_into
from training.checkpoint_verify import VerifyingSavePlanner, describe
from training.config_sections import CheckpointConfig
from training.errors import ConfigError

log = logging.getLogger(__name__)

MARKER_FILE = "train_state.json"
DCP_METADATA_FILE = ".metadata"
_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class TrainState:
    """What a checkpoint says about itself (its ``train_state.json``)."""

    step: int  # optimizer steps completed; training resumes at this step
    path: Path


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step}"


def is_complete(path: str | Path) -> bool:
    path = Path(path)
    return (path / DCP_METADATA_FILE).is_file() and (path / MARKER_FILE).is_file()


def _step_dirs(root: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every step-<N> directory under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.fullmatch(p.name))]
    return sorted(found)


def find_latest_complete(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root``; logs a warning for each incomplete one it skips."""
    for step, path in reversed(_step_dirs(Path(root))):
        if is_complete(path):
            return path
        missing = [f for f in (DCP_METADATA_FILE, MARKER_FILE) if not (path / f).is_file()]
        log.warning("skipping incomplete checkpoint %s (step %d): missing %s", path, step, ", ".join(missing))
    return None


def read_train_state(path: str | Path) -> TrainState:
    path = Path(path)
    data = json.loads((path / MARKER_FILE).read_text())
    return TrainState(step=int(data["step"]), path=path)


def resolve_resume(resume: str, checkpoint_root: str) -> Path | None:
    """Which checkpoint ``--resume`` names: ``none`` -> None; ``auto`` -> the newest complete one under
    ``checkpoint.dir`` (None when there is none); anything else is the path of a complete checkpoint."""
    if resume == "none":
        return None
    if resume == "auto":
        if not checkpoint_root:
            return None
        latest = find_latest_complete(checkpoint_root)
        if latest is None:
            log.info("--resume auto: no complete checkpoint under %s; starting fresh", checkpoint_root)
        return latest
    path = Path(resume)
    if not path.is_dir():
        raise ConfigError(f"--resume={resume!r}: allowed: auto, none, or a checkpoint directory (not found)")
    if not is_complete(path):
        raise ConfigError(
            f"--resume={resume!r}: not a complete checkpoint (needs {DCP_METADATA_FILE} and {MARKER_FILE}); "
            "allowed: auto, none, or a complete step-<N> directory"
        )
    return path


class CheckpointSaveError(RuntimeError):
    """A save failed (its write, or its verification): the checkpoint is not complete."""


def _save_failed(step: int, path: Path, exc: BaseException) -> CheckpointSaveError:
    """The error a failed save raises: which ranks failed and why, in one line (DCP's CheckpointException
    prints every rank's traceback; those stay on the exception chain)."""
    if isinstance(exc, CheckpointException):
        why = "; ".join(f"rank {rank}: {type(err).__name__}: {err}" for rank, (err, _) in exc.failures.items())
    else:
        why = f"{type(exc).__name__}: {exc}"
    message = f"checkpoint step {step} failed and is not complete ({path}): {why}"
    log.error("%s", message)
    return CheckpointSaveError(message)


def _write_atomic(path: Path, text: str) -> None:
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)


class Checkpointer:
    """Saves and loads model + optimizer state; one instance per training run, on every rank.

    Saves are collective: every rank calls ``save`` at the same step. At most one save is in flight: a new
    save, ``wait`` and ``close`` first wait for the pending one, so an async save never races the next save or
    the exit.
    """

    def __init__(self, cfg: CheckpointConfig, *, rank: int, world_size: int, config_snapshot: dict[str, Any]):
        self.cfg = cfg
        self.root = Path(cfg.dir) if cfg.dir else None
        self.rank = rank
        self.world_size = world_size
        self._config_snapshot = config_snapshot
        self._pending: tuple[int, Path, Future, float] | None = None  # step, path, future, start time
        self._last_saved_step: int | None = None
        # dcp.async_save runs DCP's collectives from a background thread. They must not share a process group
        # with the training loop's collectives (two threads issuing collectives on one group can interleave
        # and hang), and async save needs a CPU backend; torchtitan uses a separate gloo group for the same
        # reasons (torchtitan/components/checkpoint.py).
        self._async_group = None
        if cfg.async_save and self.root is not None and dist.is_initialized():
            self._async_group = dist.new_group(backend="gloo")

    @property
    def enabled(self) -> bool:
        return self.root is not None

    def should_save(self, step: int, total_steps: int) -> bool:
        """Whether the regular schedule saves after ``step`` completed steps (not counting SIGTERM saves)."""
        if self.root is None:
            return False
        if step == total_steps and self.cfg.save_final:
            return True
        return self.cfg.interval_steps > 0 and step % self.cfg.interval_steps == 0

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, *, blocking: bool) -> None:
        """Save the state after ``step`` completed steps into ``<dir>/step-<step>``. With ``blocking=False``
        and ``checkpoint.async_save`` the write continues in the background once the state is on the CPU."""
        if self.root is None or step == self._last_saved_step:
            return
        self.wait()
        path = step_dir(self.root, step)
        self._clear_stale(path)
        started = time.monotonic()
        state = build_state(model, optimizer)
        asynchronous = not blocking and self.cfg.async_save
        # The description the planner verifies against; for an async save it includes each tensor's bits,
        # so the staged copy is checked against the live state (checkpoint_verify).
        planner = VerifyingSavePlanner(describe(state, fingerprints=asynchronous))
        if not asynchronous:
            try:
                dcp.save(state, checkpoint_id=str(path), planner=planner)
            except (Exception, CheckpointException) as exc:  # CheckpointException is a BaseException
                raise _save_failed(step, path, exc) from exc
            self._finish(step, path, started)
        else:
            # async_save copies the state to CPU memory before it returns (DCP's DefaultStager), so the next
            # optimizer step cannot change what is being written
            future = dcp.async_save(state, checkpoint_id=str(path), process_group=self._async_group,
                                    planner=planner)
            self._pending = (step, path, future, started)
            log.info("checkpoint step %d: staged in %.2fs, writing in the background", step,
                     time.monotonic() - started)
        self._last_saved_step = step

    def poll(self) -> None:
        """Finish a pending async save whose write has completed (call at step boundaries)."""
        if self._pending is not None and self._pending[2].done():
            self.wait()

    def wait(self) -> None:
        """Block until the pending async save (if any) has been written, then mark it complete."""
        if self._pending is None:
            return
        step, path, future, started = self._pending
        self._pending = None
        try:
            future.result()  # re-raises a failed write: a checkpoint that failed must not be marked complete
        except (Exception, CheckpointException) as exc:
            raise _save_failed(step, path, exc) from exc
        self._finish(step, path, started)

    def close(self) -> None:
        self.wait()
        if self._async_group is not None:
            dist.destroy_process_group(self._async_group)
            self._async_group = None

    def close_after_error(self) -> None:
        """``close`` on the way out of a failed run: a pending save that still completes is marked complete
        (it may be the one the restart resumes from); one that fails is logged, not raised over the error
        that ended the run."""
        try:
            self.close()
        except Exception as exc:
            log.error("the checkpoint being written when the run failed is incomplete: %s", exc)

    def load(self, path: str | Path, model: nn.Module, optimizer: torch.optim.Optimizer) -> TrainState:
        """Load a complete checkpoint into the (already sharded) model and optimizer; DCP reshards when the
        world size differs from the one that saved it."""
        path = Path(path)
        train_state = read_train_state(path)
        state = build_state(model, optimizer)  # its tensors share storage with the model's: loaded in place
        dcp.load(state, checkpoint_id=str(path))
        load_into(model, optimizer, state)
        self._last_saved_step = train_state.step
        log.info("resumed from %s (step %d)", path, train_state.step)
        return train_state

    def _clear_stale(self, path: Path) -> None:
        """A leftover directory at the path about to be written (from a crashed run that got this far) would
        mix its stale shards and marker with the new save: rank 0 removes it before any rank writes."""
        if self.rank == 0 and path.exists():
            log.warning("removing stale checkpoint directory %s before saving over it", path)
            shutil.rmtree(path)
        if dist.is_initialized():
            dist.barrier()

    def _finish(self, step: int, path: Path, started: float) -> None:
        """Mark a written checkpoint complete and delete old ones (rank 0; the directory is shared)."""
        if self.rank != 0:
            return
        # On rank 0, DCP's save returns (and its future resolves) only after the coordinator gathered every
        # rank's write results and wrote .metadata, so all shards are on disk when we get here.
        marker = {
            "step": step,
            "world_size": self.world_size,
            "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime()),
            "config": self._config_snapshot,
        }
        _write_atomic(path / MARKER_FILE, json.dumps(marker, indent=2, default=str) + "\n")
        log.info("checkpoint step %d complete: %s (%.2fs after the save began)", step, path,
                 time.monotonic() - started)
        self._prune()

    def _prune(self) -> None:
        """Keep the newest ``keep_last`` complete checkpoints. Incomplete directories older than the newest
        complete one are crash leftovers and go too; nothing newer is touched (a save may be writing it)."""
        assert self.root is not None
        dirs = _step_dirs(self.root)
        complete = [(s, p) for s, p in dirs if is_complete(p)]
        if not complete:
            return
        keep = {p for _, p in complete[-self.cfg.keep_last:]}
        newest_complete_step = complete[-1][0]
        for step, path in dirs:
            if path in keep or step > newest_complete_step:
                continue
            log.info("deleting old checkpoint %s", path)
            shutil.rmtree(path, ignore_errors=True)
