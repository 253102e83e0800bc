"""AdamW and the learning-rate schedule: linear warmup, then cosine decay to a floor.

The schedule follows nanoGPT's ``get_lr`` (warmup, floor, cosine in between) and is a pure function of the
step, so a resumed run continues on exactly the same curve.
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
    # 2) cosine from lr down to min_lr over the remaining steps; the last step gets min_lr, and a step past
    #    the end (a run extended by --set run.steps) stays at the floor
    decay_steps = max(1, total_steps - 1 - cfg.warmup_steps)
    progress = min(1.0, (step - cfg.warmup_steps) / decay_steps)
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
