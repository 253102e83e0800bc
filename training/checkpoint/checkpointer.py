"""The Checkpointer: saves (blocking or asynchronous) and loads of the durable checkpoints, and their pruning.

Saves go to the layout of ``layout.py`` (one ``step-<N>`` directory each, complete once its
``train_state.json`` marker is written) with torch.distributed.checkpoint (DCP); the Checkpointer writes the
marker after DCP's write returned and keeps the newest ``checkpoint.keep_last`` complete ones.

An asynchronous save copies the state to CPU memory on a staging thread beside the loop (``staging.py``):
``save`` returns once the state dict is built, and the loop calls ``wait_for_staging`` before its next
``optimizer.step()``.

What is saved is ``state.build_state`` (FP8 weight wrappers unwrapped to their high-precision tensors,
Transformer Engine's extra state as bytes), and every save is verified before DCP writes it (``verify.py``): a
state that fails the check fails the save on every rank and is never marked complete.
"""

from __future__ import annotations

import json
import logging
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

from training.checkpoint.layout import (
    MARKER_FILE,
    TrainState,
    is_complete,
    read_train_state,
    step_dir,
    step_dirs,
    write_atomic,
)
from training.checkpoint.staging import BackgroundStager, StagingJob, staging_api_available, use_pinned_memory
from training.checkpoint.state import build_state, load_into
from training.checkpoint.verify import VerifyingSavePlanner, describe
from training.config.sections import CheckpointConfig

log = logging.getLogger("training.checkpoint")  # the package's logger (layout.py)


@dataclass
class SaveTimings:
    """Where one save spent its time, in seconds from the start of ``Checkpointer.save`` unless noted; what
    ``python -m training.bench_io checkpoint`` reports. None: not measured for this kind of save."""

    step: int
    staging: str  # "background", "inline" (in the save call) or "blocking" (dcp.save of the live state)
    build_state_s: float | None = None  # get_state_dict and the FP8 unwrapping (duration, training thread)
    blocked_s: float | None = None  # until save() returned: how long the loop was held
    describe_s: float | None = None  # the live state's description with fingerprints (duration)
    copy_s: float | None = None  # the copy into CPU memory (duration; inline: with describe and DCP's setup)
    staged_s: float | None = None  # until the staged copy was complete (the loop may change the state)
    loop_waited_s: float | None = None  # how long wait_for_staging held the loop (duration)
    verify_s: float | None = None  # the planner's check of what is written (duration, DCP's thread)
    complete_s: float | None = None  # until the checkpoint was marked complete


@dataclass
class _PendingSave:
    step: int
    path: Path
    upload: Future  # DCP's write; resolves after .metadata is written (on the coordinator)
    started: float  # time.monotonic() when save() began
    timings: SaveTimings
    planner: VerifyingSavePlanner
    staging: StagingJob | None = None  # the background copy; None once it is known to be done


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


def _default_device() -> torch.device:
    return torch.device("cuda", torch.cuda.current_device()) if torch.cuda.is_available() else torch.device("cpu")


def _seconds(value: float | None) -> str:
    return "-" if value is None else f"{value:.2f}s"


class Checkpointer:
    """Saves and loads model + optimizer state; one instance per training run, on every rank.

    Saves are collective: every rank calls ``save`` at the same step. At most one save is in flight: a new
    save, ``wait`` and ``close`` first wait for the pending one, so an async save never races the next save or
    the exit.
    """

    def __init__(self, cfg: CheckpointConfig, *, rank: int, world_size: int, config_snapshot: dict[str, Any],
                 device: torch.device | None = None):
        self.cfg = cfg
        self.root = Path(cfg.dir) if cfg.dir else None
        self.rank = rank
        self.world_size = world_size
        self._config_snapshot = config_snapshot
        self._pending: _PendingSave | None = None
        self._last_saved_step: int | None = None
        self._start_step = 0  # the step the run started from (set_start_step): its own line ends there
        self._saved_steps: set[int] = set()  # the steps this run saved and completed
        self.last_timings: SaveTimings | None = None  # of the last save that completed
        # Where async saves stage (checkpoint.staging; checkpoint/staging.py): beside the loop when this torch
        # has DCP's staging API, else inside the save call as DCP does by default.
        self._stager: BackgroundStager | None = None
        if cfg.async_save and self.root is not None and cfg.staging != "inline":
            device = device if device is not None else _default_device()
            pinned = use_pinned_memory(cfg.staging, device)  # a bad choice fails here, on every rank alike
            if staging_api_available():
                self._stager = BackgroundStager(device=device, pinned=pinned)
            else:
                log.warning("checkpoint.staging=%r: this torch (%s) lacks DCP's DefaultStager/StagingOptions or "
                            "async_save(async_stager=...); async saves stage inside the save call",
                            cfg.staging, torch.__version__)
        # dcp.async_save runs DCP's collectives from a background thread. They must not share a process group
        # with the training loop's collectives (two threads issuing collectives on one group can interleave
        # and hang), and async save needs a CPU backend; torchtitan uses a separate gloo group for the same
        # reasons (torchtitan/components/checkpoint.py).
        self._async_group = None
        if cfg.async_save and self.root is not None and dist.is_initialized():
            self._async_group = dist.new_group(backend="gloo")

    @property
    def staging_pinned(self) -> bool | None:
        """Whether async saves stage into pinned buffers; None when they stage inline (new memory each save)."""
        return None if self._stager is None else self._stager.pinned

    @property
    def enabled(self) -> bool:
        return self.root is not None

    def set_start_step(self, step: int) -> None:
        """The step this run starts from (the one resumed from; 0 for a fresh start). The complete checkpoints
        at or below it are the run it continues, which keep_last prunes with its own saves; any other one
        that this run did not save belongs to another run and is never deleted by it (``_prune``)."""
        self._start_step = step

    def should_save(self, step: int, total_steps: int) -> bool:
        """Whether the regular schedule saves after ``step`` completed steps (not counting SIGTERM saves)."""
        if self.root is None:
            return False
        if step == total_steps and self.cfg.save_final:
            return True
        return self.cfg.interval_steps > 0 and step % self.cfg.interval_steps == 0

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer, *, blocking: bool) -> None:
        """Save the state after ``step`` completed steps into ``<dir>/step-<step>``. With ``blocking=False``
        and ``checkpoint.async_save`` the write continues in the background; with background staging (the
        default where torch has it) so does the copy of the state, and the caller must call
        ``wait_for_staging`` before it changes the model or optimizer state (before ``optimizer.step()``)."""
        if self.root is None or step == self._last_saved_step:
            return
        self.wait()  # one save in flight: its staging buffers are the next save's (checkpoint/staging.py)
        path = step_dir(self.root, step)
        self._clear_stale(path)
        started = time.monotonic()
        state = build_state(model, optimizer)
        built = time.monotonic() - started
        asynchronous = not blocking and self.cfg.async_save
        if not asynchronous:
            timings = SaveTimings(step=step, staging="blocking", build_state_s=built)
            planner = VerifyingSavePlanner(describe(state, fingerprints=False))
            try:
                dcp.save(state, checkpoint_id=str(path), planner=planner)
            except (Exception, CheckpointException) as exc:  # CheckpointException is a BaseException
                raise _save_failed(step, path, exc) from exc
            timings.verify_s = planner.verify_s
            timings.blocked_s = timings.complete_s = time.monotonic() - started
            self._finish(step, path, started, timings)
        elif self._stager is None:
            # DCP's default stager copies the state to new CPU memory before async_save returns; the
            # description (with each tensor's bits, so the staged copy is checked against the live state) is
            # taken first, on this thread
            timings = SaveTimings(step=step, staging="inline", build_state_s=built)
            began = time.monotonic()
            planner = VerifyingSavePlanner(describe(state, fingerprints=True))
            timings.describe_s = time.monotonic() - began
            began = time.monotonic()
            upload = dcp.async_save(state, checkpoint_id=str(path), process_group=self._async_group,
                                    planner=planner)
            upload = getattr(upload, "upload_completion", upload)  # a torch whose async_save answers a response
            timings.copy_s = time.monotonic() - began
            timings.blocked_s = timings.staged_s = time.monotonic() - started
            self._pending = _PendingSave(step, path, upload, started, timings, planner)
            log.info("checkpoint step %d: staged in %.2fs, writing in the background", step, timings.staged_s)
        else:
            timings = SaveTimings(step=step, staging="background", build_state_s=built)
            job = self._stager.job()
            planner = VerifyingSavePlanner(job.description)
            response = dcp.async_save(state, checkpoint_id=str(path), process_group=self._async_group,
                                      planner=planner, async_stager=job)
            upload = getattr(response, "upload_completion", response)
            timings.blocked_s = time.monotonic() - started
            self._pending = _PendingSave(step, path, upload, started, timings, planner, staging=job)
            log.info("checkpoint step %d: staging in the background (the loop was held %.2fs)", step,
                     timings.blocked_s)
        self._last_saved_step = step

    def wait_for_staging(self) -> None:
        """Block until the pending save's background copy of the state is complete (no-op without one). The
        loop calls it right before ``optimizer.step()``: from then on the state may change."""
        pending = self._pending
        if pending is None or pending.staging is None:
            return
        job, pending.staging = pending.staging, None
        began = time.monotonic()
        assert job.staged is not None  # dcp.async_save called job.stage before it returned
        job.staged.result()  # never fails: a failed staging fails the save's planning (checkpoint/staging.py)
        timings = pending.timings
        timings.loop_waited_s = time.monotonic() - began
        timings.staged_s = time.monotonic() - pending.started
        timings.describe_s, timings.copy_s = job.times.describe_s, job.times.copy_s
        log.info("checkpoint step %d: staged in %.2fs (fingerprints %s, copy %s), the loop waited %.2fs for it",
                 pending.step, timings.staged_s, _seconds(timings.describe_s), _seconds(timings.copy_s),
                 timings.loop_waited_s)

    def poll(self) -> None:
        """Finish a pending async save whose write has completed (call at step boundaries)."""
        if self._pending is not None and self._pending.upload.done():
            self.wait()

    def wait(self) -> None:
        """Block until the pending async save (if any) has been written, then mark it complete."""
        if self._pending is None:
            return
        self.wait_for_staging()
        pending, self._pending = self._pending, None
        try:
            pending.upload.result()  # re-raises a failed write: a checkpoint that failed must not be marked complete
        except (Exception, CheckpointException) as exc:
            raise _save_failed(pending.step, pending.path, exc) from exc
        pending.timings.verify_s = pending.planner.verify_s
        pending.timings.complete_s = time.monotonic() - pending.started
        self._finish(pending.step, pending.path, pending.started, pending.timings)

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self._stager is not None:
                self._stager.close()
                self._stager = None
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
        self.set_start_step(train_state.step)
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

    def _finish(self, step: int, path: Path, started: float, timings: SaveTimings) -> None:
        """Mark a written checkpoint complete and delete old ones (rank 0; the directory is shared)."""
        self.last_timings = timings
        self._saved_steps.add(step)
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
        write_atomic(path / MARKER_FILE, json.dumps(marker, indent=2, default=str) + "\n")
        log.info("checkpoint step %d complete: %s (%.2fs after the save began)", step, path,
                 time.monotonic() - started)
        self._prune()

    def _prune(self) -> None:
        """Keep the newest ``keep_last`` complete checkpoints of this run's own line: those it continued from
        (at or below its start step) and those it saved. Incomplete directories older than the newest of them
        are crash leftovers and go too; nothing newer is touched (a save may be writing it).

        A complete checkpoint past the start step that this run did not save is another run's: neither
        counted nor deleted, so keep_last never gives up what this run saved for it. (Comparing step numbers
        alone, a fresh run's step-2 went at once beside another run's step-200..300: issue 28.
        resume.claim_checkpoint_dir refuses such a start; this holds even when a run writes beside it.)"""
        assert self.root is not None
        dirs = step_dirs(self.root)

        def another_runs(step: int, path: Path) -> bool:
            return step > self._start_step and step not in self._saved_steps and is_complete(path)

        own = [(s, p) for s, p in dirs if is_complete(p) and not another_runs(s, p)]
        if not own:
            return
        keep = {p for _, p in own[-self.cfg.keep_last:]}
        newest_own_step = own[-1][0]
        for step, path in dirs:
            if path in keep or step > newest_own_step or another_runs(step, path):
                continue
            log.info("deleting old checkpoint %s", path)
            shutil.rmtree(path, ignore_errors=True)
