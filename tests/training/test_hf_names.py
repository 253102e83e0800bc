"""The Hugging Face name table and config.json mapping, both ways, and the [init] / [export] settings (no torch
model, no files but a config.json)."""

from __future__ import annotations

import pytest

from training.config import load_config
from training.config.sections import ModelConfig
from training.errors import ConfigError
from training.hf.config import hf_config, model_config_from_hf, same_shape
from training.hf.names import expected_shapes, from_hf, to_hf
from training.shapes import count_params

# Meta's published Llama-3.1-8B config.json (the older way of writing RoPE: top-level rope_theta, rope_scaling)
LLAMA_31_8B = {
    "architectures": ["LlamaForCausalLM"], "attention_bias": False, "attention_dropout": 0.0, "bos_token_id": 128000,
    "eos_token_id": 128001, "hidden_act": "silu", "hidden_size": 4096, "initializer_range": 0.02,
    "intermediate_size": 14336, "max_position_embeddings": 131072, "mlp_bias": False, "model_type": "llama",
    "num_attention_heads": 32, "num_hidden_layers": 32, "num_key_value_heads": 8, "pretraining_tp": 1,
    "rms_norm_eps": 1e-05, "rope_scaling": {"factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                                            "original_max_position_embeddings": 8192, "rope_type": "llama3"},
    "rope_theta": 500000.0, "tie_word_embeddings": False, "torch_dtype": "bfloat16", "transformers_version": "4.43.0",
    "use_cache": True, "vocab_size": 128256,
}


def test_the_table_reads_both_ways():
    assert to_hf("layers.7.attention.wq.weight") == "model.layers.7.self_attn.q_proj.weight"
    assert to_hf("layers.0.feed_forward.w2.weight") == "model.layers.0.mlp.down_proj.weight"
    assert to_hf("layers.0.feed_forward.w1.weight") == "model.layers.0.mlp.gate_proj.weight"
    assert to_hf("layers.3.ffn_norm.weight") == "model.layers.3.post_attention_layernorm.weight"
    assert to_hf("output.weight") == "lm_head.weight" and to_hf("tok_embeddings.weight") == "model.embed_tokens.weight"
    names = expected_shapes(ModelConfig(n_layers=3))
    assert len(names) == 3 * 9 + 3
    assert all(from_hf(to_hf(name)) == name for name in names)
    assert len({to_hf(name) for name in names}) == len(names)
    with pytest.raises(KeyError, match="'layers.0.attention.bias' is not a Llama parameter name"):
        to_hf("layers.0.attention.bias")


def test_a_tied_model_has_no_output_head_in_the_files():
    tied = expected_shapes(ModelConfig(tie_embeddings=True))
    assert "output.weight" not in tied and "tok_embeddings.weight" in tied
    assert count_params(ModelConfig(tie_embeddings=True)) == count_params(ModelConfig()) - 256 * 64


def test_a_published_config_gives_the_preset_shape_with_rope_scaling():
    cfg = model_config_from_hf(LLAMA_31_8B, "config.json")
    assert (cfg.dim, cfg.n_layers, cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim, cfg.vocab_size) == (
        4096, 32, 32, 8, 14336, 128256)
    assert (cfg.rope_theta, cfg.norm_eps, cfg.tie_embeddings) == (500000.0, 1e-5, False)
    assert (cfg.rope_scaling, cfg.rope_scaling_factor, cfg.rope_low_freq_factor, cfg.rope_high_freq_factor,
            cfg.rope_original_max_positions) == ("llama3", 8.0, 1.0, 4.0, 8192)
    # transformers 5 writes the same RoPE as rope_parameters: read the same
    v5 = {k: v for k, v in LLAMA_31_8B.items() if k not in ("rope_theta", "rope_scaling")}
    v5["rope_parameters"] = {**LLAMA_31_8B["rope_scaling"], "rope_theta": 500000.0}
    assert model_config_from_hf(v5, "config.json") == cfg


def test_written_configs_read_back_to_the_same_shape():
    cfg = model_config_from_hf(LLAMA_31_8B, "config.json")
    written = hf_config(cfg, LLAMA_31_8B)
    assert written == {**LLAMA_31_8B, "head_dim": 128}  # the init directory's, unchanged (torch_dtype kept)
    made = hf_config(cfg)  # no init directory: a whole config.json
    assert made["model_type"] == "llama" and made["dtype"] == "bfloat16" and made["max_position_embeddings"] == 65536
    assert same_shape(model_config_from_hf(made, "x"), cfg)
    tied = ModelConfig(tie_embeddings=True, rope_theta=10.0, norm_eps=1e-6)
    assert model_config_from_hf(hf_config(tied), "x") == tied


@pytest.mark.parametrize(("change", "message"), [
    ({"mlp_bias": True}, "config.json: mlp_bias=True: not supported by this trainer; allowed: false (no biases)"),
    ({"hidden_act": "gelu"}, "config.json: hidden_act='gelu': not supported by this trainer; allowed: 'silu'"),
    ({"sliding_window": 4096}, "config.json: sliding_window=4096: not supported by this trainer; allowed: none"),
    ({"head_dim": 64}, "config.json: head_dim=64: not supported by this trainer; allowed: hidden_size / "
                       "num_attention_heads = 128"),
    ({"rope_scaling": {"rope_type": "linear", "factor": 2.0}},
     "config.json: rope_scaling.rope_type='linear': not supported by this trainer; allowed: 'default', 'llama3'"),
    ({"num_key_value_heads": 5}, "config.json: num_key_value_heads=5: allowed: a divisor of num_attention_heads"),
    ({"quantization_config": {"quant_method": "fbgemm_fp8"}}, "config.json: quantization_config="),
    ({"hidden_size": None}, "config.json: hidden_size=None: allowed: an integer >= 1"),
])
def test_an_unsupported_field_is_refused_naming_it(change, message):
    with pytest.raises(ConfigError) as err:
        model_config_from_hf({**LLAMA_31_8B, **change}, "config.json")
    assert str(err.value).startswith(message)


def test_the_init_and_export_settings():
    cfg = load_config("llama3-8b", ["init.hf_dir=/fsx/data/Llama-3.1-8B", "export.hf_dir=/fsx/out"])
    assert (cfg.init.hf_dir, cfg.export.hf_dir, cfg.model.preset) == ("/fsx/data/Llama-3.1-8B", "/fsx/out", "llama3-8b")
    # an absolute directory stays; a relative one is under the job's own checkpoint directory (all a job may write)
    assert cfg.export.resolve("/fsx/checkpoints/j-1") == "/fsx/out"
    relative = load_config("llama3-8b", ["export.hf_dir=hf-final"]).export
    assert relative.resolve("/fsx/checkpoints/j-1") == "/fsx/checkpoints/j-1/hf-final"
    with pytest.raises(ConfigError, match=r"^model\.dim: not allowed with init\.hf_dir \(the model's shape comes "
                                          r"from its config\.json\); allowed: model\.preset"):
        load_config("llama3-8b", ["init.hf_dir=/x", "model.dim=1024"])
    with pytest.raises(ConfigError, match=r"^export\.hf_dir='/out': needs checkpoint\.dir set and "):
        load_config(None, ["export.hf_dir=/out"])
    with pytest.raises(ConfigError, match=r"^model\.rope_scaling='yarn': allowed: '' \(none\), 'llama3'$"):
        load_config(None, ["model.rope_scaling=yarn"])
