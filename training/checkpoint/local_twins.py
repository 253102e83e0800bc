"""Copies the layout already holds, for the local checkpoint tier (``local_tier``); no torch.

Under HSDP the rank at one place of a replica group and the ranks at the same place of the other replica
groups hold the same parameter and optimizer slices, updated by the same all-reduced gradients. Where such a
twin sits on another node, its own local save is already a copy of the rank's state off the rank's node: the
tier then sends the rank's shard to no other node (the ring replica is for the ranks without such a twin), and
a resume after the node's loss loads the rank from its twin's shard (``ShardInfo.same_state_as``).

Which ranks are twins is compared at every save, not inferred from the mesh: each rank's content key (below)
is gathered, and ranks with equal keys hold the same state bit for bit. So a replica whose state drifted (a
reduction that is not bitwise the same on every replica) is nobody's twin and gets its ring replica, as
under FSDP, and a layout without replicas (FSDP, TP) has no twins at all.

The key leaves DCP's ``.metadata`` out: it records the save's own directory and a random save id, so it
differs between twins whatever their state. What it describes (which entry sits where in the data file,
with which dtype and shape) is fixed by the state's description and the data files, which the key covers.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence

DCP_METADATA = ".metadata"  # DCP's own file in a shard: per save, see above


def content_key(files: dict[str, str], description: str) -> str:
    """The sha256 of a shard's state: its data files' digests (``files``: name -> sha256, as in its marker)
    and the description of the state it was saved from (entries, dtypes, shapes, fingerprints)."""
    digest = hashlib.sha256(description.encode())
    for name, file_digest in sorted(files.items()):
        if name != DCP_METADATA:
            digest.update(f"\0{name}\0{file_digest}".encode())
    return digest.hexdigest()


def same_state(keys: Sequence[str | None]) -> list[tuple[int, ...]]:
    """For each rank (its index in ``keys``), the other ranks whose key equals its own; none for a rank
    whose key is None (its save failed)."""
    by_key: dict[str, list[int]] = {}
    for rank, key in enumerate(keys):
        if key is not None:
            by_key.setdefault(key, []).append(rank)
    return [tuple(r for r in by_key[key] if r != rank) if key is not None else ()
            for rank, key in enumerate(keys)]


def held_elsewhere(keys: Sequence[str | None], ranks_per_node: int) -> list[bool]:
    """For each rank, whether a twin on another node (torchrun numbers ranks node by node) saved the same
    state: then a copy of the rank's state is already off its node, and the ring sends it none."""
    twins = same_state(keys)
    return [any(t // ranks_per_node != rank // ranks_per_node for t in twins[rank]) for rank in range(len(keys))]
