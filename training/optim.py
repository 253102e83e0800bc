"""AdamW, and the learning-rate schedule applied to it: ``lr_at`` (linear warmup, then a decay to a floor,
``optim.schedule``) lives in training.config.schedule, torch-free, so clusterctl checks a job's schedule with it."""

from __future__ import annotations

import torch

from training.config.schedule import lr_at  # noqa: F401 (its home is torch-free; the trainer imports it here)
from training.config.sections import OptimConfig


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
