"""The FP8 seam: which linears convert, torchao in emulate mode trains, and TE's start-up errors."""

from __future__ import annotations

import importlib.util
import sys
import types

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from training.errors import ConfigError
from training.fp8 import (
    Fp8Config,
    NoFp8,
    TransformerEngineFp8,
    apply_linear_swap,
    build_fp8_backend,
    describe_fp8,
    fp8_eligible,
    te_unverified_combinations,
)
from training.model import Transformer, build_model_config
from training.parallel.parallelize import apply_activation_checkpointing

pytestmark = pytest.mark.usefixtures("one_torch_thread")

HAS_TE = importlib.util.find_spec("transformer_engine") is not None


def mixed_model() -> Transformer:
    """wq/wk/wv/wo are 64x64 / 64x32 (convertible); the FFN is 200 wide, which FP8 GEMMs cannot take."""
    model = Transformer(build_model_config("tiny", ffn_dim=200))
    model.init_weights(seed=0)
    return model


def linear_types(model: nn.Module) -> dict[str, str]:
    return {fqn: type(m).__name__ for fqn, m in model.named_modules() if isinstance(m, nn.Linear)}


def test_filter_keeps_the_output_head_and_dimensions_not_divisible_by_16():
    model = mixed_model()
    eligible = {fqn for fqn, m in model.named_modules() if fp8_eligible(m, fqn)}
    assert eligible == {f"layers.{i}.attention.{w}" for i in range(2) for w in ("wq", "wk", "wv", "wo")}
    assert not fp8_eligible(nn.Linear(64, 64), "output")
    assert not fp8_eligible(nn.Linear(64, 64), "layers.0.output")  # any module named output
    assert fp8_eligible(nn.Linear(32, 48), "x.proj")
    assert not fp8_eligible(nn.Linear(32, 40), "x.proj")
    assert not fp8_eligible(nn.LayerNorm(32), "x.norm")


def test_torchao_emulate_converts_exactly_the_eligible_linears():
    model = mixed_model()
    backend = build_fp8_backend(Fp8Config(backend="torchao", emulate=True))
    backend.convert(model)
    types_ = linear_types(model)
    assert types_["output"] == "Linear"
    for i in range(2):
        for w in ("wq", "wk", "wv", "wo"):
            assert types_[f"layers.{i}.attention.{w}"] == "Float8Linear"
        for w in ("w1", "w2", "w3"):
            assert types_[f"layers.{i}.feed_forward.{w}"] == "Linear"
    assert backend.name == "torchao"


@pytest.mark.parametrize("recipe", ["tensorwise", "rowwise"])
def test_torchao_emulate_forward_backward_stays_close_to_bf16_free_reference(recipe):
    reference = Transformer(build_model_config("tiny"))
    reference.init_weights(seed=0)
    model = Transformer(build_model_config("tiny"))
    model.load_state_dict(reference.state_dict())
    build_fp8_backend(Fp8Config(backend="torchao", emulate=True, torchao_recipe=recipe)).convert(model)
    assert "Float8Linear" in linear_types(model).values()
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    logits = model(tokens[:, :-1])
    expected = reference(tokens[:, :-1])
    # FP8 (e4m3: 3 mantissa bits) perturbs the logits, but only a little
    assert 0 < (logits - expected).abs().max() < 0.05 * expected.abs().max()
    loss = F.cross_entropy(logits.flatten(0, 1), tokens[:, 1:].flatten())
    loss.backward()
    grad = model.layers[0].attention.wq.weight.grad
    assert grad is not None and torch.isfinite(grad).all() and grad.abs().sum() > 0


def test_torchao_without_emulate_on_a_cpu_fails_at_start_up():
    if torch.cuda.is_available():
        pytest.skip("this machine has a GPU")
    with pytest.raises(ConfigError, match=r"fp8.backend='torchao': needs a CUDA GPU .* set fp8.emulate=true"):
        build_fp8_backend(Fp8Config(backend="torchao"))


@pytest.mark.skipif(HAS_TE, reason="Transformer Engine is installed here")
def test_te_missing_fails_at_start_up_with_the_install_command():
    with pytest.raises(ConfigError) as excinfo:
        build_fp8_backend(Fp8Config(backend="te"))
    message = str(excinfo.value)
    assert message.startswith("fp8.backend='te': Transformer Engine is not importable")
    assert 'pip install --no-build-isolation "transformer_engine[pytorch]>=2.16"' in message


def test_te_older_than_2_16_is_refused(monkeypatch):
    """The version gate, with a stand-in module: TE itself cannot be installed on this CPU machine."""
    fake = types.ModuleType("transformer_engine")
    fake.__version__ = "2.15.0+abc"
    fake.pytorch = types.ModuleType("transformer_engine.pytorch")
    monkeypatch.setitem(sys.modules, "transformer_engine", fake)
    monkeypatch.setitem(sys.modules, "transformer_engine.pytorch", fake.pytorch)
    with pytest.raises(
        ConfigError, match=r"Transformer Engine 2.15.0\+abc is too old for FSDP2; allowed: >= 2.16"
    ):
        build_fp8_backend(Fp8Config(backend="te"))


def test_linear_swap_used_by_te_replaces_only_eligible_linears():
    class Swapped(nn.Linear):
        pass

    model = mixed_model()
    swapped = apply_linear_swap(model, lambda lin: Swapped(lin.in_features, lin.out_features, bias=False))
    assert sorted(swapped) == sorted(
        f"layers.{i}.attention.{w}" for i in range(2) for w in ("wq", "wk", "wv", "wo")
    )
    types_ = linear_types(model)
    assert types_["layers.1.attention.wk"] == "Swapped" and types_["layers.1.feed_forward.w2"] == "Linear"
    assert types_["output"] == "Linear"
    assert model(torch.zeros(1, 4, dtype=torch.long)).shape == (1, 4, 320)


def test_none_backend_changes_nothing():
    model = mixed_model()
    before = linear_types(model)
    backend = build_fp8_backend(Fp8Config())
    backend.convert(model)
    assert isinstance(backend, NoFp8) and linear_types(model) == before
    with backend.autocast():
        model(torch.zeros(1, 3, dtype=torch.long))


@pytest.mark.parametrize(
    ("kwargs", "message"),
    [
        ({"backend": "fp4"}, "fp8.backend='fp4': allowed: none, torchao, te"),
        ({"torchao_recipe": "blockwise"}, "fp8.torchao_recipe='blockwise': allowed: tensorwise, rowwise"),
        ({"te_recipe": "mxfp8"}, "fp8.te_recipe='mxfp8': allowed: delayed, current"),
        ({"te_amax_history_len": 0}, "fp8.te_amax_history_len=0: allowed: an integer >= 1"),
        ({"backend": "te", "emulate": True}, "fp8.emulate=True: allowed only with fp8.backend='torchao'"),
    ],
)
def test_invalid_fp8_config_names_the_field(kwargs, message):
    with pytest.raises(ConfigError) as excinfo:
        Fp8Config(**kwargs).validate()
    assert str(excinfo.value).startswith(message)


# ---------------------------------------------------------------------------------------------------------
# Transformer Engine's activation checkpointing and the start-up report, with a stand-in for TE's module:
# TE itself cannot be installed on this CPU machine (the real thing: benchmarks/te_checkpoint_check.py).
def te_backend_with(fake_te) -> TransformerEngineFp8:
    backend = TransformerEngineFp8.__new__(TransformerEngineFp8)  # __init__ needs an FP8 GPU
    backend.te = fake_te
    return backend


def test_te_activation_checkpointing_recomputes_blocks_through_te_checkpoint():
    calls = []

    def te_checkpoint(function, *args, use_reentrant=True, **kwargs):
        calls.append((function, use_reentrant))
        return torch.utils.checkpoint.checkpoint(function, *args, use_reentrant=use_reentrant, **kwargs)

    fn = te_backend_with(types.SimpleNamespace(checkpoint=te_checkpoint)).activation_checkpoint_fn()
    reference = Transformer(build_model_config("tiny"))
    reference.init_weights(seed=0)
    model = Transformer(build_model_config("tiny"))
    model.load_state_dict(reference.state_dict())
    for i, block in enumerate(model.layers):
        model.layers[i] = apply_activation_checkpointing(block, checkpoint_fn=fn)
    tokens = torch.randint(0, 256, (2, 16), generator=torch.Generator().manual_seed(0))
    model(tokens).sum().backward()
    reference(tokens).sum().backward()
    # every block went through TE's checkpoint, non-reentrant (TE's FSDP example), once per forward
    assert [(type(f).__name__, r) for f, r in calls] == [("TransformerBlock", False)] * 2
    # same FQNs once checkpoint_wrapper's prefix is dropped (what DCP's state_dict helpers do), same grads
    grads = {n.replace("_checkpoint_wrapped_module.", ""): p.grad for n, p in model.named_parameters()}
    for name, param in reference.named_parameters():
        torch.testing.assert_close(grads[name], param.grad)


def test_torchao_and_none_recompute_with_torch_checkpoint():
    assert build_fp8_backend(Fp8Config()).activation_checkpoint_fn() is None
    assert build_fp8_backend(Fp8Config(backend="torchao", emulate=True)).activation_checkpoint_fn() is None


def test_the_te_combinations_not_verified_on_a_gpu_are_named():
    assert te_unverified_combinations(Fp8Config(backend="torchao"), activation_checkpointing=True) == []
    names = te_unverified_combinations(Fp8Config(backend="te", te_recipe="delayed"), activation_checkpointing=True)
    assert names == [
        "te_recipe=delayed: save and resume through DCP (FP8 metadata in _extra_state carried as bytes)",
        "te_recipe=delayed: activation checkpointing through te.checkpoint under FSDP2",
    ]
    current = te_unverified_combinations(Fp8Config(backend="te", te_recipe="current"), activation_checkpointing=False)
    assert [n.split(":")[0] for n in current] == ["te_recipe=current"]


def test_the_start_up_line_says_the_dtypes_the_run_computes_in():
    # issue 28: a float32 run (tiny-cpu.toml) said "fp8: none (bf16 matmuls)"
    assert describe_fp8(Fp8Config(), param_dtype="float32", reduce_dtype="float32") == (
        "none (matmuls in float32; gradients reduced in float32, weights kept in float32)")
    assert describe_fp8(Fp8Config(), param_dtype="bfloat16", reduce_dtype="float32") == (
        "none (matmuls in bfloat16; gradients reduced in float32, weights kept in float32)")
    line = describe_fp8(Fp8Config(backend="torchao", emulate=True), param_dtype="bfloat16", reduce_dtype="float32")
    assert line.startswith("torchao ") and line.endswith(
        " (tensorwise, emulate; other matmuls in bfloat16; gradients reduced in float32, weights kept in float32)")
