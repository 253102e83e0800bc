"""One table of parameter names: Hugging Face's ``LlamaForCausalLM`` <-> training.model.Transformer, read in
both directions.

No tensor needs a transform on the way. Hugging Face's Llama checkpoints store q_proj and k_proj with the
rows of each head permuted for the "rotate half" RoPE layout (transformers' convert_llama_weights_to_hf.py
permutes Meta's interleaved-pair weights once, at conversion); training.model.apply_rope uses that same
layout (channel i paired with i + head_dim/2), so the weights load and export as they are, and an import
followed by an export gives back the input bit for bit (tests/training/test_hf_roundtrip.py). Tied embeddings
(Llama 3.2 1B/3B) have no ``lm_head.weight`` on the Hugging Face side: ``output.weight`` is then the same
parameter as ``tok_embeddings.weight`` and is neither read nor written.

No torch here: the export and the directory checks use it without a model.
"""

from __future__ import annotations

import re

from training.config.sections import ModelConfig

# (ours, Hugging Face's); "{i}" is the block index. The one table both directions read.
_TABLE: tuple[tuple[str, str], ...] = (
    ("tok_embeddings.weight", "model.embed_tokens.weight"),
    ("layers.{i}.attention.wq.weight", "model.layers.{i}.self_attn.q_proj.weight"),
    ("layers.{i}.attention.wk.weight", "model.layers.{i}.self_attn.k_proj.weight"),
    ("layers.{i}.attention.wv.weight", "model.layers.{i}.self_attn.v_proj.weight"),
    ("layers.{i}.attention.wo.weight", "model.layers.{i}.self_attn.o_proj.weight"),
    ("layers.{i}.feed_forward.w1.weight", "model.layers.{i}.mlp.gate_proj.weight"),
    ("layers.{i}.feed_forward.w2.weight", "model.layers.{i}.mlp.down_proj.weight"),
    ("layers.{i}.feed_forward.w3.weight", "model.layers.{i}.mlp.up_proj.weight"),
    ("layers.{i}.attention_norm.weight", "model.layers.{i}.input_layernorm.weight"),
    ("layers.{i}.ffn_norm.weight", "model.layers.{i}.post_attention_layernorm.weight"),
    ("norm.weight", "model.norm.weight"),
    ("output.weight", "lm_head.weight"),
)
TIED_OUTPUT = "output.weight"  # ours: absent from a tied model's files (it is tok_embeddings.weight)


def _compile(pattern: str) -> re.Pattern[str]:
    return re.compile("^" + re.escape(pattern).replace(re.escape("{i}"), r"(\d+)") + "$")


_OURS_TO_HF = [(_compile(ours), hf) for ours, hf in _TABLE]
_HF_TO_OURS = [(_compile(hf), ours) for ours, hf in _TABLE]


def _translate(name: str, table: list[tuple[re.Pattern[str], str]], side: str) -> str:
    for pattern, template in table:
        match = pattern.match(name)
        if match:
            return template.replace("{i}", match.group(1)) if match.groups() else template
    raise KeyError(f"{name!r} is not a Llama parameter name ({side})")


def to_hf(name: str) -> str:
    """Our parameter FQN (``layers.3.attention.wq.weight``) -> Hugging Face's."""
    return _translate(name, _OURS_TO_HF, "ours")


def from_hf(name: str) -> str:
    """A Hugging Face parameter name -> our FQN."""
    return _translate(name, _HF_TO_OURS, "Hugging Face")


def expected_shapes(cfg: ModelConfig) -> dict[str, tuple[int, ...]]:
    """Every parameter of Transformer(cfg) that a Hugging Face directory holds: our FQN -> shape, in the order
    of the model (embeddings, blocks, norm, head). A tied model has no output.weight entry."""
    q_width, kv_width = cfg.n_heads * cfg.head_dim, cfg.n_kv_heads * cfg.head_dim
    per_block = {
        "attention.wq.weight": (q_width, cfg.dim),
        "attention.wk.weight": (kv_width, cfg.dim),
        "attention.wv.weight": (kv_width, cfg.dim),
        "attention.wo.weight": (cfg.dim, q_width),
        "feed_forward.w1.weight": (cfg.ffn_dim, cfg.dim),
        "feed_forward.w2.weight": (cfg.dim, cfg.ffn_dim),
        "feed_forward.w3.weight": (cfg.ffn_dim, cfg.dim),
        "attention_norm.weight": (cfg.dim,),
        "ffn_norm.weight": (cfg.dim,),
    }
    shapes: dict[str, tuple[int, ...]] = {"tok_embeddings.weight": (cfg.vocab_size, cfg.dim)}
    for i in range(cfg.n_layers):
        shapes.update({f"layers.{i}.{name}": shape for name, shape in per_block.items()})
    shapes["norm.weight"] = (cfg.dim,)
    if not cfg.tie_embeddings:
        shapes[TIED_OUTPUT] = (cfg.vocab_size, cfg.dim)
    return shapes
