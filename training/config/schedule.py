"""The learning-rate schedule as a pure function of the step, and what a run's length says about it and about its
checkpoints: the one check the trainer logs at start-up and ``clusterctl submit`` (and ``--dry-run``) prints before
anything is sent (issue 44: a fine-tune of 477 steps kept a pretraining warmup of 2000 and a checkpoint interval of
500, so its learning rate never reached the peak and nothing was saved along the way, without a word).

Torch-free, like the rest of training.config: clusterctl imports it on a machine without torch.

Schedules (``optim.schedule``): linear warmup, then "cosine" follows nanoGPT's ``get_lr`` (warmup, floor, cosine in
between) and "wsd" is warmup-stable-decay (torchtitan's ``warmup_stable_decay``: the peak held, then a linear decay
over the run's last steps). Either is a pure function of the step and the config, so a resumed run with the same
config continues on exactly the same curve; one with another run.steps or [optim] may not
(training.checkpoint.compat says so at the start).
"""

from __future__ import annotations

import math
from typing import TYPE_CHECKING

from training.config.sections import OptimConfig

if TYPE_CHECKING:
    from training.config import TrainConfig


def lr_at(step: int, cfg: OptimConfig, total_steps: int) -> float:
    """Learning rate for optimizer step ``step`` (0-based) of a run of ``total_steps`` steps."""
    # 1) linear warmup: step 0 gets lr/warmup_steps, step warmup_steps-1 gets the full lr
    if step < cfg.warmup_steps:
        return cfg.lr * (step + 1) / cfg.warmup_steps
    # 2) the decay window (OptimConfig.decay_window): cosine's starts at the end of warmup and by default lasts
    #    until the last step; wsd's is the run's last decay steps, with the peak held until it begins. A step
    #    past the window (decay_steps shorter than the run, or a run extended by --set run.steps) stays at the
    #    floor: progress stops at 1.
    start, length = cfg.decay_window(total_steps)
    if step < start:
        return cfg.lr
    if cfg.schedule == "wsd":
        # 3a) linear: the window's first step is already below lr, its last gets min_lr
        progress = min(1.0, (step - start + 1) / length)
        return cfg.min_lr + (1.0 - progress) * (cfg.lr - cfg.min_lr)
    # 3b) cosine from lr down to min_lr: the window's first step gets lr, its last min_lr
    progress = min(1.0, (step - start) / max(1, length - 1))
    coeff = 0.5 * (1.0 + math.cos(math.pi * progress))
    return cfg.min_lr + coeff * (cfg.lr - cfg.min_lr)


def describe_lr_schedule(cfg: OptimConfig, total_steps: int) -> str:
    """The schedule in one line (peak, warmup, decay, final), steps counted as the logs count them (completed)."""
    start, length = cfg.decay_window(total_steps)
    reached = "" if cfg.warmup_steps < total_steps else f" (not reached in {total_steps} steps)"
    if start >= total_steps:
        decay = "no decay within the run"
    else:
        cut = "" if start + length <= total_steps else f", cut at step {total_steps}"
        decay = f"{cfg.schedule} decay over steps {start + 1}-{start + length} to {cfg.min_lr:.2e}{cut}"
    return (f"lr schedule: peak {cfg.lr:.2e} after {cfg.warmup_steps} warmup steps{reached}, {decay}; final lr "
            f"{lr_at(total_steps - 1, cfg, total_steps):.2e} at step {total_steps}")


def run_length_warnings(cfg: TrainConfig, *, cluster_job: bool = False) -> list[str]:
    """One line per setting the run's length (run.steps) defeats: a warmup that never ends, a durable checkpoint
    interval that never comes. ``cluster_job``: checked for a job before it is sent, whose launcher sets
    checkpoint.dir and checkpoint.local_dir on the nodes (else the config's say whether the run saves). Empty when
    nothing is wrong."""
    steps, optim, checkpoint = cfg.run.steps, cfg.optim, cfg.checkpoint
    warnings = []
    if optim.warmup_steps >= steps:
        warnings.append(
            f"optim.warmup_steps={optim.warmup_steps} >= run.steps={steps}: the learning rate never reaches its "
            f"peak optim.lr={optim.lr:.2e} (the last step runs at {lr_at(steps - 1, optim, steps):.2e}); set "
            f"fewer warmup steps than the run has, e.g. --set optim.warmup_steps={max(1, steps // 20)} (5%)")
    if not (cluster_job or checkpoint.dir):
        return warnings  # no checkpoint.dir: nothing is saved at all, by choice
    at_end = "only at the end" if checkpoint.save_final else "not even at the end (checkpoint.save_final=false)"
    local = (f"; the local tier saves every {checkpoint.local_interval_steps} steps, but not to checkpoint.dir"
             if 0 < checkpoint.local_interval_steps < steps and (cluster_job or checkpoint.local_dir) else "")
    if checkpoint.interval_steps == 0:
        warnings.append(
            f"checkpoint.interval_steps=0 (off): no checkpoint is written before the end of the run's {steps} "
            f"steps, {at_end} and on SIGTERM or Ctrl-C{local}; set it below run.steps to save along the way")
    elif checkpoint.interval_steps >= steps:
        warnings.append(
            f"checkpoint.interval_steps={checkpoint.interval_steps} >= run.steps={steps}: no checkpoint is "
            f"written before the end of the run, {at_end} and on SIGTERM or Ctrl-C{local}; set it below "
            f"run.steps, e.g. --set checkpoint.interval_steps={max(1, steps // 4)}")
    return warnings
