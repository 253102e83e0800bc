"""AdamW and the learning-rate schedule: linear warmup, then cosine decay to a floor.

The schedule follows nanoGPT's ``get_lr`` (warmup, floor, cosine in between) and is a pure function of the
step, so a resumed run continues on exactly the same curve.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import torch

from training.errors import ConfigError


@dataclass
class OptimConfig:
    """The ``[optim]`` section."""

    lr: float = 3e-4  # peak learning rate, reached at the end of warmup
    min_lr: float = 3e-5  # floor the cosine decays to at the last step (absolute, not a ratio)
    warmup_steps: int = 100  # optimizer steps of linear warmup from lr/warmup_steps up to lr
    weight_decay: float = 0.1  # AdamW decoupled weight decay on matrices (norms and biases get none)
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW (beta1, beta2)
    eps: float = 1e-8  # AdamW epsilon
    max_grad_norm: float = 1.0  # clip the global L2 gradient norm to this; 0 disables clipping

    def validate(self) -> None:
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"optim.lr={self.lr!r}: allowed: a finite number > 0")
        if not (math.isfinite(self.min_lr) and 0 <= self.min_lr <= self.lr):
            raise ConfigError(f"optim.min_lr={self.min_lr!r}: allowed: 0 <= min_lr <= optim.lr ({self.lr})")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or (
            self.warmup_steps < 0
        ):
            raise ConfigError(f"optim.warmup_steps={self.warmup_steps!r}: allowed: an integer >= 0")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ConfigError(f"optim.weight_decay={self.weight_decay!r}: allowed: a number >= 0")
        betas = tuple(self.betas)
        if len(betas) != 2 or not all(isinstance(b, int | float) and 0 <= b < 1 for b in betas):
            raise ConfigError(f"optim.betas={self.betas!r}: allowed: two numbers in [0, 1), e.g. [0.9, 0.95]")
        self.betas = (float(betas[0]), float(betas[1]))
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise ConfigError(f"optim.eps={self.eps!r}: allowed: a number > 0")
        if not (math.isfinite(self.max_grad_norm) and self.max_grad_norm >= 0):
            raise ConfigError(f"optim.max_grad_norm={self.max_grad_norm!r}: allowed: a number >= 0 (0 = off)")


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
