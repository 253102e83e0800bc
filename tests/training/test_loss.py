"""training.loss: the output head fused with the cross-entropy over chunks of tokens, against the loss on the
full logits (values, gradients, dtypes, and what autograd keeps for backward)."""

from __future__ import annotations

import pytest
import torch
from torch.autograd.graph import saved_tensors_hooks

from training.loss import IGNORE_INDEX, cross_entropy_loss, fused_linear_cross_entropy
from training.model import Transformer, build_model_config

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def inputs(n: int, dim: int, vocab: int, dtype=torch.float32, seed: int = 0):
    gen = torch.Generator().manual_seed(seed)
    h = torch.randn(n, dim, generator=gen).to(dtype).requires_grad_()
    weight = (torch.randn(vocab, dim, generator=gen) * dim**-0.5).to(dtype).requires_grad_()
    targets = torch.randint(0, vocab, (n,), generator=gen)
    return h, weight, targets


def loss_and_grads(loss_fn, h, weight, targets, scale: float = 1.0):
    h.grad = weight.grad = None
    loss = loss_fn(h, weight, targets)
    (loss * scale).backward()  # scale: what grad_accum_steps does to the loss in training
    return loss.detach(), h.grad.clone(), weight.grad.clone()


def full_logits(h, weight, targets):
    return cross_entropy_loss(h @ weight.T, targets)


def fused(chunk_tokens):
    return lambda h, weight, targets: fused_linear_cross_entropy(h, weight, targets, chunk_tokens)


@pytest.mark.parametrize(
    ("n", "dim", "vocab", "chunk_tokens"),
    [
        (64, 32, 100, 16),  # N a multiple of the chunk
        (37, 16, 50, 8),  # N not a multiple: the last chunk is short
        (64, 32, 100, 64),  # exactly one chunk
        (10, 8, 30, 100),  # the chunk larger than N
        (20, 8, 1000, 1),  # one token per chunk, vocabulary much larger than the tokens
    ],
)
def test_fused_loss_and_gradients_match_the_full_logits_in_float32(n, dim, vocab, chunk_tokens):
    h, weight, targets = inputs(n, dim, vocab)
    expected = loss_and_grads(full_logits, h, weight, targets, scale=0.5)
    got = loss_and_grads(fused(chunk_tokens), h, weight, targets, scale=0.5)
    for name, a, b in zip(("loss", "grad h", "grad weight"), got, expected, strict=True):
        torch.testing.assert_close(a, b, rtol=1e-5, atol=1e-7, msg=name)
    assert got[0].dtype == torch.float32


def test_batched_hidden_states_are_flattened_like_the_logits():
    h, weight, targets = inputs(24, 16, 40)
    h3 = h.detach().view(4, 6, 16).requires_grad_()
    loss = fused_linear_cross_entropy(h3, weight, targets.view(4, 6), 5)
    loss.backward()
    expected = loss_and_grads(full_logits, h, weight, targets)
    torch.testing.assert_close(loss.detach(), expected[0], rtol=1e-5, atol=1e-7)
    torch.testing.assert_close(h3.grad.view(24, 16), expected[1], rtol=1e-5, atol=1e-7)


def test_bf16_inputs_give_bf16_gradients_close_to_the_full_logits_path():
    """bf16 h and weight (FSDP2's gathered params on a GPU): the fused loss is fp32 and as close to the fp32
    reference as the full-logits bf16 path is; the gradients come back in bf16, as autograd would give them."""
    h32, w32, targets = inputs(300, 64, 500)
    reference = loss_and_grads(full_logits, h32, w32, targets)
    h, weight = (t.detach().bfloat16().requires_grad_() for t in (h32, w32))
    unfused = loss_and_grads(full_logits, h, weight, targets, scale=1 / 3)
    got = loss_and_grads(fused(128), h, weight, targets, scale=1 / 3)
    assert got[0].dtype == torch.float32 and got[1].dtype == got[2].dtype == torch.bfloat16
    assert abs(got[0] - reference[0]) <= 2 * abs(unfused[0] - reference[0]) + 1e-4
    # elementwise bf16 comparisons fail where a gradient entry is a near-cancelling sum: compare the error's
    # norm to the gradient's, and with the error the full-logits bf16 path itself makes
    for name, a, b, ref in zip(("grad h", "grad weight"), got[1:], unfused[1:], reference[1:], strict=True):
        fused_error, unfused_error = (relative_error(x.float() * 3, ref) for x in (a, b))
        assert relative_error(a.float(), b.float()) < 1e-2, name
        assert fused_error < 2 * unfused_error + 1e-3, (name, fused_error, unfused_error)


def relative_error(a: torch.Tensor, b: torch.Tensor) -> float:
    return ((a - b).norm() / b.norm()).item()


def test_without_autograd_only_the_loss_is_computed():
    h, weight, targets = inputs(37, 16, 50)
    with torch.no_grad():
        loss = fused_linear_cross_entropy(h, weight, targets, 8)
    assert not loss.requires_grad and loss.grad_fn is None
    torch.testing.assert_close(loss, full_logits(h, weight, targets).detach(), rtol=1e-5, atol=1e-7)
    with pytest.raises(ValueError, match="chunk_tokens=0: allowed: an integer >= 1"):
        fused_linear_cross_entropy(h, weight, targets, 0)


def test_without_autograd_ignored_targets_count_nowhere_as_on_the_full_logits():
    # an evaluation's padding rows (training.validation): the mean is over the other tokens, on both paths
    h, weight, targets = inputs(37, 16, 50)
    ignored = targets.clone()
    ignored[5:17] = IGNORE_INDEX
    with torch.no_grad():
        loss = fused_linear_cross_entropy(h, weight, ignored, 8)
        kept = full_logits(h[targets == ignored], weight, targets[targets == ignored])
        torch.testing.assert_close(full_logits(h, weight, ignored), kept, rtol=1e-6, atol=0)
        everything = full_logits(h, weight, targets)
    torch.testing.assert_close(loss, kept, rtol=1e-5, atol=1e-7)
    assert abs(float(loss) - float(everything)) > 1e-4  # the ignored rows did count before


def saved_numels(fn) -> list[int]:
    """Sizes (elements) of every tensor autograd saves for backward while ``fn()`` runs."""
    sizes: list[int] = []

    def pack(tensor):
        sizes.append(tensor.numel())
        return tensor

    with saved_tensors_hooks(pack, lambda tensor: tensor):
        fn()
    return sizes


def test_no_tokens_x_vocab_tensor_is_saved_for_backward():
    n, dim, vocab = 256, 16, 300
    h, weight, targets = inputs(n, dim, vocab)
    unfused = saved_numels(lambda: full_logits(h, weight, targets))
    chunked = saved_numels(lambda: fused_linear_cross_entropy(h, weight, targets, 64))
    assert max(unfused) >= n * vocab  # log-softmax keeps its fp32 [N, V] output
    # the fused path keeps exactly the two gradients: [N, D] and [V, D]
    assert sorted(chunked) == sorted([n * dim, vocab * dim])


def test_the_model_returns_the_loss_with_targets_and_saves_no_logits_when_fused():
    cfg = build_model_config("tiny")
    model = Transformer(cfg)
    model.init_weights(seed=0)
    gen = torch.Generator().manual_seed(0)
    tokens = torch.randint(0, cfg.vocab_size, (8, 32), generator=gen)
    targets = torch.randint(0, cfg.vocab_size, (8, 32), generator=gen)
    n_logits = tokens.numel() * cfg.vocab_size

    full = saved_numels(lambda: model(tokens, targets))
    assert max(full) == n_logits
    assert max(saved_numels(lambda: model(tokens, targets, loss_chunk_tokens=48))) < n_logits

    def grads(**kwargs):
        model.zero_grad(set_to_none=True)
        loss = model(tokens, targets, **kwargs)
        loss.backward()
        return loss.detach(), {name: p.grad.clone() for name, p in model.named_parameters()}

    loss_full, grads_full = grads()
    loss_fused, grads_fused = grads(loss_chunk_tokens=48)  # 256 tokens: 5 chunks of 48 and one of 16
    torch.testing.assert_close(loss_fused, loss_full, rtol=1e-6, atol=1e-7)
    torch.testing.assert_close(loss_full, cross_entropy_loss(model(tokens), targets).detach(), rtol=0, atol=0)
    for name, grad in grads_full.items():
        torch.testing.assert_close(grads_fused[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_the_full_logits_path_saves_only_the_fp32_copy_so_the_bf16_logits_can_be_freed():
    """training.step.forward_backward deletes the model's bf16 logits before backward: autograd holds only
    the fp32 copy (log-softmax's output), so nothing else keeps them alive."""
    n, dim, vocab = 64, 16, 300
    h, weight, targets = (t.detach().bfloat16().requires_grad_() if t.is_floating_point() else t
                          for t in inputs(n, dim, vocab))
    saved: dict[int, torch.dtype] = {}  # storage address -> dtype, for the [N, V] tensors

    def pack(tensor):
        if tensor.numel() == n * vocab:
            saved[tensor.untyped_storage().data_ptr()] = tensor.dtype
        return tensor

    with saved_tensors_hooks(pack, lambda tensor: tensor):
        cross_entropy_loss(h @ weight.T, targets)
    # one storage (log-softmax's output, saved by log_softmax and by nll_loss), fp32
    assert list(saved.values()) == [torch.float32]


def test_a_second_backward_through_a_retained_graph_fails_loudly():
    """The stored gradients are scaled in place by the one backward (no second copy of the head weight's
    gradient): a second backward would scale them again, so it raises instead of giving wrong gradients."""
    h, weight, targets = inputs(37, 16, 50)
    loss = fused_linear_cross_entropy(h, weight, targets, 8)
    loss.backward(retain_graph=True)
    with pytest.raises(RuntimeError, match="backward through the same graph twice is not supported"):
        loss.backward()
