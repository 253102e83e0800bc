"""A Hugging Face Llama ``config.json`` <-> the model's shape (training.config.sections.ModelConfig).

Reading refuses, in one line naming the field, whatever training.model.Transformer would compute differently:
another model_type or activation, biases, a rope type other than the default and "llama3", sliding windows,
mixture-of-experts fields, a head_dim other than hidden_size / num_attention_heads, dropout, quantized
weights. Both ways of writing RoPE are read: transformers 5's ``rope_parameters`` ({"rope_type", "rope_theta",
"factor", ...}) and the older top-level ``rope_theta`` with ``rope_scaling`` (Meta's published Llama 3.1/3.2
config.json files). No torch here.
"""

from __future__ import annotations

import json
import math
from dataclasses import replace
from pathlib import Path
from typing import Any

from training.config.sections import MODEL_PRESETS, ModelConfig
from training.errors import ConfigError

CONFIG_FILE = "config.json"
# (ModelConfig field, config.json key) of the integer shape: each required, each >= 1
_INT_FIELDS = (
    ("dim", "hidden_size"),
    ("n_layers", "num_hidden_layers"),
    ("n_heads", "num_attention_heads"),
    ("ffn_dim", "intermediate_size"),
    ("vocab_size", "vocab_size"),
)
HF_NAMES = {**dict(_INT_FIELDS), "n_kv_heads": "num_key_value_heads", "rope_theta": "rope_theta",
            "norm_eps": "rms_norm_eps", "tie_embeddings": "tie_word_embeddings"}
# Mixture-of-experts keys of the Llama-like families (Mixtral, Llama 4, DeepSeek, Qwen MoE)
_MOE_KEYS = ("num_local_experts", "num_experts", "num_experts_per_tok", "n_routed_experts", "moe_intermediate_size",
             "num_experts_per_token")
_ROPE_DEFAULTS = {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                  "original_max_position_embeddings": 8192}


def read_hf_config(hf_dir: str | Path) -> dict[str, Any]:
    """The parsed config.json of a model directory; a ConfigError naming the file when it is absent or no JSON."""
    path = Path(hf_dir) / CONFIG_FILE
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        raise ConfigError(f"init.hf_dir={str(hf_dir)!r}: no {CONFIG_FILE}; allowed: a Hugging Face model "
                          "directory (config.json, *.safetensors, model.safetensors.index.json)") from None
    except (OSError, ValueError) as exc:
        raise ConfigError(f"{path}: unreadable ({exc}); allowed: a Hugging Face config.json") from None
    if not isinstance(data, dict):
        raise ConfigError(f"{path}: allowed: a JSON object")
    return data


def model_config_from_hf(hf: dict[str, Any], source: str, *, init_std: float = 0.02) -> ModelConfig:
    """The ModelConfig of a Llama config.json (``source`` names it in errors). Unsupported fields are refused."""

    def refuse(key: str, allowed: str) -> ConfigError:
        return ConfigError(f"{source}: {key}={hf.get(key)!r}: not supported by this trainer; allowed: {allowed}")

    if hf.get("model_type") != "llama":
        raise refuse("model_type", "'llama' (LlamaForCausalLM)")
    if hf.get("hidden_act", "silu") != "silu":
        raise refuse("hidden_act", "'silu' (SwiGLU)")
    for key in ("attention_bias", "mlp_bias"):
        if hf.get(key, False) is not False:
            raise refuse(key, "false (no biases)")
    if hf.get("sliding_window") is not None or hf.get("use_sliding_window", False):
        raise refuse("sliding_window" if hf.get("sliding_window") is not None else "use_sliding_window",
                     "none (full causal attention)")
    for key in _MOE_KEYS:
        if hf.get(key) not in (None, 0):
            raise refuse(key, "absent (a dense model, no mixture of experts)")
    if hf.get("quantization_config") is not None:
        raise refuse("quantization_config", "absent (bf16, fp16 or fp32 weights)")
    if float(hf.get("attention_dropout", 0.0) or 0.0) != 0.0:
        raise refuse("attention_dropout", "0.0")

    shape: dict[str, Any] = {}
    for name, key in _INT_FIELDS:
        value = hf.get(key)
        if not _is_int(value) or value < 1:
            raise ConfigError(f"{source}: {key}={value!r}: allowed: an integer >= 1")
        shape[name] = value
    kv_heads = hf.get("num_key_value_heads") or shape["n_heads"]  # absent or null: one kv head per query head
    if not _is_int(kv_heads) or kv_heads < 1 or shape["n_heads"] % kv_heads:
        raise ConfigError(f"{source}: num_key_value_heads={kv_heads!r}: allowed: a divisor of "
                          f"num_attention_heads ({shape['n_heads']})")
    shape["n_kv_heads"] = kv_heads
    if shape["dim"] % shape["n_heads"]:
        raise ConfigError(f"{source}: num_attention_heads={shape['n_heads']}: allowed: a divisor of hidden_size "
                          f"({shape['dim']})")
    head_dim = hf.get("head_dim")
    if head_dim is not None and head_dim != shape["dim"] // shape["n_heads"]:
        raise refuse("head_dim", f"hidden_size / num_attention_heads = {shape['dim'] // shape['n_heads']}")
    eps = hf.get("rms_norm_eps", 1e-6)  # LlamaConfig's default
    if not _is_positive(eps):
        raise ConfigError(f"{source}: rms_norm_eps={eps!r}: allowed: a number > 0")
    shape["norm_eps"] = float(eps)
    tied = hf.get("tie_word_embeddings", False)
    if not isinstance(tied, bool):
        raise ConfigError(f"{source}: tie_word_embeddings={tied!r}: allowed: true, false")
    shape["tie_embeddings"] = tied
    shape.update(_rope(hf, source))
    cfg = ModelConfig(preset="", init_std=init_std, **shape)
    try:
        cfg.validate()
    except ConfigError as exc:
        raise ConfigError(f"{source}: {exc}") from None
    return cfg


def _rope(hf: dict[str, Any], source: str) -> dict[str, Any]:
    """RoPE fields from ``rope_parameters`` (transformers 5) or ``rope_theta`` + ``rope_scaling`` (older)."""
    key = "rope_parameters" if hf.get("rope_parameters") is not None else "rope_scaling"
    params = hf.get(key) or {}
    if not isinstance(params, dict):
        raise ConfigError(f"{source}: {key}={params!r}: allowed: an object, or null")
    theta = params.get("rope_theta", hf.get("rope_theta", 10000.0))
    if not _is_positive(theta):
        raise ConfigError(f"{source}: rope_theta={theta!r}: allowed: a number > 0")
    rope_type = params.get("rope_type", params.get("type", "default"))
    if rope_type == "default":
        return {"rope_theta": float(theta), "rope_scaling": ""}
    if rope_type != "llama3":
        raise ConfigError(f"{source}: {key}.rope_type={rope_type!r}: not supported by this trainer; allowed: "
                          "'default', 'llama3'")
    fields = {}
    for hf_key, ours in (("factor", "rope_scaling_factor"), ("low_freq_factor", "rope_low_freq_factor"),
                         ("high_freq_factor", "rope_high_freq_factor"),
                         ("original_max_position_embeddings", "rope_original_max_positions")):
        value = params.get(hf_key, _ROPE_DEFAULTS[hf_key])
        if not _is_positive(value):
            raise ConfigError(f"{source}: {key}.{hf_key}={value!r}: allowed: a number > 0")
        fields[ours] = int(value) if ours == "rope_original_max_positions" else float(value)
    return {"rope_theta": float(theta), "rope_scaling": "llama3", **fields}


def check_preset(preset: str, cfg: ModelConfig, source: str) -> None:
    """A [model] preset named beside init.hf_dir must describe the same shape as its config.json."""
    if not preset:
        return
    for name, value in MODEL_PRESETS[preset].items():
        if getattr(cfg, name) != value:
            raise ConfigError(
                f"model.preset={preset!r} has {name}={value!r}, but {source} has {HF_NAMES[name]}="
                f"{getattr(cfg, name)!r}; allowed: a preset of the same shape, or model.preset='' (the shape "
                "from config.json alone)"
            )


def hf_config(cfg: ModelConfig, base: dict[str, Any] | None = None) -> dict[str, Any]:
    """A config.json for ``cfg``: ``base`` (the init directory's config.json) with the shape and dtype set in
    its own way of writing RoPE, or a complete Llama config.json when there is none."""
    out: dict[str, Any] = dict(base) if base else {
        "architectures": ["LlamaForCausalLM"], "model_type": "llama", "hidden_act": "silu",
        "attention_bias": False, "mlp_bias": False, "attention_dropout": 0.0, "initializer_range": cfg.init_std,
        "max_position_embeddings": (int(cfg.rope_original_max_positions * cfg.rope_scaling_factor)
                                    if cfg.rope_scaling else 8192),
        "pretraining_tp": 1, "use_cache": True,
    }
    out.update({HF_NAMES[name]: getattr(cfg, name) for name in HF_NAMES if name != "rope_theta"})
    out["head_dim"] = cfg.head_dim
    scaling = None if not cfg.rope_scaling else {
        "rope_type": "llama3", "factor": cfg.rope_scaling_factor, "low_freq_factor": cfg.rope_low_freq_factor,
        "high_freq_factor": cfg.rope_high_freq_factor,
        "original_max_position_embeddings": cfg.rope_original_max_positions,
    }
    if "rope_parameters" in out:
        out["rope_parameters"] = {"rope_type": "default", **(scaling or {}), "rope_theta": cfg.rope_theta}
    else:
        out["rope_theta"], out["rope_scaling"] = cfg.rope_theta, scaling
    out.pop("torch_dtype", None)
    out["dtype" if base is None or "dtype" in base else "torch_dtype"] = "bfloat16"  # the shards' dtype
    return out


def same_shape(a: ModelConfig, b: ModelConfig) -> bool:
    """Whether two configs build the same model (everything but the preset's name and init_std)."""
    return replace(a, preset="", init_std=0.0) == replace(b, preset="", init_std=0.0)


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_positive(value: object) -> bool:
    return isinstance(value, int | float) and not isinstance(value, bool) and math.isfinite(value) and value > 0
