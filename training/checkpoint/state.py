"""What a checkpoint holds: the model and optimizer state in a form DCP can stage, write and read back.

``torch.distributed.checkpoint.state_dict.get_state_dict`` gives the state as FSDP2 holds it. Two kinds of
entries in it would not survive DCP as they are:

1. torchao's FP8 all-gather (``fp8.fsdp_float8_all_gather``) keeps each Float8Linear weight as a DTensor whose
   local shard is a ``WeightWithDynamicFloat8CastTensor``: a wrapper subclass with no storage of its own, its
   values in the high-precision tensor it wraps (``_tensor``). DCP's async staging copies a tensor with
   ``new_empty`` plus a copy of its storage (torch/distributed/checkpoint/_state_dict_stager.py); for a
   wrapper ``new_empty`` returns a plain, uninitialised tensor and there is no storage to copy, so the
   checkpoint is written from uninitialised memory (Transformer Engine fixed the same mechanism for its
   Float8Tensor in NVIDIA/TransformerEngine#2721). The checkpoint is given, instead, a DTensor over the
   wrapped high-precision tensor with the same placement: the same values in the same storage (a load writes
   straight into the parameter), and the same checkpoint as with FP8 all-gather off.
2. Transformer Engine modules keep FP8 scaling metadata (delayed scaling's amax history and scales) in
   ``_extra_state``: a uint8 tensor of pickled bytes whose length is not fixed (empty before the first FP8
   forward). DCP loads a tensor only into one of the size it was saved with, so a fresh model cannot load it
   (NVIDIA/TransformerEngine#1860: "Size mismatch between saved torch.Size([2322]) and current:
   torch.Size([4])"; TE's own FSDP2 DCP test drops these keys for delayed scaling). The checkpoint holds
   those bytes as a ``bytes`` value instead, which DCP writes as a blob of any length, and a load turns them
   back into the tensor ``set_extra_state`` takes. A plain tensor in an FSDP2 state dict is one value for all
   ranks (DCP writes one rank's copy): TE's amax reduction (``reduce_amax``, over the default group unless
   told otherwise) keeps the scaling state the same on every data-parallel rank.

Any other tensor subclass fails the save here, naming the entry, instead of being staged into garbage.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

import torch
from torch import nn
from torch.distributed.checkpoint.state_dict import get_model_state_dict, get_state_dict, set_state_dict
from torch.distributed.tensor import DTensor

from training.env_vars import env_var

EXTRA_STATE_SUFFIX = "._extra_state"  # nn.Module's key for get_extra_state/set_extra_state
# Transformer Engine >= 2.17.1 refuses to unpickle delayed-scaling extra state unless this is "1"
# (transformer_engine/pytorch/_extra_state.py). See load_into for why a resume sets it.
TE_UNSAFE_PICKLE_ENV = "NVTE_ALLOW_UNSAFE_PICKLE_EXTRA_STATE"

State = dict[str, Any]  # {"model": {...}, "optim": {...}}


class UnsupportedCheckpointTensor(TypeError):
    """A state entry DCP cannot stage correctly and this module does not know how to unwrap."""


def build_state(model: nn.Module, optimizer: torch.optim.Optimizer) -> State:
    """The state to save (or to load into: the model's entries share storage with its parameters)."""
    model_sd, optim_sd = get_state_dict(model, optimizer)
    return {"model": _plain_model_state(model_sd), "optim": _plain_tree(optim_sd, "optim")}


def model_state(model: nn.Module) -> dict[str, Any]:
    """The model's part of ``build_state`` alone (its tensors share storage with the parameters, FP8 weight
    wrappers unwrapped): what a load of other weights (training.hf.load) reads into."""
    return _plain_model_state(get_model_state_dict(model))


def load_into(model: nn.Module, optimizer: torch.optim.Optimizer, state: State) -> None:
    """Hand a state that ``dcp.load`` filled (built by ``build_state``) back to the model and optimizer."""
    model_sd = dict(state["model"])
    for key, value in model_sd.items():
        if key.endswith(EXTRA_STATE_SUFFIX):
            model_sd[key] = _bytes_to_extra_state(value, key)
    # Transformer Engine's set_extra_state unpickles delayed-scaling metadata only with its opt-in set. The
    # opt-in adds nothing here: DCP itself unpickles every checkpoint's .metadata and each non-tensor value
    # (torch.load(weights_only=False) in DefaultLoadPlanner.load_bytes), so a checkpoint directory is
    # trusted code either way. It is set only for this call, only when extra state is present.
    has_extra = any(
        k.endswith(EXTRA_STATE_SUFFIX) and isinstance(v, torch.Tensor) and v.numel() for k, v in model_sd.items()
    )
    with env_var(TE_UNSAFE_PICKLE_ENV, "1") if has_extra else contextlib.nullcontext():
        set_state_dict(model, optimizer, model_state_dict=model_sd, optim_state_dict=state["optim"])


def iter_leaves(tree: Any, prefix: str = "") -> Iterator[tuple[str, Any]]:
    """``(dotted key, value)`` for every leaf of a nested dict/list state (DCP's flattened keys)."""
    if isinstance(tree, dict):
        for key, value in tree.items():
            yield from iter_leaves(value, f"{prefix}{key}.")
    elif isinstance(tree, list | tuple):
        for i, value in enumerate(tree):
            yield from iter_leaves(value, f"{prefix}{i}.")
    else:
        yield prefix.rstrip("."), tree


def _plain_model_state(model_sd: dict[str, Any]) -> dict[str, Any]:
    out: dict[str, Any] = {}
    for key, value in model_sd.items():
        if key.endswith(EXTRA_STATE_SUFFIX):
            out[key] = _extra_state_to_bytes(value, key)
        else:
            out[key] = _plain_tree(value, f"model.{key}")
    return out


def _plain_tree(tree: Any, key: str) -> Any:
    """``tree`` with every tensor made one DCP can stage (see the module docstring)."""
    if isinstance(tree, dict):
        return {k: _plain_tree(v, f"{key}.{k}") for k, v in tree.items()}
    if isinstance(tree, list):
        return [_plain_tree(v, f"{key}.{i}") for i, v in enumerate(tree)]
    if isinstance(tree, torch.Tensor):
        return _plain_tensor(tree, key)
    return tree


def _plain_tensor(tensor: torch.Tensor, key: str) -> torch.Tensor:
    if isinstance(tensor, DTensor):
        local = tensor._local_tensor
        if type(local) is torch.Tensor:
            return tensor
        inner = _unwrap_high_precision(local, key)
        # Same mesh, placements and global shape; the local shard is the wrapped tensor itself (a view of
        # the parameter's storage, so dcp.load writes into the parameter).
        return DTensor.from_local(inner, tensor.device_mesh, tensor.placements, run_check=False,
                                  shape=tensor.shape, stride=tensor.stride())
    if type(tensor) in (torch.Tensor, nn.Parameter):  # not isinstance: a Parameter may wrap a subclass
        return tensor
    return _unwrap_high_precision(tensor, key)


def _unwrap_high_precision(tensor: torch.Tensor, key: str) -> torch.Tensor:
    """The high-precision tensor inside a known FP8 weight wrapper; anything else is refused."""
    wrapper = _torchao_weight_wrapper()
    if wrapper is not None and isinstance(tensor, wrapper):
        inner = tensor._tensor
        if type(inner) is not torch.Tensor or inner.shape != tensor.shape or inner.dtype != tensor.dtype:
            raise UnsupportedCheckpointTensor(
                f"checkpoint entry {key}: torchao's {type(tensor).__name__} wraps a "
                f"{type(inner).__name__} {inner.dtype} {tuple(inner.shape)}, expected a plain tensor "
                f"{tensor.dtype} {tuple(tensor.shape)}"
            )
        return inner.detach()
    raise UnsupportedCheckpointTensor(
        f"checkpoint entry {key}: a {type(tensor).__module__}.{type(tensor).__qualname__}, a tensor subclass "
        "that DCP's async staging would copy as uninitialised memory; allowed: plain tensors, DTensors over "
        "plain tensors, torchao's WeightWithDynamicFloat8CastTensor (training/checkpoint/state.py)"
    )


def _torchao_weight_wrapper() -> type | None:
    try:
        from torchao.float8.fsdp_utils import WeightWithDynamicFloat8CastTensor
    except ImportError:  # no torchao: no such tensors either
        return None
    return WeightWithDynamicFloat8CastTensor


def _extra_state_to_bytes(value: Any, key: str) -> Any:
    if not isinstance(value, torch.Tensor):
        return value  # a module whose extra state is already a plain Python value: DCP pickles it as is
    if value.dtype != torch.uint8 or value.dim() != 1:
        raise UnsupportedCheckpointTensor(
            f"checkpoint entry {key}: extra state is a {value.dtype} tensor of shape {tuple(value.shape)}; "
            "allowed: a 1-D uint8 tensor of serialized bytes (Transformer Engine's format)"
        )
    return value.detach().cpu().numpy().tobytes()


def _bytes_to_extra_state(value: Any, key: str) -> Any:
    if isinstance(value, torch.Tensor):
        return value  # the placeholder of a checkpoint without this entry's bytes (not loaded)
    if not isinstance(value, bytes | bytearray):
        return value
    # bytearray: torch.frombuffer needs a writable buffer to hand out a tensor without warnings
    return torch.frombuffer(bytearray(value), dtype=torch.uint8) if value else torch.empty(0, dtype=torch.uint8)
