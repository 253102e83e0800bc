"""A Llama-style decoder: RMSNorm, rotary position embeddings, SwiGLU and grouped-query attention through
``scaled_dot_product_attention``.

No parallelism here (nanoGPT's habit): tensor parallelism, FSDP2, FP8 and compilation are applied from
outside by training.fp8 and training.parallel. The module tree mirrors torchtitan's ``models/llama3/model.py``
(``tok_embeddings``, ``layers``, ``norm``, ``output``) so the per-block FSDP2 wrapping and the FP8 module
filter can address the parts by name. The model is built on the meta device and initialised after sharding, so
``init_weights()`` is the only place that gives parameters their values.
"""

from __future__ import annotations

import math
from collections.abc import Callable

import torch
import torch.nn.functional as F
from torch import nn
from torch.nn.attention import SDPBackend, _sdpa_kernel

from training.config.sections import MODEL_PRESETS, ModelConfig  # noqa: F401  (re-export)
from training.errors import ConfigError
from training.loss import cross_entropy_loss, fused_linear_cross_entropy

# The shape arithmetic (build_model_config, count_params, flops_per_token) imports no torch and lives in
# training.shapes, where clusterctl's planner reads it too: one FLOP count for the trainer's MFU and the plan.
# Re-exported so `from training.model import flops_per_token` keeps working.
from training.shapes import build_model_config, count_params, flops_per_token  # noqa: F401

# Fused attention kernels in order of preference (torchtitan's order). On an H100, cuDNN's fused attention
# made a whole 1b training step 5.4% faster than FlashAttention-2, the kernel PyTorch picks first
# (docs/benchmarks.md, 2026-11-23). A kernel that cannot take the inputs is skipped, so the CPU keeps its own
# path; set_sdpa_priority changes the order (python -m training.bench --sdpa-priority).
SDPA_PRIORITIES = {
    "cudnn": [SDPBackend.CUDNN_ATTENTION, SDPBackend.FLASH_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
    "flash": [SDPBackend.FLASH_ATTENTION, SDPBackend.CUDNN_ATTENTION, SDPBackend.EFFICIENT_ATTENTION, SDPBackend.MATH],
}
DEFAULT_SDPA_PRIORITY = "cudnn"
_sdpa_priority: str | None = None  # the order this process's attention uses, once a model or the bench set it


def set_sdpa_priority(name: str) -> None:
    """Prefer the ``name`` kernel (a key of SDPA_PRIORITIES) in every later attention of this process.

    The order is process state, set before any forward, rather than a ``sdpa_kernel`` block around each
    attention call. Inside a compiled block, dynamo put that block's calls into the graph, and AOTAutograd's
    cache refuses such a graph ("Unsupported call_function target _backend_from_string", torch 2.13): a warm
    restart then traced and partitioned every block's forward and backward again, with only Inductor's kernels
    from the cache. Set for the process, nothing of it is in the graph, and it still covers activation
    checkpointing's recompute of a block in the backward, which a block around the root's forward would miss."""
    global _sdpa_priority
    if name not in SDPA_PRIORITIES:
        raise ConfigError(f"sdpa priority {name!r}: allowed: {', '.join(SDPA_PRIORITIES)}")
    # what entering torch.nn.attention.sdpa_kernel(backends, set_priority=True) does, with no exit to undo it
    _sdpa_kernel(SDPA_PRIORITIES[name], set_priority=True)
    _sdpa_priority = name


class RMSNorm(nn.Module):
    """Root-mean-square layer norm (Zhang & Sennrich 2019), computed in float32 for stability."""

    def __init__(self, dim: int, eps: float) -> None:
        super().__init__()
        self.eps = eps
        self.weight = nn.Parameter(torch.empty(dim))

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return F.rms_norm(x.float(), (x.shape[-1],), eps=self.eps).type_as(x) * self.weight


def rope_cos_sin(
    seq_len: int, head_dim: int, theta: float, device: torch.device, cfg: ModelConfig | None = None
) -> tuple[torch.Tensor, torch.Tensor]:
    """cos and sin tables [seq_len, head_dim] of rotary embeddings (Su et al. 2021), in float32; with
    ``cfg.rope_scaling == "llama3"`` the frequencies are scaled as Llama 3.1 does (llama3_inv_freq).

    Computed per forward instead of kept in a buffer: a buffer built on the meta device would need its own
    re-initialisation after ``to_empty``, and the table costs seq_len * head_dim / 2 multiplications."""
    inv_freq = 1.0 / (theta ** (torch.arange(0, head_dim, 2, device=device, dtype=torch.float32) / head_dim))
    if cfg is not None and cfg.rope_scaling == "llama3":
        inv_freq = llama3_inv_freq(inv_freq, cfg)
    angles = torch.outer(torch.arange(seq_len, device=device, dtype=torch.float32), inv_freq)
    angles = torch.cat(
        (angles, angles), dim=-1
    )  # the "rotate half" layout pairs channel i with i + head_dim/2
    return angles.cos(), angles.sin()


def llama3_inv_freq(inv_freq: torch.Tensor, cfg: ModelConfig) -> torch.Tensor:
    """Llama 3.1's RoPE frequency scaling (Meta's apply_scaling; transformers' _compute_llama3_parameters):
    wavelengths longer than original_max_positions / low_freq_factor are stretched by the factor, those
    shorter than original_max_positions / high_freq_factor kept, the ones between blended smoothly."""
    factor, low, high = cfg.rope_scaling_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor
    old_context = cfg.rope_original_max_positions
    wavelen = 2 * math.pi / inv_freq
    scaled = torch.where(wavelen > old_context / low, inv_freq / factor, inv_freq)
    smooth = (old_context / wavelen - low) / (high - low)
    blended = (1 - smooth) * scaled / factor + smooth * scaled
    medium = ~(wavelen < old_context / high) & ~(wavelen > old_context / low)
    return torch.where(medium, blended, scaled)


def apply_rope(x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
    """Rotate x [B, heads, T, head_dim] by position (the GPT-NeoX / Hugging Face "rotate half" layout)."""
    x1, x2 = x.float().chunk(2, dim=-1)
    rotated = torch.cat((-x2, x1), dim=-1)
    return (x.float() * cos + rotated * sin).type_as(x)


class Attention(nn.Module):
    """Causal grouped-query self-attention: n_kv_heads key/value heads shared by groups of query heads."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.n_heads = cfg.n_heads
        self.n_kv_heads = cfg.n_kv_heads
        self.head_dim = cfg.head_dim
        self.wq = nn.Linear(cfg.dim, cfg.n_heads * cfg.head_dim, bias=False)
        self.wk = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wv = nn.Linear(cfg.dim, cfg.n_kv_heads * cfg.head_dim, bias=False)
        self.wo = nn.Linear(cfg.n_heads * cfg.head_dim, cfg.dim, bias=False)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        batch, seq_len, _ = x.shape
        # Heads from the projections' widths, not from n_heads: under tensor parallelism each rank computes
        # heads / tp of them (torchtitan infers them the same way); the model never learns of the split.
        q = self.wq(x).view(batch, seq_len, -1, self.head_dim).transpose(1, 2)
        k = self.wk(x).view(batch, seq_len, -1, self.head_dim).transpose(1, 2)
        v = self.wv(x).view(batch, seq_len, -1, self.head_dim).transpose(1, 2)
        q, k = apply_rope(q, cos, sin), apply_rope(k, cos, sin)
        # Each kv head serves n_heads / n_kv_heads query heads. Repeating k and v (torchtitan's repeat_kv)
        # rather than SDPA's enable_gqa=True keeps every fused backend (flash, cuDNN, memory-efficient)
        # eligible: enable_gqa rules some of them out and the math fallback would materialise T x T scores.
        # The copies cost 2 x B x T x dim activations per layer.
        n_rep = q.shape[1] // k.shape[1]  # = n_heads / n_kv_heads, on every tp rank alike
        k, v = _repeat_kv(k, n_rep), _repeat_kv(v, n_rep)
        out = F.scaled_dot_product_attention(q, k, v, is_causal=True)  # in set_sdpa_priority's order
        return self.wo(out.transpose(1, 2).reshape(batch, seq_len, -1))


def _repeat_kv(x: torch.Tensor, n_rep: int) -> torch.Tensor:
    """[B, kv_heads, T, D] -> [B, kv_heads * n_rep, T, D], each kv head repeated for its query-head group."""
    if n_rep == 1:
        return x
    batch, kv_heads, seq_len, head_dim = x.shape
    return (
        x[:, :, None]
        .expand(batch, kv_heads, n_rep, seq_len, head_dim)
        .reshape(batch, kv_heads * n_rep, seq_len, head_dim)
    )


class FeedForward(nn.Module):
    """SwiGLU (Shazeer 2020): w2(silu(w1 x) * w3 x)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        self.w1 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)
        self.w2 = nn.Linear(cfg.ffn_dim, cfg.dim, bias=False)
        self.w3 = nn.Linear(cfg.dim, cfg.ffn_dim, bias=False)

    def forward(self, x: torch.Tensor) -> torch.Tensor:
        return self.w2(F.silu(self.w1(x)) * self.w3(x))


class TransformerBlock(nn.Module):
    """Pre-norm block: x + attention(norm(x)), then + feed_forward(norm(.))."""

    def __init__(self, layer_id: int, cfg: ModelConfig) -> None:
        super().__init__()
        self.layer_id = layer_id
        self.attention_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.attention = Attention(cfg)
        self.ffn_norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.feed_forward = FeedForward(cfg)

    def forward(self, x: torch.Tensor, cos: torch.Tensor, sin: torch.Tensor) -> torch.Tensor:
        h = x + self.attention(self.attention_norm(x), cos, sin)
        return h + self.feed_forward(self.ffn_norm(h))


class Transformer(nn.Module):
    """The decoder: token embeddings -> blocks -> RMSNorm -> output head (logits, or the loss)."""

    def __init__(self, cfg: ModelConfig) -> None:
        super().__init__()
        if _sdpa_priority is None:  # the attention's kernel order is the process's: the default unless one was set
            set_sdpa_priority(DEFAULT_SDPA_PRIORITY)
        self.cfg = cfg
        self.tok_embeddings = nn.Embedding(cfg.vocab_size, cfg.dim)
        self.layers = nn.ModuleList(TransformerBlock(i, cfg) for i in range(cfg.n_layers))
        self.norm = RMSNorm(cfg.dim, cfg.norm_eps)
        self.output = nn.Linear(cfg.dim, cfg.vocab_size, bias=False)
        if cfg.tie_embeddings:
            # One parameter under two names (Llama 3.2 1B/3B): both modules sit in the root's fully_shard
            # group, so FSDP2 shards, gathers and reduces it once; the FP8 filter leaves the output head in
            # bf16 (training.fp8.HIGH_PRECISION_MODULES), so the embedding is never an FP8 weight either.
            self.output.weight = self.tok_embeddings.weight

    def forward(self, tokens: torch.Tensor, targets: torch.Tensor | None = None, *,
                loss_chunk_tokens: int = 0) -> torch.Tensor:
        """tokens [B, T] int64 -> logits [B, T, vocab_size]; with ``targets`` [B, T]: the mean cross-entropy
        loss (fp32 scalar) instead, fused with the output head over chunks of ``loss_chunk_tokens`` tokens
        when > 0 (training.loss), else from the full logits.

        The fused loss runs here, inside the root module's forward, because under FSDP2 the root's parameters
        (the output head among them) are gathered only between its forward pre- and post-hooks."""
        h = self.tok_embeddings(tokens)
        cos, sin = rope_cos_sin(tokens.shape[1], self.cfg.head_dim, self.cfg.rope_theta, h.device, self.cfg)
        for layer in self.layers:
            h = layer(h, cos, sin)
        h = self.norm(h)
        if targets is None:
            return self.output(h)
        if loss_chunk_tokens > 0:
            return fused_linear_cross_entropy(h, self.output.weight, targets, loss_chunk_tokens)
        return cross_entropy_loss(self.output(h), targets)

    @torch.no_grad()
    def init_weights(self, seed: int | None = None) -> None:
        """Give every parameter its initial value (after ``to_empty`` when the model was built on meta).

        torchtitan's llama3 init: embeddings N(0, 1); q/k/v and w1 N(0, init_std) truncated at 2 std; the
        projections back into the residual stream (wo, w2, w3) get the depth-scaled std
        init_std / sqrt(2 * (layer_id + 1)) so the residual stream's variance stays bounded with depth; the
        output head N(0, dim^-0.5) truncated at 3 std; norms 1.

        ``seed``: draw from a generator seeded with it (else from the global RNG). Each sharded (DTensor)
        weight is drawn whole and then sliced to this rank's shard, so the model is the same for any number
        of ranks and every shard differs: DTensor's own random ops are not shard-aware on CPU meshes (each
        rank drew the same values for its shard in torch 2.13)."""
        device = self.norm.weight.device
        generator = None if seed is None else torch.Generator(device=device).manual_seed(seed)
        _init_(self.tok_embeddings.weight, lambda t: nn.init.normal_(t, generator=generator))
        # modules(), not self.layers: the blocks may sit inside checkpoint wrappers
        for layer in (m for m in self.modules() if isinstance(m, TransformerBlock)):
            depth_std = self.cfg.init_std / math.sqrt(2 * (layer.layer_id + 1))
            attn, ffn = layer.attention, layer.feed_forward
            for linear in (attn.wq, attn.wk, attn.wv, ffn.w1):
                _init_(linear.weight, _trunc_normal(self.cfg.init_std, 2.0, generator))
            for linear in (attn.wo, ffn.w2, ffn.w3):
                _init_(linear.weight, _trunc_normal(depth_std, 2.0, generator))
            _init_(layer.attention_norm.weight, nn.init.ones_)
            _init_(layer.ffn_norm.weight, nn.init.ones_)
        _init_(self.norm.weight, nn.init.ones_)
        if not self.cfg.tie_embeddings:  # tied: the output head is the embedding, initialised above
            _init_(self.output.weight, _trunc_normal(self.cfg.dim**-0.5, 3.0, generator))


def _trunc_normal(
    std: float, cutoff_std: float, generator: torch.Generator | None
) -> Callable[[torch.Tensor], torch.Tensor]:
    return lambda t: nn.init.trunc_normal_(
        t, std=std, a=-cutoff_std * std, b=cutoff_std * std, generator=generator
    )


def _init_(weight: torch.Tensor, fill: Callable[[torch.Tensor], torch.Tensor]) -> None:
    """Fill ``weight`` in place; a DTensor (FSDP2 shard) is filled whole, then this rank's shard is kept."""
    from torch.distributed.tensor import DTensor, distribute_tensor  # only the sharded case needs it

    if not isinstance(weight, DTensor):
        fill(weight)
        return
    full = fill(torch.empty(weight.shape, dtype=weight.dtype, device=weight.to_local().device))
    # src_data_rank=None: every rank holds the same full tensor, so each slices its own shard locally
    weight.copy_(distribute_tensor(full, weight.device_mesh, weight.placements, src_data_rank=None))


def num_params(model: nn.Module) -> int:
    """Parameters of a built model: the global count, also when FSDP2 has sharded it (DTensor.numel() is the
    global size)."""
    return sum(p.numel() for p in model.parameters())
