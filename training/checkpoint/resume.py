"""Which checkpoint a run starts from: ``--resume`` (``resolve_resume``) and ``--resume-from-dir``
(``resume_with_fallback``).

A job saves to, and ``--resume auto`` loads from, its own checkpoint.dir only: the launcher gives every job a
directory of its own (/fsx/checkpoints/<job id>). Loading a checkpoint runs DCP's unpickling of its
``.metadata``, so a directory another job or the checkpoint bucket filled is read only on request:
``clusterctl submit --resume-from JOB`` becomes ``--resume-from-dir /fsx/checkpoints/JOB`` here.

A run that does not continue the newest checkpoint of its checkpoint.dir (``--resume none``, or a PATH at an
older step) would leave the newer ones there: ``keep_last`` would then weigh them against the run's own saves,
and a later ``--resume auto`` would pick them up. ``claim_checkpoint_dir`` refuses such a start unless told to
overwrite (``--overwrite-checkpoints``), and then deletes them first. The jobs launcher never meets it: a job's
first attempt starts in a new, empty /fsx/checkpoints/<job id> and every attempt runs ``--resume auto``.
"""

from __future__ import annotations

import logging
import shutil
from pathlib import Path

import torch.distributed as dist

from training.checkpoint.compat import check_resumable
from training.checkpoint.layout import (
    DCP_METADATA_FILE,
    MARKER_FILE,
    find_latest_complete,
    is_complete,
    read_train_state,
    step_dirs,
)
from training.config import TrainConfig
from training.errors import ConfigError

log = logging.getLogger("training.checkpoint")  # the package's logger (layout.py)


def choose_resume(resume: str, cfg: TrainConfig, *, local_resume: bool, overwrite: bool) -> Path | None:
    """The durable checkpoint a run of ``cfg`` starts from (``resolve_resume``; rank 0 alone), checked first:
    its saved config against ``cfg`` (compat.check_resumable) and, for a start that does not continue the
    newest checkpoint (``none``, a path), that no newer one is left to mix with this run's saves
    (``claim_checkpoint_dir``; the local tier's steps too unless ``local_resume`` may resume from them)."""
    path = resolve_resume(resume, cfg.checkpoint.dir)
    start = read_train_state(path) if path is not None else None
    if start is not None:
        for warning in check_resumable(start.config, cfg, path):
            log.warning("%s", warning)
    if resume != "auto":
        local_root = cfg.checkpoint.local_dir if cfg.checkpoint.local_tier and not local_resume else ""
        claim_checkpoint_dir(resume, start.step if start else 0, cfg.checkpoint.dir, local_root=local_root,
                             overwrite=overwrite)
    return path


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


def claim_checkpoint_dir(resume: str, start_step: int, checkpoint_root: str, *, local_root: str = "",
                         overwrite: bool = False) -> None:
    """Let a run that starts at ``start_step`` (0: fresh) save into ``checkpoint_root``: refused (ConfigError)
    while it holds a complete checkpoint newer than that, or ``local_root`` (the local tier, when this start
    does not resume from it) a newer step, unless ``overwrite``; then the newer durable step directories are
    deleted now (rank 0: the directory is shared) and the local ones at the resume (local_resume.keep_only).
    ``resume`` is the --resume value, for the message. --resume auto never gets here: it continues the newest."""
    root = Path(checkpoint_root) if checkpoint_root else None
    durable = [s for s, p in step_dirs(root) if s > start_step and is_complete(p)] if root else []
    local = [s for s, _ in step_dirs(Path(local_root)) if s > start_step] if local_root else []
    if not durable and not local:
        return
    found = []
    if durable:
        found.append(f"checkpoint.dir={checkpoint_root!r} holds checkpoints up to step {max(durable)}")
    if local:
        found.append(f"checkpoint.local_dir={local_root!r} holds local steps up to {max(local)}")
    held = " and ".join(found)
    start = "starts a new run" if start_step == 0 else f"starts at step {start_step}"
    if not overwrite:
        raise ConfigError(
            f"--resume {resume}: {start}, but {held}, which its saves would be mixed with (keep_last would delete "
            "by step number); allowed: --resume auto (continue them), another checkpoint.dir, or "
            f"--overwrite-checkpoints (delete {'them' if start_step == 0 else f'the steps after {start_step}'} first)"
        )
    if root is not None:
        newer = [(s, p) for s, p in step_dirs(root) if s > start_step]
        for _, path in newer:
            shutil.rmtree(path)
        if newer:
            log.warning("--overwrite-checkpoints: deleted %d step director%s after step %d under %s (steps %s)",
                        len(newer), "y" if len(newer) == 1 else "ies", start_step, root,
                        ", ".join(str(s) for s, _ in newer))


def agree_on_resume(resume: str, cfg: TrainConfig, rank: int, *, local_resume: bool,
                    overwrite: bool) -> Path | None:
    """choose_resume on rank 0, broadcast to all: every rank loads the same step even if a save completes
    while they look, and the warnings about incomplete directories are logged once, not once per rank; a
    refusal (a config the checkpoint cannot take, a start beside newer checkpoints) reaches every rank."""
    choice: list[object] = [None]
    if rank == 0:
        try:
            choice[0] = choose_resume(resume, cfg, local_resume=local_resume, overwrite=overwrite)
        except ConfigError as exc:
            choice[0] = exc
    if dist.is_initialized():
        dist.broadcast_object_list(choice, src=0)
    if isinstance(choice[0], ConfigError):
        raise choice[0]
    return choice[0]  # type: ignore[return-value]
