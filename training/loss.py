"""The training loss: mean token cross-entropy of the output head, either on the full logits or fused with the
head over chunks of tokens so the logits never exist whole.

The full-logits path materialises logits [N, V] in the compute dtype, an fp32 copy for the log-softmax (which
autograd keeps for backward) and fp32 gradients of the same size: at the 1b preset's vocabulary (128256) and
4 x 4096 tokens that is 2.1e9 elements per copy, 4.2 GB in bf16 and 8.4 GB in fp32. The fused path
(``parallel.loss_chunk_tokens`` > 0) is the idea of Liger Kernel's fused linear cross-entropy
(linkedin/Liger-Kernel, ops/fused_linear_cross_entropy.py): compute the gradients already in forward, one
chunk of tokens at a time, and keep only the gradients of the head's two inputs for backward. Its extra memory
is one chunk's logits (fp32 plus one copy in the compute dtype), an fp32 accumulator for the head weight's
gradient and the two stored gradients (the size of h and of the weight).

Numerics follow the full-logits path: the chunk's logits come out of the same matmul in the compute dtype and
are upcast to fp32; the gradient of the logits, (softmax - onehot) / N, is fp32 and is cast to the compute
dtype before the two gradient matmuls, as autograd does after ``logits.float()``. The head weight's gradient
is summed over chunks in fp32 and cast to the weight's dtype once.
"""

from __future__ import annotations

import torch
import torch.nn.functional as F

IGNORE_INDEX = -100  # F.cross_entropy's default ignore_index: a target that counts nowhere (validation's padding)


def cross_entropy_loss(logits: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
    """Mean cross-entropy of logits [..., V] against targets [...], in fp32: bf16 logits lose the precision
    log-softmax over a large vocabulary needs. The full-logits path (``parallel.loss_chunk_tokens`` = 0).
    Targets of IGNORE_INDEX count nowhere (the mean is over the others)."""
    return F.cross_entropy(logits.flatten(0, -2).float(), targets.flatten())


def fused_linear_cross_entropy(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,
                               chunk_tokens: int) -> torch.Tensor:
    """Mean cross-entropy of ``h @ weight.T`` (h [..., D], weight [V, D], targets [...]) against ``targets``,
    computed ``chunk_tokens`` rows at a time; equal to ``cross_entropy_loss(h @ weight.T, targets)`` within
    float rounding. Returns an fp32 scalar whose backward gives h and weight their gradients. Without gradients
    (an evaluation) targets of IGNORE_INDEX count nowhere, as in cross_entropy_loss; training passes none."""
    if chunk_tokens < 1:
        raise ValueError(f"chunk_tokens={chunk_tokens!r}: allowed: an integer >= 1")
    flat_h, flat_targets = h.reshape(-1, h.shape[-1]), targets.reshape(-1)
    if torch.is_grad_enabled() and (h.requires_grad or weight.requires_grad):
        return _FusedLinearCrossEntropy.apply(flat_h, weight, flat_targets, chunk_tokens)
    kept = flat_targets != IGNORE_INDEX  # validation's padding rows; the check syncs, which an evaluation may
    if not bool(kept.all()):
        flat_h, flat_targets = flat_h[kept], flat_targets[kept]
    loss, _, _ = _chunked_loss(flat_h, weight, flat_targets, chunk_tokens, grad_h=False, grad_weight=False)
    return loss


class _FusedLinearCrossEntropy(torch.autograd.Function):
    """Forward computes the loss and both gradients; backward scales the stored gradients by grad_output.

    The gradients go through save_for_backward (not ctx attributes) so that they are what autograd holds for
    backward, visible to saved-tensor hooks like every other saved activation (tests/training/test_loss.py
    checks that no [N, V] tensor is among them)."""

    @staticmethod
    def forward(ctx, h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor,  # type: ignore[override]
                chunk_tokens: int) -> torch.Tensor:
        need_h, need_weight = ctx.needs_input_grad[0], ctx.needs_input_grad[1]
        loss, grad_h, grad_weight = _chunked_loss(h, weight, targets, chunk_tokens, grad_h=need_h,
                                                  grad_weight=need_weight)
        ctx.save_for_backward(grad_h, grad_weight)
        return loss

    @staticmethod
    def backward(ctx, grad_output: torch.Tensor):  # type: ignore[override]
        # grad_output is 1 / grad_accum_steps in training. Scaled in place: an out-of-place product would hold
        # a second copy of the head weight's gradient (0.5 GB in bf16 at the 1b preset) at backward's start.
        # So the stored gradients are spent by one backward, and a second one through a retained graph fails.
        if getattr(ctx, "spent", False):
            raise RuntimeError("fused_linear_cross_entropy: backward through the same graph twice is not supported")
        ctx.spent = True
        grad_h, grad_weight = ctx.saved_tensors
        for grad in (grad_h, grad_weight):
            if grad is not None:
                grad.mul_(grad_output.to(grad.dtype))
        return grad_h, grad_weight, None, None


@torch.no_grad()
def _chunked_loss(h: torch.Tensor, weight: torch.Tensor, targets: torch.Tensor, chunk_tokens: int, *,
                  grad_h: bool, grad_weight: bool) -> tuple[torch.Tensor, torch.Tensor | None, torch.Tensor | None]:
    """(mean loss, d loss / d h or None, d loss / d weight or None) for h [N, D], weight [V, D], targets [N]."""
    n_tokens = h.shape[0]
    loss_sum = torch.zeros((), dtype=torch.float32, device=h.device)
    h_grad = torch.empty_like(h) if grad_h else None
    weight_grad: torch.Tensor | None = None  # fp32 sum over chunks (one chunk: the product in weight's dtype)
    for start in range(0, n_tokens, chunk_tokens):
        stop = min(start + chunk_tokens, n_tokens)
        h_chunk, target_chunk = h[start:stop], targets[start:stop]
        # 1) logits in the compute dtype (the head's own matmul), then fp32 for the log-sum-exp, computed in
        #    place: torch.logsumexp would allocate a second chunk-sized fp32 tensor for exp(logits - max)
        logits = (h_chunk @ weight.T).float()
        target_logits = logits.gather(1, target_chunk[:, None]).squeeze(1)
        maxes = logits.amax(dim=-1, keepdim=True)
        exps = logits.sub_(maxes).exp_()
        sums = exps.sum(dim=-1, keepdim=True)
        loss_sum += (maxes + sums.log() - target_logits[:, None]).sum()
        if not (grad_h or grad_weight):
            continue
        # 2) d(mean loss)/d logits = (softmax - onehot) / N, in place over the same fp32 tensor
        grad_logits = exps.div_(sums * n_tokens)
        grad_logits[torch.arange(stop - start, device=h.device), target_chunk] -= 1.0 / n_tokens
        grad_logits = grad_logits.to(h.dtype)  # what autograd hands the head's matmul after logits.float()
        # 3) the head's two gradients for this chunk
        if h_grad is not None:
            torch.mm(grad_logits, weight, out=h_grad[start:stop])
        if grad_weight:
            # the GEMM accumulates in fp32 inside; with several chunks its results are summed in fp32
            if weight_grad is None:
                weight_grad = grad_logits.T @ h_chunk
                if stop < n_tokens:
                    weight_grad = weight_grad.float()
            elif weight_grad.dtype == grad_logits.dtype:
                weight_grad.addmm_(grad_logits.T, h_chunk)
            else:
                weight_grad += grad_logits.T @ h_chunk
        del logits, exps, grad_logits
    if weight_grad is not None:
        weight_grad = weight_grad.to(weight.dtype)  # once, at the end
    return loss_sum / n_tokens, h_grad, weight_grad
