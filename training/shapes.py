"""The model's shape arithmetic, with no torch import: the presets, ``ModelConfig``, the parameter count and
the training FLOPs per token.

training.model (the torch module) re-exports all of it. It lives apart so that code which only plans a run
(``clusterctl plan``: memory, time and cost per instance type) computes the same numbers as the trainer's MFU
without installing torch: one FLOP count, not two. Python 3.10+ like the rest of training/ (the nodes'
PyTorch environment).
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from training.errors import ConfigError

# Shape presets. Sources: Meta's params.json / Hugging Face config.json of the released checkpoints
# (meta-llama/Llama-3.2-1B: hidden 2048, 16 layers, 32 heads, 8 kv heads, intermediate 8192, vocab 128256,
# rope_theta 500000, rms_norm_eps 1e-5; Meta-Llama-3-8B: 4096, 32, 32, 8, 14336; Meta-Llama-3-70B: 8192, 80,
# 64, 8, 28672), and torchtitan's models/llama3/__init__.py (llama3_configs "8B" and "70B": dim 4096/8192,
# n_layers 32/80, n_heads 32/64, n_kv_heads 8, ffn_dim_multiplier 1.3, multiple_of 1024/4096, theta 500000,
# which gives the same hidden sizes 14336 and 28672). The released 1B ties its input and output
# embeddings; here they stay separate (as in torchtitan) so the meta-device build, FSDP2 and the FP8 filter
# need no special case: the "1b" preset has 1.50B parameters instead of 1.24B, with the same blocks.
# "125m" is GPT-2-small's width and depth (768 x 12 layers, 12 heads) in Llama form, with 4 kv heads and a
# 32000 vocabulary (the Llama-2 tokenizer size): 124.7M parameters, 100M of them outside the embedding.
MODEL_PRESETS: dict[str, dict[str, int | float]] = {
    # trains on a laptop CPU in seconds; vocab 320 holds the byte-level tokenizer's 257 ids (256 bytes and the
    # end-of-document token), rounded up to a multiple of 64
    "tiny": dict(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=192, vocab_size=320, rope_theta=10000.0
    ),
    "125m": dict(
        dim=768, n_layers=12, n_heads=12, n_kv_heads=4, ffn_dim=2048, vocab_size=32000, rope_theta=10000.0
    ),
    "1b": dict(
        dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192, vocab_size=128256, rope_theta=500000.0
    ),
    "llama3-8b": dict(
        dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=128256, rope_theta=500000.0
    ),
    "llama3-70b": dict(
        dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=28672, vocab_size=128256, rope_theta=500000.0
    ),
}


@dataclass
class ModelConfig:
    """The ``[model]`` section. With ``preset`` set, the preset's shape fills every shape field the file or
    ``--set`` does not give (resolved by training.config.load_config)."""

    preset: str = ""  # name in MODEL_PRESETS ("tiny", "125m", "1b", "llama3-8b", "llama3-70b"); "" = custom
    dim: int = 64  # model (residual stream) width
    n_layers: int = 2  # transformer blocks
    n_heads: int = 4  # query heads; head_dim = dim / n_heads
    n_kv_heads: int = 2  # key/value heads (grouped-query attention); divides n_heads
    ffn_dim: int = 192  # SwiGLU hidden width
    vocab_size: int = 256  # tokens in the vocabulary (the embedding and output head rows)
    rope_theta: float = 10000.0  # RoPE base frequency
    norm_eps: float = 1e-5  # RMSNorm epsilon
    init_std: float = 0.02  # std of the normal init of the linear layers (torchtitan's default)

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def validate(self) -> None:
        if self.preset and self.preset not in MODEL_PRESETS:
            raise ConfigError(
                f"model.preset={self.preset!r}: allowed: {', '.join(MODEL_PRESETS)} or '' (custom)"
            )
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"model.{name}={value!r}: allowed: an integer >= 1")
        if self.dim % self.n_heads:
            raise ConfigError(f"model.n_heads={self.n_heads!r}: allowed: a divisor of model.dim ({self.dim})")
        if self.head_dim % 2:
            raise ConfigError(
                f"model.n_heads={self.n_heads!r}: allowed: a value giving an even head_dim (dim / n_heads = "
                f"{self.head_dim}); RoPE rotates pairs of channels"
            )
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"model.n_kv_heads={self.n_kv_heads!r}: allowed: a divisor of model.n_heads ({self.n_heads})"
            )
        for name in ("rope_theta", "norm_eps", "init_std"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (math.isfinite(value) and value > 0)
            ):
                raise ConfigError(f"model.{name}={value!r}: allowed: a finite number > 0")


SHAPE_FIELDS = tuple(f.name for f in fields(ModelConfig) if f.name != "preset")


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
    return non_embedding + (cfg.vocab_size * cfg.dim if include_embedding else 0)


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


def fill_model_preset(model_table: dict[str, object]) -> None:
    """Fill, in place, the shape fields a ``[model]`` table (from a TOML file and ``--set``) does not give
    from the preset it names; the table's own values win. Used by training.config and clusterctl's planner,
    so a config file means the same model to both."""
    preset = model_table.get("preset", "")
    if not preset:
        return
    if preset not in MODEL_PRESETS:
        raise ConfigError(f"model.preset={preset!r}: allowed: {', '.join(MODEL_PRESETS)} or '' (custom)")
    for key, value in MODEL_PRESETS[preset].items():
        model_table.setdefault(key, value)
