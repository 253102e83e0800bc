"""Which config changes a resume can take: the run's config against the one its checkpoint was saved with
(``train_state.json``'s ``config``), compared before anything is loaded.

- Refused, in one line naming every field that differs (``check_resumable``): what changes the saved state's
  tensors. DCP would otherwise fail deep inside the load on the first size mismatch (a 55-line traceback), or
  load weights into a model that reads them differently (``n_heads`` keeps the shapes and changes head_dim):
  the model's shape (``STATE_FIELDS``), and a switch to Transformer Engine, whose linears carry FP8 metadata
  (``_extra_state``) that a checkpoint saved without TE does not have. Leaving TE, or switching between
  torchao and none, keeps the keys: the checkpoint holds the high-precision weights either way (state.py).
- Warned, one line each: model fields that load but change what the model computes (RoPE, the norm epsilon),
  and a learning-rate schedule that no longer continues the one that ran (``schedule_change``: a larger
  run.steps re-stretches the cosine, and the next step's lr jumps).
- Everything else may change freely: optim.lr and the intervals, run.steps, the world size (DCP reshards), the
  data, the dtypes, FP8 recipes.
"""

from __future__ import annotations

import dataclasses
import math
from collections.abc import Mapping
from pathlib import Path
from typing import Any

from training.config import TrainConfig
from training.config.sections import SHAPE_FIELDS, ModelConfig, OptimConfig
from training.errors import ConfigError
from training.optim import lr_at

# [model] fields that decide the saved tensors' names, shapes or meaning
STATE_FIELDS = ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size", "tie_embeddings")
# [model] fields that load but change the function; init_std only matters before the first step
BEHAVIOUR_FIELDS = tuple(f for f in SHAPE_FIELDS if f not in STATE_FIELDS and f != "init_std")
# the fields lr_at reads, besides run.steps
SCHEDULE_FIELDS = ("lr", "min_lr", "warmup_steps", "schedule", "decay_steps", "decay_fraction")
OPERATIONS_DOC = "docs/operations.md, 'Resuming a run'"


def check_resumable(saved: Mapping[str, Any], cfg: TrainConfig, path: str | Path) -> list[str]:
    """Refuse (ConfigError) a resume of ``cfg`` from the checkpoint at ``path`` saved with config ``saved``
    whose state it cannot load; returns the warning lines for changes that load but compute differently.
    A checkpoint without a saved config (``{}``) is not compared."""
    if not saved:
        return []
    model = _saved_model(saved)
    refused = [f"model.{f} {getattr(model, f)!r} -> {getattr(cfg.model, f)!r}" for f in STATE_FIELDS
               if getattr(model, f) != getattr(cfg.model, f)]
    saved_backend = saved.get("fp8", {}).get("backend", "none")
    if cfg.fp8.backend == "te" and saved_backend != "te":
        refused.append(f"fp8.backend {saved_backend!r} -> 'te' (the checkpoint has no Transformer Engine FP8 "
                       "metadata, _extra_state, to load)")
    if refused:
        raise ConfigError(
            f"--resume: {path} was saved with another model: {', '.join(refused)}; allowed: the values it was "
            "saved with, or a new run (--resume none) in another checkpoint.dir"
        )
    return [f"resume from {path}: model.{f} {getattr(model, f)!r} -> {getattr(cfg.model, f)!r}: the weights load, "
            "but the model computes differently from the one that trained them"
            for f in BEHAVIOUR_FIELDS if getattr(model, f) != getattr(cfg.model, f)]


def schedule_change(saved: Mapping[str, Any], cfg: TrainConfig, step: int) -> str | None:
    """One warning line when the learning rate of the next step (``step`` steps done) is not the one the
    schedule that ran would give: the old and new schedule lengths, the lr jump and how to avoid it; None when
    it continues (or the checkpoint has no saved config)."""
    if not 0 < step < cfg.run.steps or not isinstance(saved.get("optim"), dict) or not isinstance(
            saved.get("run"), dict):
        return None  # nothing ran, nothing is left to run, or no saved config to compare with
    before = _from_saved(OptimConfig, saved["optim"])
    before_steps = int(saved["run"].get("steps", cfg.run.steps))
    after, after_steps = cfg.optim, cfg.run.steps
    expected = lr_at(step, before, before_steps)
    now = lr_at(step, after, after_steps)
    if math.isclose(expected, now, rel_tol=1e-9, abs_tol=0.0):
        return None
    changes = [f"optim.{f} {getattr(before, f)!r} -> {getattr(after, f)!r}" for f in SCHEDULE_FIELDS
               if getattr(before, f) != getattr(after, f)]
    if before_steps != after_steps:
        changes.insert(0, f"run.steps {before_steps} -> {after_steps}")
    only_longer = after_steps > before_steps and len(changes) == 1
    if only_longer and before.schedule == "cosine" and before.decay_steps == 0:
        hint = (f"to extend it without reshaping the decay that ran, set optim.decay_steps="
                f"{before.decay_window(before_steps)[1]} (the added steps train at optim.min_lr), or start runs "
                f"that may grow with optim.schedule='wsd' ({OPERATIONS_DOC})")
    else:
        hint = f"optim.decay_steps and optim.schedule='wsd' keep a decay fixed ({OPERATIONS_DOC})"
    return (f"resume at step {step}: the learning-rate schedule changed ({', '.join(changes) or 'its settings'}): "
            f"step {step}/{before_steps} ran at lr {lr_at(step - 1, before, before_steps):.2e}, step {step + 1}/"
            f"{after_steps} now runs at lr {now:.2e} where the schedule that ran gives {expected:.2e}; {hint}")


def _saved_model(saved: Mapping[str, Any]) -> ModelConfig:
    return _from_saved(ModelConfig, saved.get("model", {}))


def _from_saved(cls: type, table: Any) -> Any:
    """``cls`` from a saved section: the fields it knows (a field added since the save takes its default,
    which is what the code before it did), in the types the dataclass declares."""
    known = {f.name for f in dataclasses.fields(cls)}
    values = {k: v for k, v in (table if isinstance(table, dict) else {}).items() if k in known}
    if isinstance(values.get("betas"), list):
        values["betas"] = tuple(values["betas"])
    return cls(**values)
