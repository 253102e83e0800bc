"""The model's shape arithmetic, with no torch import: a preset's ModelConfig, the parameter count and the
training FLOPs per token.

training.model (the torch module) re-exports all of it. It lives apart so that code which only plans a run
(``clusterctl plan``: memory, time and cost per instance type) computes the same numbers as the trainer's MFU
without installing torch: one FLOP count, not two. The presets and ModelConfig themselves are in
training.config.sections, with the other configuration sections.
"""

from __future__ import annotations

from training.config.sections import MODEL_PRESETS, ModelConfig
from training.errors import ConfigError


def build_model_config(preset: str, **overrides: int | float | str) -> ModelConfig:
    """A validated ModelConfig from a preset name plus explicit field values (which win)."""
    if preset not in MODEL_PRESETS:
        raise ConfigError(f"model.preset={preset!r}: allowed: {', '.join(MODEL_PRESETS)}")
    cfg = ModelConfig(preset=preset, **{**MODEL_PRESETS[preset], **overrides})
    cfg.validate()
    return cfg


def count_params(cfg: ModelConfig, *, include_embedding: bool = True) -> int:
    """Parameters of Transformer(cfg), computed from the shape (no model needed)."""
    kv_width = cfg.n_kv_heads * cfg.head_dim
    attention = 2 * cfg.dim * cfg.dim + 2 * cfg.dim * kv_width  # wq, wo + wk, wv
    feed_forward = 3 * cfg.dim * cfg.ffn_dim
    block = attention + feed_forward + 2 * cfg.dim  # + two RMSNorm weights
    non_embedding = cfg.n_layers * block + cfg.dim + cfg.dim * cfg.vocab_size  # + final norm + output head
    # tied embeddings: the output head's matrix is the embedding, counted once (as the head, a matmul)
    return non_embedding + (cfg.vocab_size * cfg.dim if include_embedding and not cfg.tie_embeddings else 0)


def flops_per_token(cfg: ModelConfig, seq_len: int) -> float:
    """Training FLOPs (forward + backward) per token, the convention of PaLM (Chowdhery et al. 2022, appendix
    B) and torchtitan's ``get_num_flop_per_token``:

        6 * N + 12 * n_layers * dim * seq_len

    N counts every parameter that takes part in a matmul: all but the token embedding (a lookup), including
    the output head; 6 = 2 FLOPs per multiply-add x (1 forward + 2 backward). The second term is attention's
    QK^T and AV matmuls: 2 matmuls x 2 FLOPs x 3 (fwd+bwd) x dim x seq_len per layer, counted over the full
    T x T score matrix (causal masking is not subtracted), as PaLM and torchtitan do, so MFU figures compare
    with theirs. Norm weights are included in N; they add < 0.01%."""
    non_embedding = count_params(cfg, include_embedding=False)
    return 6.0 * non_embedding + 12.0 * cfg.n_layers * cfg.dim * seq_len
