"""A warm torch.compile at every restart: Inductor's compiled artifacts (its FX graph and AOTAutograd caches, as
torch.compiler's portable cache artifacts) kept in the job's checkpoint directory, which every node of the job
sees (FSx), under a key of what invalidates them.

The first start compiles cold, and rank 0 saves the artifacts after its first step (a start that is later killed
has saved them already). A restart, on a spare too, loads them before its first step, so its compile finds the
graphs in Inductor's local caches. A missing file is a cold compile; an unreadable, stale or corrupt one is
ignored with a warning (and replaced after the cold compile): never a failed start.

<checkpoint.dir>/compile-cache/<key>/artifacts.bin, the key a hash of torch's version, the Python and machine,
the model, parallel and fp8 sections, the sequence length, the micro-batch size and the world size.
"""

from __future__ import annotations

import hashlib
import json
import logging
import os
import platform
import sys
from pathlib import Path

import torch

from training.config import TrainConfig

log = logging.getLogger(__name__)

CACHE_DIR = "compile-cache"  # in checkpoint.dir
ARTIFACTS = "artifacts.bin"


def cache_key(cfg: TrainConfig, world_size: int) -> str:
    """What a compiled graph depends on: another value of any of these compiles other graphs."""
    sections = cfg.to_dict()
    parts = {"torch": torch.__version__, "python": list(sys.version_info[:2]), "machine": platform.machine(),
             "model": sections["model"], "parallel": sections["parallel"], "fp8": sections["fp8"],
             "seq_len": cfg.run.seq_len, "micro_batch_size": cfg.run.micro_batch_size, "world_size": world_size}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def artifacts_path(cfg: TrainConfig, world_size: int) -> Path | None:
    """Where this run's artifacts live; None without torch.compile or without a checkpoint directory."""
    if not cfg.parallel.compile or not cfg.checkpoint.dir:
        return None
    return Path(cfg.checkpoint.dir) / CACHE_DIR / cache_key(cfg, world_size) / ARTIFACTS


def load_compile_cache(path: Path | None) -> bool:
    """Whether artifacts were loaded into Inductor's local caches (before the first compile)."""
    if path is None or not path.is_file():
        return False
    try:
        info = torch.compiler.load_cache_artifacts(path.read_bytes())
    except Exception as e:  # noqa: BLE001 - whatever a corrupt or foreign file raises: compile cold instead
        log.warning("compile cache %s not used (%s: %s): compiling cold", path, type(e).__name__, e)
        return False
    if info is None:
        log.warning("compile cache %s not used (torch read no artifacts from it): compiling cold", path)
        return False
    log.info("compile cache loaded from %s", path)
    return True


def save_compile_cache(path: Path | None) -> bool:
    """After the first step compiled cold (forward and backward): the artifacts to `path`, atomically (a reader
    sees the old file or the new one). A failed write is a warning: the run goes on."""
    if path is None:
        return False
    saved = torch.compiler.save_cache_artifacts()
    if saved is None:
        return False
    data, _ = saved
    tmp = path.with_name(f"{path.name}.tmp-{os.getpid()}")
    try:
        path.parent.mkdir(parents=True, exist_ok=True)
        tmp.write_bytes(data)
        os.replace(tmp, path)
    except OSError as e:
        log.warning("compile cache not saved to %s: %s", path, e)
        return False
    log.info("compile cache saved to %s (%d bytes)", path, len(data))
    return True
