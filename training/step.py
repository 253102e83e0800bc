"""One optimizer step's forward and backward over its micro-batches, and the gradient clip: the loop's
arithmetic, shared by train._loop and the benchmark."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.tensor import DTensor

from training.data.batches import Batch
from training.fp8 import Fp8Backend
from training.loss import cross_entropy_loss
from training.parallel.tp import maybe_loss_parallel


def forward_backward(model: nn.Module, fp8: Fp8Backend, micro_batches: list[Batch], grad_accum_steps: int, *,
                     loss_chunk_tokens: int = 0, loss_parallel: bool = False) -> torch.Tensor:
    """Accumulate gradients over the step's micro-batches; returns the step's mean loss (detached).

    Each micro-batch loss is a mean over its tokens; dividing by the number of micro-batches makes the summed
    gradients those of the mean over all the step's tokens (every micro-batch has the same token count).
    ``loss_chunk_tokens`` > 0 (``parallel.loss_chunk_tokens``): the model computes the loss itself, fused with
    its output head over chunks of that many tokens (Transformer.forward with targets); 0: from the full
    logits the model returns (any model that maps tokens to logits, torchtitan's too). ``loss_parallel``
    (tp > 1): the logits are sharded by vocabulary, and the loss and its backward run vocabulary-parallel.
    Every rank of a tp group computes the same loss of the same samples."""
    total = torch.zeros((), device=micro_batches[0][0].device, dtype=torch.float32)
    for inputs, targets in micro_batches:
        with maybe_loss_parallel(loss_parallel):
            if loss_chunk_tokens > 0:
                with fp8.autocast():
                    loss = model(inputs, targets, loss_chunk_tokens=loss_chunk_tokens)
            else:
                with fp8.autocast():
                    logits = model(inputs)
                loss = cross_entropy_loss(logits, targets)  # fp32, on the full (or vocabulary-sharded) logits
                # autograd keeps the fp32 copy, not these: freed now rather than through backward (the full bf16
                # logits, 4.2 GB at the 1b preset with 4 x 4096 tokens)
                del logits
            loss = loss / grad_accum_steps
            loss.backward()
        if isinstance(loss, DTensor):  # a loss_parallel loss is a replicated DTensor: its value is local
            loss = loss.to_local()
        total += loss.detach()
    return total


def clip_grad_norm_(model: nn.Module, max_norm: float) -> torch.Tensor:
    """Global L2 norm of all gradients, clipped to ``max_norm`` when it is > 0; returns the norm before
    clipping. FSDP2 (and TP) gradients are DTensor shards: their norm is a partial result that
    ``full_tensor()`` reduces across ranks before the clip coefficient is computed (as in torchtitan's
    distributed/utils.py clip_grad_norm_). Under TP the gradients of one model live on two meshes' worth
    of placements; torch's get_total_norm reduces each DTensor over its own mesh."""
    grads = [p.grad for p in model.parameters() if p.grad is not None]
    total_norm = torch.nn.utils.get_total_norm(grads, norm_type=2.0, error_if_nonfinite=False, foreach=True)
    if isinstance(total_norm, DTensor):
        total_norm = total_norm.full_tensor()
    if max_norm > 0:
        torch.nn.utils.clip_grads_with_norm_(model.parameters(), max_norm, total_norm, foreach=True)
    return total_norm
