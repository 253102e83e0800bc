"""Tiny random Hugging Face Llama models, one of each kind the trainer imports (no download): saved with
transformers' save_pretrained in bf16 with a small max_shard_size, so each directory has several safetensors
files and an index. Shared by the tests/training/test_hf_*.py modules."""

from __future__ import annotations

from pathlib import Path

import torch

VOCAB = 320  # the tiny-cpu preset's vocabulary
SHAPE = dict(hidden_size=64, intermediate_size=96, num_hidden_layers=2, num_attention_heads=4, num_key_value_heads=2,
             vocab_size=VOCAB, rms_norm_eps=1e-5, max_position_embeddings=256)
# Llama 3.0 style (grouped-query attention), 3.1 (rope_scaling "llama3"), 3.2 (tied embeddings and llama3 scaling
# with factor 32, as the published 3.2 1B/3B). original_max_position_embeddings is small so the scaling changes
# the frequencies a 32-token window uses.
KINDS = {
    "llama3_0": dict(rope_theta=500000.0),
    "llama3_1": dict(rope_theta=500000.0, rope_scaling={
        "rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}),
    "llama3_2": dict(rope_theta=500000.0, tie_word_embeddings=True, rope_scaling={
        "rope_type": "llama3", "factor": 32.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
        "original_max_position_embeddings": 16}),
}
TOKENIZER_JSON = '{"version": "1.0", "model": {"type": "WordLevel", "vocab": {"a": 0}, "unk_token": "a"}}\n'


def save_tiny_llama(kind: str, out: Path, *, seed: int = 0) -> Path:
    """A random LlamaForCausalLM of ``kind`` (a KINDS key) saved to ``out`` in bf16, about 6 files, plus a
    tokenizer.json for the copy to the export to carry along."""
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**SHAPE, **KINDS[kind])).to(torch.bfloat16)
    with torch.no_grad():  # norms away from 1, so a norm loaded in the wrong place shows in the logits
        for name, param in model.named_parameters():
            if "norm" in name:
                param.uniform_(0.5, 1.5)
    model.save_pretrained(out, max_shard_size="40KB")
    (out / "tokenizer.json").write_text(TOKENIZER_JSON)
    return out


def hf_logits(model_dir: Path, tokens: torch.Tensor) -> torch.Tensor:
    """transformers' float32 logits of the model in ``model_dir`` on ``tokens`` [B, T]."""
    from transformers import AutoModelForCausalLM

    model = AutoModelForCausalLM.from_pretrained(model_dir, dtype=torch.float32).eval()
    with torch.no_grad():
        return model(tokens).logits


def read_safetensors_dir(model_dir: Path) -> dict[str, torch.Tensor]:
    """Every tensor of a directory's safetensors files, by name."""
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(model_dir.glob("*.safetensors")):
        tensors.update(load_file(path))
    return tensors
