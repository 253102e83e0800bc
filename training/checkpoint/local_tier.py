"""The local checkpoint tier: frequent saves of each rank's shard to its node's own storage, replicated to the
next node, so that a restart after a lost node loses at most ``checkpoint.local_interval_steps`` steps and
reads nothing from the shared file system.

Every ``checkpoint.local_interval_steps`` the loop hands the state to ``LocalCheckpointer.save``:

1. the state is built as for a durable save (``state.build_state``: FP8 wrappers unwrapped, TE's extra
   state as bytes) and reduced to this rank's own part (``localize``: each DTensor's local tensor), then
   copied to CPU memory beside the loop by a ``staging.BackgroundStager`` of its own (the loop waits for the
   copy only before its next ``optimizer.step()``, as for async durable saves);
2. on the tier's writer thread: verified against the live state's description (``verify``: same entries,
   dtypes, shapes and bits, all finite), written with DCP without a process group as one self-contained
   checkpoint per rank, its files' sha256 recorded in its marker (``local_layout``);
3. sent to the same local rank of the next node (rank + ranks per node, around the ring), which checks the
   digests before it publishes the replica (``shard_transfer.exchange``); one node: no replica. Under HSDP
   a rank whose twin in another replica group, on another node, saved the same state (compared at each
   save: ``local_twins``) sends none: the twin's own shard is the copy, and its marker says whose state it
   also is;
4. the ranks agree (one all-reduce) that every shard and every replica of the step is in place; only then
   does the step count, and the newest ``checkpoint.local_keep`` counted steps are kept on every node.

Everything collective runs on a gloo group of its own, from the writer thread, in the same order on every
rank. A failed local save costs only that step's local copy: it is logged and training goes on (the durable
tier stays the source of truth); a failure of the group itself turns the tier off for the rest of the run.

What it does not cover: a loss of two neighbouring nodes before the next step counts (the replica of one sits
on the other; the durable tier is used then), a resume at another world size or layout (a shard is one
rank's slices under one layout: such a resume uses the durable tier, which DCP reshards; the marker records
the layout and the resume says why it passes the step over), and host memory: its staging buffers are a second
copy of this rank's state in CPU memory, beside the durable tier's.
"""

from __future__ import annotations

import logging
import shutil
import time
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.tensor import DTensor

from training.checkpoint.local_layout import (
    ShardInfo,
    digest_files,
    fsdp_degrees,
    partial_dir,
    publish,
    remove_steps,
    shard_dir,
    single_process_dcp,
    write_shard_marker,
)
from training.checkpoint.local_twins import content_key, held_elsewhere, same_state
from training.checkpoint.shard_transfer import exchange
from training.checkpoint.staging import BackgroundStager, staging_api_available, use_pinned_memory
from training.checkpoint.state import build_state
from training.checkpoint.verify import EntrySpec, VerifyingSavePlanner, describe
from training.config.sections import CheckpointConfig

log = logging.getLogger("training.checkpoint")


def localize(tree: Any) -> Any:
    """``tree`` with every DTensor replaced by its local tensor (the same storage): this rank's own part."""
    if isinstance(tree, dict):
        return {k: localize(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [localize(v) for v in tree]
    if isinstance(tree, DTensor):
        return tree._local_tensor
    return tree


def merge_loaded(state: Any, loaded: Any) -> Any:
    """``state`` with the non-tensor values of ``loaded`` (its localized form after ``dcp.load``): tensors
    were loaded in place, plain values (hyperparameters, TE's extra-state bytes) were replaced in the dict."""
    if isinstance(state, dict):
        return {k: merge_loaded(v, loaded[k]) for k, v in state.items()}
    if isinstance(state, list):
        return [merge_loaded(v, w) for v, w in zip(state, loaded, strict=True)]
    if isinstance(state, torch.Tensor):
        return state
    return loaded


@dataclass(frozen=True)
class _Written:
    """A shard written but not yet published: its ``.partial`` directory, its files' digests, its content key."""

    partial: Path
    files: dict[str, str]
    key: str


class _InlineCopy:
    """Staging for a torch without DCP's staging API: describe and copy on the loop's thread."""

    def __init__(self, state: Any) -> None:
        self.description: Future[dict[str, EntrySpec]] = Future()
        self.staged: Future[Any] = Future()
        self.description.set_result(describe(state, fingerprints=True))
        self.staged.set_result(_to_cpu(state))


def _to_cpu(tree: Any) -> Any:
    if isinstance(tree, dict):
        return {k: _to_cpu(v) for k, v in tree.items()}
    if isinstance(tree, list):
        return [_to_cpu(v) for v in tree]
    if isinstance(tree, torch.Tensor):
        return tree.detach().to("cpu", copy=True)
    return tree


class LocalCheckpointer:
    """The local tier of one training run, on every rank; collective like the Checkpointer (every rank calls
    ``save`` at the same steps). ``enabled`` is False without ``checkpoint.local_dir`` or an interval."""

    def __init__(self, cfg: CheckpointConfig, *, rank: int, world_size: int, local_world_size: int,
                 device: torch.device, layout: dict[str, int] | None = None) -> None:
        self.cfg = cfg
        self.rank = rank
        self.world_size = world_size
        # the run's [parallel] degrees (Layout.settings()), recorded in every shard's marker; None: FSDP
        self.layout = dict(layout) if layout else fsdp_degrees(world_size)
        self.local_world_size = local_world_size
        self.root = Path(cfg.local_dir) if cfg.local_tier else None
        self.counted: list[int] = []  # steps complete on every rank in this run (or the one resumed from)
        # of the newest local save, seconds: the loop held to build the state (build_s) and to wait for its copy
        # (waited_s, before the next optimizer step), until this rank's shard was written, until the step counted
        self.last_timings: dict[str, float] = {}
        self._pending: Future[bool] | None = None
        self._staging: Any = None
        self._last_step: int | None = None
        self._said_twins = False  # the line that says how many shards needed no replica: once a run
        self.group = None
        self._stager: BackgroundStager | None = None
        self._writer: ThreadPoolExecutor | None = None
        nodes = world_size // local_world_size
        # the ring of replicas: this rank's shard goes to the same local rank of the next node (none on one node)
        self.replica_to = (rank + local_world_size) % world_size if nodes > 1 else None
        self.replica_from = (rank - local_world_size) % world_size if nodes > 1 else None
        if self.root is None:
            if cfg.local_interval_steps > 0 and rank == 0:
                log.warning("checkpoint.local_interval_steps=%d but checkpoint.local_dir is '': no local tier "
                            "(the jobs launcher sets it on the cluster; elsewhere set it to node-local storage)",
                            cfg.local_interval_steps)
            return
        if dist.is_initialized():
            self.group = dist.new_group(backend="gloo")
        if staging_api_available():
            mode = "auto" if cfg.staging == "inline" else cfg.staging
            self._stager = BackgroundStager(device=device, pinned=use_pinned_memory(mode, device))
        self._writer = ThreadPoolExecutor(max_workers=1, thread_name_prefix="local-checkpoint")
        if nodes == 1 and rank == 0:
            log.warning("checkpoint.local_dir: one node, so no replica: the local tier serves a restart on this "
                        "node only")

    @property
    def enabled(self) -> bool:
        return self.root is not None

    def should_save(self, step: int) -> bool:
        return self.root is not None and step % self.cfg.local_interval_steps == 0

    def save(self, step: int, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
        """Stage the state after ``step`` steps and write it in the background; the caller calls
        ``wait_for_staging`` before it changes the state."""
        if self.root is None or step == self._last_step:
            return
        self.wait()
        if self.root is None:  # the previous save turned the tier off
            return
        began = time.monotonic()
        state = localize(build_state(model, optimizer))
        staging = self._stager.job() if self._stager is not None else None
        if staging is not None:
            staging.stage(state)
        else:
            staging = _InlineCopy(state)
        self._staging = staging
        self._last_step = step
        self.last_timings = {"build_s": time.monotonic() - began}
        assert self._writer is not None
        self._pending = self._writer.submit(self._write, step, staging, began)

    def wait_for_staging(self) -> None:
        staging, self._staging = self._staging, None
        if staging is not None and staging.staged is not None:
            began = time.monotonic()
            staging.staged.result()
            self.last_timings["waited_s"] = time.monotonic() - began

    def wait(self) -> None:
        """Wait for the save in flight; a failure of the tier's group turns the tier off (logged)."""
        pending, self._pending = self._pending, None
        if pending is None:
            return
        self.wait_for_staging()
        try:
            pending.result()
        except Exception as exc:
            log.error("local checkpoint tier off for the rest of this run: %s: %s", type(exc).__name__, exc)
            self.root = None

    def close(self) -> None:
        try:
            self.wait()
        finally:
            if self._writer is not None:
                self._writer.shutdown(wait=True)
                self._writer = None
            if self._stager is not None:
                self._stager.close()
                self._stager = None
            if self.group is not None:
                dist.destroy_process_group(self.group)
                self.group = None

    def abandon(self) -> None:
        """On the way out of a failed run: stop without waiting (the writer may wait on a rank that is gone);
        what it leaves is a ``.partial`` directory or a step never counted."""
        if self._writer is not None:
            self._writer.shutdown(wait=False, cancel_futures=True)
            self._writer = None
        self._pending = self._staging = None

    def count(self, step: int) -> None:
        """Record ``step`` as complete on every rank (a resume from it) and prune what is older than the
        newest ``local_keep`` counted steps."""
        self.counted = sorted({*(s for s in self.counted if s < step), step})[-self.cfg.local_keep:]
        if self.root is not None and self.rank % self.local_world_size == 0:  # one rank per node prunes
            removed = remove_steps(self.root, set(self.counted), older_than=min(self.counted))
            if removed:
                log.info("local checkpoint: deleted steps %s on this node", removed)

    def _write(self, step: int, staging: Any, began: float) -> bool:
        assert self.root is not None
        written = own = None
        try:
            written = self._write_files(step, staging)
        except Exception as exc:  # this step's local copy is lost, not the run: the others learn it below
            log.warning("local checkpoint step %d: rank %d's shard not saved: %s: %s", step, self.rank,
                        type(exc).__name__, exc)
        twins, elsewhere = self._twins(written.key if written is not None else None)
        if written is not None:
            try:
                own = self._publish_own(step, written, twins)
            except OSError as exc:
                log.warning("local checkpoint step %d: rank %d's shard not published: %s", step, self.rank, exc)
        written_at = time.monotonic()
        replica_ok = True
        if self.replica_to is not None and self.replica_from is not None:
            # no replica for a rank whose twin on another node saved the same state (local_twins), and none
            # expected from a peer that has such a twin
            dst = None if elsewhere[self.rank] else self.replica_to
            src = None if elsewhere[self.replica_from] else self.replica_from
            if dst is not None or src is not None:
                received = exchange(self.group, own=own, dst=dst, src=src, root=self.root)
                replica_ok = src is None or received is not None
        ok = self.agree(own is not None and replica_ok)
        self.last_timings.update(written_s=written_at - began, counted_s=time.monotonic() - began)
        if ok:
            self.count(step)
            if self.rank == 0:
                log.info("local checkpoint step %d complete on every rank (%.2fs after the save began; building "
                         "the state held the loop %.2fs, rank 0's shard was written after %.2fs)", step,
                         self.last_timings["counted_s"], self.last_timings["build_s"], self.last_timings["written_s"])
                if any(elsewhere) and not self._said_twins:
                    self._said_twins = True
                    log.info("local checkpoint: %d of %d shards sent to no other node: a replica group on another "
                             "node saved the same state (HSDP)", sum(elsewhere), self.world_size)
        elif self.rank == 0:
            log.warning("local checkpoint step %d is incomplete (a shard or a replica failed): not counted", step)
        return ok

    def _write_files(self, step: int, staging: Any) -> _Written:
        """This rank's shard written into its ``.partial`` directory, not yet published."""
        assert self.root is not None
        staged = staging.staged.result()
        description = staging.description.result()  # a failed staging fails here: nothing is written
        partial = partial_dir(self.root, step, self.rank)
        if partial.exists():
            shutil.rmtree(partial)
        partial.mkdir(parents=True)
        with single_process_dcp():
            dcp.save(staged, checkpoint_id=str(partial), planner=VerifyingSavePlanner(description), no_dist=True)
        files = digest_files(partial)
        return _Written(partial, files, content_key(files, repr(sorted(description.items()))))

    def _twins(self, key: str | None) -> tuple[tuple[int, ...], list[bool]]:
        """The ranks whose state equals this rank's, and for each rank whether such a twin is on another node
        (local_twins); one node: none (there is no other node). Collective on several nodes."""
        if self.replica_to is None or self.group is None:
            return (), [False] * self.world_size
        keys: list[str | None] = [None] * self.world_size
        dist.all_gather_object(keys, key, group=self.group)
        return same_state(keys)[self.rank], held_elsewhere(keys, self.local_world_size)

    def _publish_own(self, step: int, written: _Written, twins: tuple[int, ...]) -> Path:
        assert self.root is not None
        write_shard_marker(written.partial, ShardInfo(step=step, rank=self.rank, world_size=self.world_size,
                                                      files=written.files, layout=self.layout, same_state_as=twins))
        final = shard_dir(self.root, step, self.rank)
        publish(written.partial, final)
        return final

    def agree(self, ok: bool) -> bool:
        if self.group is None:
            return ok
        flag = torch.tensor([1 if ok else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MIN, group=self.group)
        return bool(flag.item())
