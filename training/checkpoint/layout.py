"""The on-disk layout of the durable checkpoints: which directory holds which step, and when one counts.

One directory per save; every rank writes its own shards, rank 0 the metadata and the marker:

    <checkpoint.dir>/step-<N>/          N = optimizer steps completed when it was taken
        __<rank>_<i>.distcp             DCP shards of the model and optimizer state (sharded like FSDP2)
        .metadata                       written by DCP on rank 0 after every rank's shards are written
        train_state.json                ours, written last: {"step": N, "world_size", "saved_at", "config"}

A checkpoint counts only when complete: ``.metadata`` (DCP's own last write) and ``train_state.json``
(written after the save returned, for async saves after its future resolved) both exist. A crash at any point
of a save leaves a directory without the marker, which ``find_latest_complete`` skips with a warning. The data
position is not saved: the batch order is a pure function of (seed, step, rank), so the step is all a resume
needs.

This module only reads and names paths (and writes a file atomically); it imports no torch, so whatever
chooses a checkpoint (``checkpoint.resume``) or writes one (``checkpoint.checkpointer``) shares these rules.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

log = logging.getLogger("training.checkpoint")  # the package's logger: its lines read as before the split

MARKER_FILE = "train_state.json"
DCP_METADATA_FILE = ".metadata"
_STEP_DIR = re.compile(r"^step-(\d+)$")


@dataclass(frozen=True)
class TrainState:
    """What a checkpoint says about itself (its ``train_state.json``)."""

    step: int  # optimizer steps completed; training resumes at this step
    path: Path
    # the TrainConfig.to_dict() of the run that saved it ({} in a marker without one): what a resume compares
    config: dict[str, Any] = field(default_factory=dict, compare=False)


def step_dir(root: str | Path, step: int) -> Path:
    return Path(root) / f"step-{step}"


def is_complete(path: str | Path) -> bool:
    path = Path(path)
    return (path / DCP_METADATA_FILE).is_file() and (path / MARKER_FILE).is_file()


def step_dirs(root: Path) -> list[tuple[int, Path]]:
    """``(step, path)`` of every step-<N> directory under ``root``, oldest first."""
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir() if p.is_dir() and (m := _STEP_DIR.fullmatch(p.name))]
    return sorted(found)


def find_latest_complete(root: str | Path) -> Path | None:
    """The newest complete checkpoint under ``root``; logs a warning for each incomplete one it skips."""
    for step, path in reversed(step_dirs(Path(root))):
        if is_complete(path):
            return path
        missing = [f for f in (DCP_METADATA_FILE, MARKER_FILE) if not (path / f).is_file()]
        log.warning("skipping incomplete checkpoint %s (step %d): missing %s", path, step, ", ".join(missing))
    return None


def read_train_state(path: str | Path) -> TrainState:
    path = Path(path)
    data = json.loads((path / MARKER_FILE).read_text())
    config = data.get("config")
    return TrainState(step=int(data["step"]), path=path, config=config if isinstance(config, dict) else {})


def write_atomic(path: Path, text: str) -> None:
    """Write ``text`` to ``path`` so that a reader sees the old file or the whole new one, never a part."""
    tmp = path.with_name(path.name + ".tmp")
    with open(tmp, "w") as f:
        f.write(text)
        f.flush()
        os.fsync(f.fileno())
    os.replace(tmp, path)
