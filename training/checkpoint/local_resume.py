"""A resume from the local tier (``local_tier``): which step, where each rank's shard comes from, the load.

At a start with ``--resume auto`` every rank takes part, over the tier's gloo group:

1. each rank lists the shards its node holds (``local_layout.inventory``: markers only) and the lists are
   gathered: a step is a candidate when, at the world size and layout of this run, every rank's shard is held
   by some node and it is no older than the newest durable checkpoint (a newer step saved under another
   layout is passed over in one line: its shards are other slices) (at a tie the local tier wins: nothing to read
   from the shared file system);
2. for the newest candidate, the ranks of each node verify that node's copies (every file's sha256 against
   its marker, the node's shards split among its ranks) and the results are gathered: a shard counts only
   where a copy passed. A step with any rank's shard missing everywhere, or only damaged, is passed over for
   the next older one;
3. a rank whose node holds no verified copy of its shard gets one from a node that does (the lost node's
   ranks from their replica, or under HSDP from their twin's own shard, which holds the same state
   (``ShardInfo.same_state_as``; its node then receives it under the twin's name and loads it from there),
   or every shard when torchrun numbered the nodes anew), one transfer at a time in
   an order every rank computed alike (``shard_transfer.send_shard`` / ``receive_shard``); the receiver checks
   the digests again before it publishes the copy on its own node;
4. the ranks agree that every fetch arrived whole; then each loads its own shard from its own node with DCP.

No candidate (or none that passes): ``None``, and the run resumes from the durable tier as before.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn

from training.checkpoint.local_layout import inventory, remove_steps, shard_dir, single_process_dcp, verify_shard
from training.checkpoint.local_tier import LocalCheckpointer, localize, merge_loaded
from training.checkpoint.shard_transfer import receive_shard, send_shard
from training.checkpoint.state import build_state, load_into

log = logging.getLogger("training.checkpoint")


@dataclass(frozen=True)
class LocalResume:
    """The local step every rank agreed to resume from."""

    step: int
    path: Path  # this rank's shard, on its own node (after a fetch, the copy it received; maybe a twin's)
    fetched: int  # shards every rank together fetched from another node


@dataclass(frozen=True)
class _Copies:
    """Where the shards of one step are: {rank: (node, shard directory's rank) of each copy that serves it}
    (a rank's own shard, or under HSDP a twin's with the same state)."""

    step: int
    copies_of: dict[int, set[tuple[int, int]]]


def choose_local_resume(local: LocalCheckpointer, *, not_older_than: int) -> LocalResume | None:
    """The newest local step complete across the live nodes and no older than ``not_older_than``, with every
    rank's shard on its own node; None when there is none. Collective over the tier's group."""
    if local.root is None:
        return None
    world, per_node = local.world_size, local.local_world_size
    node = local.rank // per_node
    held = inventory(local.root)
    # {step: {shard directory's rank: the ranks it serves}} of this node's shards at this run's layout
    mine = {step: {r: info.serves for r, info in shards.items()
                   if info.world_size == world and info.layout_degrees == local.layout}
            for step, shards in held.items()}
    _say_other_layouts(local, held, not_older_than)
    serves: dict[int, dict[tuple[int, int], tuple[int, ...]]] = {}  # {step: {(node, directory): ranks}}
    for their_node, steps in _all_gather(local, (node, mine)):
        for step, dirs in steps.items():
            for r, ranks in dirs.items():
                serves.setdefault(step, {})[(their_node, r)] = ranks
    candidates = sorted((s for s, dirs in serves.items()
                         if s >= not_older_than and len({r for ranks in dirs.values() for r in ranks}) == world),
                        reverse=True)
    for step in candidates:
        verified = _verify_step(local, step, node, sorted(mine.get(step, {})), held, serves[step])
        missing = [r for r in range(world) if not verified.copies_of.get(r)]
        if missing:
            if local.rank == 0:
                log.warning("local checkpoint step %d: no verified copy of the shards of ranks %s on a live node; "
                            "trying an older step", step, missing)
            continue
        fetched = _fetch(local, verified)
        if fetched is None:
            if local.rank == 0:
                log.warning("local checkpoint step %d: a shard fetched from another node could not be kept "
                            "(damaged, or not written); trying an older step", step)
            continue
        count, directory = fetched
        return LocalResume(step=step, path=shard_dir(local.root, step, directory), fetched=count)
    return None


def _say_other_layouts(local: LocalCheckpointer, held: dict, not_older_than: int) -> None:
    """One line (rank 0) for the newest step this node holds at this world size under another layout."""
    other = [(step, info.layout_degrees) for step, shards in held.items() if step >= not_older_than
             for info in shards.values() if info.world_size == local.world_size
             and info.layout_degrees != local.layout]
    if other and local.rank == 0:
        step, degrees = max(other, key=lambda item: item[0])
        log.warning("local checkpoint step %d: saved under parallel %s, this run is %s: not used (a shard holds "
                    "one layout's slices; the durable tier reshards)", step, _degrees_text(degrees),
                    _degrees_text(local.layout))


def _degrees_text(degrees: dict[str, int]) -> str:
    return " ".join(f"{name}={value}" for name, value in degrees.items())


def load_local(choice: LocalResume, model: nn.Module, optimizer: torch.optim.Optimizer) -> None:
    """Load this rank's shard of the chosen step into the (already sharded) model and optimizer."""
    state = build_state(model, optimizer)  # shares storage with the model: the local tensors load in place
    own = localize(state)
    with single_process_dcp():
        dcp.load(own, checkpoint_id=str(choice.path), no_dist=True)
    load_into(model, optimizer, merge_loaded(state, own))


def keep_only(local: LocalCheckpointer, step: int | None) -> None:
    """After the resume decision: every local step but the one resumed from goes (older ones are superseded,
    newer ones incomplete); the resumed one counts, so it is kept until newer ones do."""
    if local.root is None:
        return
    if local.rank % local.local_world_size == 0:
        removed = remove_steps(local.root, {step} if step is not None else set(), newer_than=-1)
        if removed:
            log.info("local checkpoint: deleted steps %s on this node (not the one resumed from)", removed)
    if step is not None:
        local.counted = [step]
    if local.group is not None:
        dist.barrier(group=local.group)  # no rank saves into a directory another is deleting


def _all_gather(local: LocalCheckpointer, value: object) -> list:
    if local.group is None:
        return [value]
    out: list = [None] * local.world_size
    dist.all_gather_object(out, value, group=local.group)
    return out


def _verify_step(local: LocalCheckpointer, step: int, node: int, present: list[int], held: dict,
                 serves: dict[tuple[int, int], tuple[int, ...]]) -> _Copies:
    """Each node's copies of ``step``, checked by that node's ranks (a share each), gathered; ``serves``: the
    ranks each (node, directory) serves (every rank gathered the same)."""
    assert local.root is not None
    share = [r for i, r in enumerate(present) if i % local.local_world_size == local.rank % local.local_world_size]
    passed = []
    for r in share:
        problem = verify_shard(shard_dir(local.root, step, r), held[step][r])
        if problem is None:
            passed.append(r)
        else:
            log.warning("local checkpoint step %d: the copy of rank %d's shard on this node failed verification: "
                        "%s", step, r, problem)
    copies_of: dict[int, set[tuple[int, int]]] = {}
    for their_node, directories in _all_gather(local, (node, passed)):
        for d in directories:
            for r in serves[(their_node, d)]:
                copies_of.setdefault(r, set()).add((their_node, d))
    return _Copies(step, copies_of)


def plan_fetches(copies_of: dict[int, set[tuple[int, int]]], *, world_size: int,
                 ranks_per_node: int) -> tuple[list[tuple[int, int, int]], list[int]]:
    """The transfers that give each rank a copy on its own node, and the shard directory each rank loads.

    ``copies_of``: {rank: (node, directory's rank) of each verified copy serving it}. A transfer is (the rank
    that receives, the rank that sends, the directory's rank), in one order every rank computes alike: a
    rank's own shard is preferred to a twin's, a lower node to a higher; a directory one rank of a node is
    receiving is not sent to that node twice."""
    transfers: list[tuple[int, int, int]] = []
    loads: list[int] = []
    arriving: set[tuple[int, int]] = set()  # (node, directory) a transfer already brings
    for r in range(world_size):
        node = r // ranks_per_node
        ranked = sorted(copies_of[r], key=lambda copy: (copy[1] != r, copy))  # own shard first, then by node
        here = [d for n, d in ranked if n == node] + [d for n, d in sorted(arriving) if n == node and
                                                      any(c[1] == d for c in copies_of[r])]
        if here:
            loads.append(here[0])
            continue
        source_node, directory = ranked[0]
        transfers.append((r, source_node * ranks_per_node + r % ranks_per_node, directory))
        arriving.add((node, directory))
        loads.append(directory)
    return transfers, loads


def _fetch(local: LocalCheckpointer, copies: _Copies) -> tuple[int, int] | None:
    """Bring each rank a verified copy of its shard on its own node; the number of shards moved and the shard
    directory this rank loads, or None (on every rank) when one could not be kept."""
    assert local.root is not None
    transfers, loads = plan_fetches(copies.copies_of, world_size=local.world_size,
                                    ranks_per_node=local.local_world_size)
    ok = True
    for needed_by, sender, directory in transfers:
        if local.rank == sender:
            send_shard(local.group, shard_dir(local.root, copies.step, directory), needed_by)
        elif local.rank == needed_by:
            ok = receive_shard(local.group, sender, local.root) is not None and ok
    if transfers and local.rank == 0:
        log.info("local checkpoint step %d: %d shard(s) fetched from another node: %s", copies.step,
                 len(transfers), ", ".join(f"rank {r} from rank {s}" + (
                     f" (rank {d}'s shard: the same state)" if d != r else "") for r, s, d in transfers))
    return (len(transfers), loads[local.rank]) if local.agree(ok) else None
