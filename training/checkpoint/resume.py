"""Which checkpoint a run starts from: ``--resume`` (``resolve_resume``) and ``--resume-from-dir``
(``resume_with_fallback``).

A job saves to, and ``--resume auto`` loads from, its own checkpoint.dir only: the launcher gives every job a
directory of its own (/fsx/checkpoints/<job id>). Loading a checkpoint runs DCP's unpickling of its
``.metadata``, so a directory another job or the checkpoint bucket filled is read only on request:
``clusterctl submit --resume-from JOB`` becomes ``--resume-from-dir /fsx/checkpoints/JOB`` here.
"""

from __future__ import annotations

import logging
from pathlib import Path

from training.checkpoint.layout import DCP_METADATA_FILE, MARKER_FILE, find_latest_complete, is_complete
from training.errors import ConfigError

log = logging.getLogger("training.checkpoint")  # the package's logger (layout.py)


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


def resume_with_fallback(resume: str, checkpoint_dir: str, other_dir: str | None) -> str:
    """The --resume value to train with. With ``other_dir``: the job's own newest complete checkpoint when it
    has one (a restart of this job continues its own run), else the newest complete one in ``other_dir``.
    Train.train still agrees on rank 0's choice, so every rank loads the same step."""
    if not other_dir:
        return resume
    if resume != "auto":
        raise ConfigError(f"--resume-from-dir={other_dir!r}: allowed only with --resume auto (got {resume!r})")
    if checkpoint_dir and find_latest_complete(checkpoint_dir) is not None:
        return "auto"
    latest = find_latest_complete(other_dir)
    if latest is None:
        raise ConfigError(
            f"--resume-from-dir={other_dir!r}: no complete checkpoint (step-<N> with .metadata and "
            "train_state.json) there; allowed: the checkpoint directory of a job that saved one"
        )
    log.info("starting from another job's checkpoint %s (saves go to %s)", latest, checkpoint_dir)
    return str(latest)
