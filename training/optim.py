"""AdamW and the learning-rate schedule: linear warmup, then a decay to a floor (``optim.schedule``).

"cosine" follows nanoGPT's ``get_lr`` (warmup, floor, cosine in between); "wsd" is warmup-stable-decay
(torchtitan's ``warmup_stable_decay``: the peak held, then a linear decay over the run's last steps). Either is
a pure function of the step and the config, so a resumed run with the same config continues on exactly the
same curve; one with another run.steps or [optim] may not (training.checkpoint.compat says so at the start).
"""

from __future__ import annotations

import math

import torch

from training.config_sections import OptimConfig


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


def build_optimizer(model: torch.nn.Module, cfg: OptimConfig) -> torch.optim.AdamW:
    """AdamW with weight decay on parameters of two or more dimensions only (matrices, embeddings); norms'
    scales and biases are not decayed (the GPT-2/Llama convention). Works on FSDP2 DTensor parameters:
    a parameter's ``ndim`` is its global (unsharded) rank."""
    decay, no_decay = [], []
    for param in model.parameters():
        if not param.requires_grad:
            continue
        (decay if param.ndim >= 2 else no_decay).append(param)
    groups = [
        {"params": decay, "weight_decay": cfg.weight_decay},
        {"params": no_decay, "weight_decay": 0.0},
    ]
    # On CUDA the fused kernel (one launch for all parameters, DTensor shards included; torchtitan's default);
    # elsewhere foreach=True, which groups the per-parameter math into few kernels.
    on_cuda = all(p.is_cuda for group in groups for p in group["params"])
    fast = {"fused": True} if on_cuda and decay else {"foreach": True}
    return torch.optim.AdamW(groups, lr=cfg.lr, betas=cfg.betas, eps=cfg.eps, **fast)


def apply_lr(optimizer: torch.optim.Optimizer, lr: float) -> None:
    """Set ``lr`` on every parameter group (called once per optimizer step, before ``step()``)."""
    for group in optimizer.param_groups:
        group["lr"] = lr
