"""What a checkpoint holds and how it is verified, in one process (a 1-rank gloo group, FSDP2 on a 1-rank
mesh): torchao's FP8 weight wrappers unwrapped to their high-precision tensors, extra state of any length
carried as bytes, and the staged copy checked before DCP writes it. The 2-rank runs (every torchao recipe,
async and SIGTERM checkpoints, a planted non-finite value) are in test_fp8_resume.py."""

from __future__ import annotations

import os

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.api import CheckpointException
from torch.distributed.checkpoint.staging import DefaultStager
from torch.distributed.checkpoint.state_dict import get_state_dict
from torch.distributed.fsdp import fully_shard
from torch.distributed.tensor import DTensor
from torch.utils._pytree import tree_map_only

from training.checkpoint.checkpointer import CheckpointConfig, Checkpointer, CheckpointSaveError
from training.checkpoint.layout import MARKER_FILE
from training.checkpoint.state import TE_UNSAFE_PICKLE_ENV, UnsupportedCheckpointTensor, build_state
from training.checkpoint.verify import CheckpointVerificationError, VerifyingSavePlanner, describe, verify
from training.config.parallel import ParallelConfig
from training.fp8 import Fp8Config, build_fp8_backend
from training.parallel.parallelize import build_data_parallel_mesh
from training.train import build_model

pytestmark = pytest.mark.usefixtures("one_torch_thread")


def torchao_model(dist_info, **fp8_fields):
    pytest.importorskip("torchao")
    fp8 = build_fp8_backend(Fp8Config(backend="torchao", emulate=True, **fp8_fields))
    model = build_model(_tiny(), ParallelConfig(param_dtype="float32"), fp8, dist_info, seed=0)
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randint(0, 320, (2, 16))).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    fp8.post_optimizer_step(model)
    return model, optimizer


def _tiny():
    from training.model import build_model_config

    return build_model_config("tiny")


WQ = "layers.0.attention.wq.weight"


def test_torchao_fp8_all_gather_weights_are_saved_as_their_high_precision_tensors(dist_info):
    from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor

    model, optimizer = torchao_model(dist_info, fsdp_float8_all_gather=True)
    param = model.get_parameter(WQ)
    assert isinstance(param._local_tensor, WeightWithDynamicFloat8CastTensor)  # what DCP staged as garbage
    state = build_state(model, optimizer)
    saved = state["model"][WQ]
    assert isinstance(saved, DTensor) and type(saved._local_tensor) is torch.Tensor
    assert saved.placements == param.placements and saved.shape == param.shape
    # the same storage: a load writes straight into the parameter
    assert saved._local_tensor.data_ptr() == param._local_tensor._tensor.data_ptr()
    for _, value in state["model"].items():
        assert type(value._local_tensor) is torch.Tensor


def test_verification_catches_the_staging_copy_of_a_wrapper_subclass(dist_info, tmp_path):
    # The bug, kept from recurring: the raw state (wrapper subclasses) staged by dcp.async_save is
    # uninitialised memory; the planner's fingerprint check fails the save before anything is written.
    model, optimizer = torchao_model(dist_info, fsdp_float8_all_gather=True)
    model_sd, optim_sd = get_state_dict(model, optimizer)
    raw = {"model": model_sd, "optim": optim_sd}
    planner = VerifyingSavePlanner(describe(raw, fingerprints=True))
    future = dcp.async_save(raw, checkpoint_id=str(tmp_path / "raw"), planner=planner)
    with pytest.raises(CheckpointException, match=r"attention\.w[qkvo]\.weight: (its bits differ|non-finite)"):
        future.result()
    assert not (tmp_path / "raw" / ".metadata").exists()


class Wrapper(torch.Tensor):
    """A minimal wrapper subclass that is not torchao's."""

    @staticmethod
    def __new__(cls, inner):
        return torch.Tensor._make_wrapper_subclass(cls, inner.shape, dtype=inner.dtype)

    def __init__(self, inner):
        self.inner = inner

    @classmethod
    def __torch_dispatch__(cls, func, types, args, kwargs=None):
        if func is torch.ops.aten.detach.default:
            return Wrapper(args[0].inner.detach())
        return func(*tree_map_only(Wrapper, lambda t: t.inner, args),
                    **tree_map_only(Wrapper, lambda t: t.inner, kwargs or {}))


def test_an_unknown_tensor_subclass_is_refused_with_its_key():
    model = nn.Linear(4, 4)
    model.weight = nn.Parameter(Wrapper(torch.zeros(4, 4)))
    optimizer = torch.optim.SGD(model.parameters(), lr=0.1)
    with pytest.raises(UnsupportedCheckpointTensor, match=r"checkpoint entry model\.weight: a .*Wrapper"):
        build_state(model, optimizer)


class VariableExtraState(nn.Linear):
    """Stands in for a Transformer Engine module: its extra state is a uint8 tensor of serialized bytes whose
    length grows once it has run (TE's get_extra_state), empty in a fresh module."""

    def __init__(self):
        super().__init__(16, 16)
        self.history: list[float] = []
        self.env_seen_at_load: str | None = None

    def forward(self, x):
        self.history.append(float(x.detach().sum()))
        return super().forward(x)

    def get_extra_state(self):
        return torch.tensor(bytearray(repr(self.history).encode()) if self.history else [], dtype=torch.uint8)

    def set_extra_state(self, state):
        self.env_seen_at_load = os.environ.get(TE_UNSAFE_PICKLE_ENV)
        self.history = eval(bytes(state.tolist()).decode()) if state.numel() else []


def extra_state_model(dist_info):
    model = nn.Sequential(VariableExtraState(), VariableExtraState())
    fully_shard(model, mesh=build_data_parallel_mesh(dist_info))
    return model, torch.optim.AdamW(model.parameters(), lr=1e-2)


def test_extra_state_of_any_length_survives_an_async_save_and_a_load_into_a_fresh_model(dist_info, tmp_path):
    model, optimizer = extra_state_model(dist_info)
    for _ in range(3):
        model(torch.ones(2, 16)).sum().backward()
        optimizer.step()
    ckpt = Checkpointer(CheckpointConfig(dir=str(tmp_path), async_save=True), rank=0, world_size=1,
                        config_snapshot={})
    ckpt.save(3, model, optimizer, blocking=False)
    ckpt.close()

    fresh, fresh_optimizer = extra_state_model(dist_info)
    assert fresh[0].get_extra_state().numel() == 0  # what made DCP refuse: saved N bytes, current 0
    Checkpointer(CheckpointConfig(), rank=0, world_size=1, config_snapshot={}).load(
        tmp_path / "step-3", fresh, fresh_optimizer)
    assert fresh[0].history == model[0].history and len(fresh[1].history) == 3
    # TE >= 2.17.1 unpickles delayed-scaling state only with its opt-in; set for the load, then restored
    assert fresh[0].env_seen_at_load == "1" and TE_UNSAFE_PICKLE_ENV not in os.environ
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a.full_tensor(), b.full_tensor())


def test_a_planted_non_finite_staged_tensor_fails_the_async_save_and_leaves_no_complete_checkpoint(
        dist_info, tmp_path, monkeypatch):
    stage = DefaultStager.stage

    def stage_and_plant(self, state_dict, **kwargs):
        staged = stage(self, state_dict, **kwargs)
        staged["optim"]["state"][WQ]["exp_avg"]._local_tensor.view(-1)[0] = float("nan")
        return staged

    monkeypatch.setattr(DefaultStager, "stage", stage_and_plant)
    model, optimizer = torchao_model(dist_info, fsdp_float8_all_gather=True)
    live = optimizer.state[model.get_parameter(WQ)]["exp_avg"]
    ckpt = Checkpointer(CheckpointConfig(dir=str(tmp_path), async_save=True), rank=0, world_size=1,
                        config_snapshot={})
    ckpt.save(1, model, optimizer, blocking=False)
    with pytest.raises(CheckpointSaveError, match=rf"checkpoint step 1 failed .*optim\.state\.{WQ}\.exp_avg: "
                                                  r"non-finite values"):
        ckpt.wait()
    assert torch.isfinite(live.full_tensor()).all()  # only the staged copy was planted
    step = tmp_path / "step-1"
    assert not (step / MARKER_FILE).exists() and not (step / ".metadata").exists()
    ckpt.close()


# ---------------------------------------------------------------------------------------------------------
# verify() against describe(), on plain tensors
def plain_state():
    return {"model": {"w": torch.arange(6, dtype=torch.float32).reshape(2, 3), "x": b"abc"},
            "optim": {"state": {"w": {"step": torch.tensor(3.0)}}, "param_groups": [{"lr": 0.1}]}}


@pytest.mark.parametrize(
    ("change", "message"),
    [
        (lambda s: s["model"].__setitem__("w", s["model"]["w"].double()), r"model\.w: dtype torch\.float64"),
        (lambda s: s["model"].__setitem__("w", s["model"]["w"].reshape(3, 2)), r"model\.w: shape \(3, 2\)"),
        (lambda s: s["model"]["w"].__setitem__((0, 0), float("inf")), r"model\.w: non-finite values"),
        (lambda s: s["model"]["w"].__setitem__((1, 2), 5.000001), r"model\.w: its bits differ"),
        (lambda s: s["model"].pop("w"), r"model\.w: missing from the staged state"),
        (lambda s: s["model"].__setitem__("new", torch.zeros(1)), r"model\.new: not in the state"),
        (lambda s: s["model"].__setitem__("x", b"abd"), r"model\.x: .* where the save began"),
        (lambda s: s["optim"]["param_groups"][0].__setitem__("lr", 0.2), r"param_groups\.0\.lr"),
        (lambda s: s["model"].__setitem__("w", s["model"]["w"].to(torch.float8_e4m3fn)), r"no FP8 dtype"),
    ],
)
def test_verify_names_what_differs_from_the_state_the_save_began_with(change, message):
    expected = describe(plain_state(), fingerprints=True)
    verify(plain_state(), expected)  # an identical copy passes
    staged = plain_state()
    change(staged)
    with pytest.raises(CheckpointVerificationError, match=message):
        verify(staged, expected)


def test_without_fingerprints_only_the_form_and_finiteness_are_checked():
    expected = describe(plain_state(), fingerprints=False)
    staged = plain_state()
    staged["model"]["w"][1, 2] = 5.000001
    verify(staged, expected)
    staged["model"]["w"][0, 0] = float("nan")
    with pytest.raises(CheckpointVerificationError, match="non-finite"):
        verify(staged, expected)


def test_finite_values_whose_sum_overflows_are_finite_and_every_width_is_fingerprinted():
    state = {"half": torch.full((8,), 60000.0, dtype=torch.float16),  # the sum overflows float16
             "bf16": torch.linspace(-3, 3, 7, dtype=torch.bfloat16), "flags": torch.tensor([True, False]),
             "f64": torch.arange(3, dtype=torch.float64)}
    expected = describe(state, fingerprints=True)
    verify({k: v.clone() for k, v in state.items()}, expected)
    for key in state:
        staged = {k: v.clone() for k, v in state.items()}
        staged[key].view(torch.uint8)[0] ^= 1  # one flipped bit
        with pytest.raises(CheckpointVerificationError, match=rf"{key}: its bits differ"):
            verify(staged, expected)
