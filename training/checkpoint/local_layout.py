"""The on-disk layout of the local checkpoint tier, on each node's own fast storage; no torch.

One directory per rank's shard, whether this node's ranks saved it or it is the replica a partner node sent:

    <checkpoint.local_dir>/step-<N>/rank-<R>/     the state of global rank R after N steps
        .metadata, __0_0.distcp                   DCP, saved without a process group: one self-contained
                                                  checkpoint of R's own shards (its DTensors' local tensors)
        shard.json                                ours, written last: {"step", "rank", "world_size",
                                                  "layout": {"dp_replicate", "dp_shard", "tp"},
                                                  "same_state_as": [ranks], "files": {name: sha256},
                                                  "saved_at"}

A shard holds rank R's slices under the layout it was saved in (a DTensor's local tensor): the same rank
under another layout owns other slices, so a shard serves only a resume at its own layout (``layout`` in the
marker; a marker without one was written before layouts, by FSDP over every rank). Under HSDP the same slices
sit on one rank of each replica group: ``same_state_as`` names the ranks whose state, compared at the save
(``local_twins``), was this shard's bit for bit, so this directory serves their resume as well as R's.

A shard is written as ``rank-<R>.partial`` and renamed once its ``shard.json`` is in place, so a directory
named ``rank-<R>`` always holds a whole shard; whether its bytes are still the ones written is what
``verify_shard`` checks against the digests. A step counts only when every rank's shard exists, verified, on
some live node: that is decided across the job at a resume (``local_resume``), never by one node alone.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import os
import re
import shutil
import time
import warnings
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

from training.checkpoint.layout import step_dir, step_dirs, write_atomic

SHARD_MARKER = "shard.json"
PARTIAL_SUFFIX = ".partial"
_RANK_DIR = re.compile(r"^rank-(\d+)$")
_DIGEST_CHUNK = 16 << 20
DEGREES = ("dp_replicate", "dp_shard", "tp")  # the layout's names in a marker (training.parallel.layout)


@dataclass(frozen=True)
class ShardInfo:
    """What a shard says about itself (its ``shard.json``)."""

    step: int
    rank: int
    world_size: int
    files: dict[str, str]  # file name -> sha256 hex digest
    # the [parallel] degrees it was saved under (training.parallel.layout.Layout.settings()); None: FSDP over
    # world_size ranks (see layout_degrees)
    layout: dict[str, int] | None = None
    # other ranks whose state equalled this one's when it was saved (HSDP's replicas of the same slices)
    same_state_as: tuple[int, ...] = ()

    @property
    def serves(self) -> tuple[int, ...]:
        """The ranks a resume may load this shard into: its own and those of ``same_state_as``."""
        return tuple(sorted({self.rank, *self.same_state_as}))

    def to_json(self) -> str:
        return json.dumps({"step": self.step, "rank": self.rank, "world_size": self.world_size,
                           "layout": self.layout_degrees, "same_state_as": list(self.same_state_as),
                           "files": self.files,
                           "saved_at": time.strftime("%Y-%m-%dT%H:%M:%SZ", time.gmtime())},
                          indent=2, sort_keys=True) + "\n"

    @property
    def layout_degrees(self) -> dict[str, int]:
        """The degrees it was saved under; a marker of before layouts: FSDP over every rank."""
        return self.layout or fsdp_degrees(self.world_size)

    @classmethod
    def from_json(cls, text: str) -> ShardInfo:
        data = json.loads(text)
        files = data["files"]
        if not isinstance(files, dict) or not all(isinstance(k, str) and isinstance(v, str)
                                                  for k, v in files.items()):
            raise ValueError("files: not a mapping of names to digests")
        layout = data.get("layout")
        if layout is not None:
            layout = {name: int(layout[name]) for name in DEGREES}
        same = tuple(sorted(int(r) for r in data.get("same_state_as", [])))
        return cls(step=int(data["step"]), rank=int(data["rank"]), world_size=int(data["world_size"]),
                   files=dict(files), layout=layout, same_state_as=same)


def fsdp_degrees(world_size: int) -> dict[str, int]:
    """The degrees of plain FSDP over ``world_size`` ranks (the default layout)."""
    return {"dp_replicate": 1, "dp_shard": world_size, "tp": 1}


@contextlib.contextmanager
def single_process_dcp() -> Iterator[None]:
    """Around DCP calls with ``no_dist=True``: without this, DCP warns on every one that it assumes "the
    intent is to save in a single process", which is exactly the intent here."""
    with warnings.catch_warnings():
        warnings.filterwarnings("ignore", message=".*assuming the intent is to (save|load) in a single process")
        yield


def shard_dir(root: str | Path, step: int, rank: int) -> Path:
    return step_dir(root, step) / f"rank-{rank}"


def partial_dir(root: str | Path, step: int, rank: int) -> Path:
    path = shard_dir(root, step, rank)
    return path.with_name(path.name + PARTIAL_SUFFIX)


def file_digest(path: Path) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        while chunk := f.read(_DIGEST_CHUNK):
            digest.update(chunk)
    return digest.hexdigest()


def digest_files(directory: Path) -> dict[str, str]:
    """sha256 of every file DCP wrote into ``directory`` (not our marker)."""
    return {p.name: file_digest(p) for p in sorted(directory.iterdir())
            if p.is_file() and p.name != SHARD_MARKER}


def read_shard_info(path: Path) -> ShardInfo | None:
    """The shard's marker, or None when it has none or one that does not parse (not a shard)."""
    try:
        return ShardInfo.from_json((path / SHARD_MARKER).read_text())
    except (OSError, ValueError, KeyError, TypeError):
        return None


def verify_shard(path: Path, expected: ShardInfo) -> str | None:
    """Why the shard at ``path`` is not the one its marker describes, or None when every file is there with
    its digest and nothing else is."""
    present = {p.name for p in path.iterdir() if p.is_file() and p.name != SHARD_MARKER} if path.is_dir() else set()
    if present != set(expected.files):
        missing = sorted(set(expected.files) - present)
        extra = sorted(present - set(expected.files))
        return f"{path}: files differ from its marker (missing {missing}, unexpected {extra})"
    for name, digest in sorted(expected.files.items()):
        try:
            if file_digest(path / name) != digest:
                return f"{path / name}: sha256 differs from its marker"
        except OSError as exc:
            return f"{path / name}: unreadable: {exc}"
    return None


def write_shard_marker(directory: Path, info: ShardInfo) -> None:
    write_atomic(directory / SHARD_MARKER, info.to_json())


def publish(partial: Path, final: Path) -> None:
    """Make a written shard visible under its final name (replacing an older copy of the same shard)."""
    if final.exists():
        shutil.rmtree(final)
    os.replace(partial, final)


def inventory(root: str | Path) -> dict[int, dict[int, ShardInfo]]:
    """{step: {rank: marker}} of every shard under ``root`` whose marker names the step and rank its place
    does (a shard in the wrong place is not this step's). No digests are read here."""
    found: dict[int, dict[int, ShardInfo]] = {}
    for step, path in step_dirs(Path(root)):
        for child in sorted(path.iterdir()) if path.is_dir() else []:
            match = _RANK_DIR.fullmatch(child.name)
            if not match or not child.is_dir():
                continue
            info = read_shard_info(child)
            if info is not None and (info.step, info.rank) == (step, int(match.group(1))):
                found.setdefault(step, {})[info.rank] = info
    return found


def remove_steps(root: str | Path, keep: set[int], *, newer_than: int | None = None,
                 older_than: int | None = None) -> list[int]:
    """Delete step directories under ``root`` not in ``keep`` that are newer than ``newer_than`` or older than
    ``older_than``; returns the steps deleted."""
    removed = []
    for step, path in step_dirs(Path(root)):
        if step in keep:
            continue
        if (newer_than is not None and step > newer_than) or (older_than is not None and step < older_than):
            shutil.rmtree(path, ignore_errors=True)
            removed.append(step)
    return removed
