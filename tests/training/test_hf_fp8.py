"""The Hugging Face load into a model whose linears torchao's FP8 conversion swapped before sharding (the build
order), with FSDP2's FP8 all-gather wrapping each weight: the names still match and the values arrive."""

from __future__ import annotations

import pytest
import torch

from tests.hf_support import read_safetensors_dir, save_tiny_llama
from training.checkpoint.state import model_state
from training.config import load_config
from training.fp8 import build_fp8_backend
from training.hf.load import load_hf_weights, resolve_init_model
from training.hf.names import to_hf
from training.train import build_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def test_torchao_float8_linears_load_their_weights(dist_info, tmp_path):
    pytest.importorskip("torchao.float8")
    hf_dir = save_tiny_llama("llama3_1", tmp_path / "model")
    cfg = resolve_init_model(load_config(None, [f"init.hf_dir={hf_dir}", "model.preset=", "fp8.backend=torchao",
                                                "fp8.emulate=true", "fp8.fsdp_float8_all_gather=true"]))
    model = build_model(cfg.model, cfg.parallel, build_fp8_backend(cfg.fp8), dist_info, seed=0)
    assert type(model.layers[0].attention.wq).__name__ == "Float8Linear"
    assert type(model.layers[0].attention.wq.weight._local_tensor).__name__ == "WeightWithDynamicFloat8CastTensor"
    load_hf_weights(model, cfg, rank=dist_info.rank)
    stored = read_safetensors_dir(hf_dir)
    state = model_state(model)
    for name, value in state.items():
        assert torch.equal(value.full_tensor(), stored[to_hf(name)].float()), name
    assert len(state) == len(stored)
