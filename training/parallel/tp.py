"""Tensor parallelism with DTensor's ``parallelize_module``, in the plan the field uses (torchtitan's
llama3 apply_tp, Megatron-LM's split): in each block q/k/v and the MLP's gate/up projections (w1, w3) are
column-wise (each rank computes heads / tp of the heads and ffn_dim / tp of the MLP), the attention output
and the MLP's down projection (wo, w2) row-wise; sequence parallelism on the norms, so the residual stream
between the blocks is split along the sequence (Shard(1)) and each row-wise output is a reduce-scatter, not
an all-reduce. The embedding is split by vocabulary rows and the output head by vocabulary columns with its
logits left sharded (Shard(-1)): the loss is computed vocabulary-parallel (``loss_parallel``), so the
full-vocabulary logits never exist on one rank. Tied embeddings stay one parameter: both modules shard the
weight by rows (Shard(0)), so the output head takes the embedding's DTensor back after the plan is applied.

FP8 (torchao, tensorwise scaling): the block's linears use torchao's Float8 column/row-wise styles, which
cast before the collectives so the all-gathers move FP8 (torchtitan's float8 TP); the output head stays in
bf16 (training.fp8.HIGH_PRECISION_MODULES). gloo has no FP8 dtypes, so on the CPU those styles are refused
(rowwise scaling runs under the plain styles there, as on a GPU).
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterator
from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.tensor import Replicate, Shard
from torch.distributed.tensor.parallel import (
    ColwiseParallel,
    PrepareModuleInput,
    RowwiseParallel,
    SequenceParallel,
    loss_parallel,
    parallelize_module,
)

from training.errors import ConfigError


def root_plan() -> dict[str, Any]:
    """The styles of the modules outside the blocks (module name -> style)."""
    return {
        "tok_embeddings": RowwiseParallel(input_layouts=Replicate(), output_layouts=Shard(1)),
        "norm": SequenceParallel(),
        # logits stay sharded by vocabulary (a DTensor) for the loss_parallel cross-entropy
        "output": ColwiseParallel(input_layouts=Shard(1), output_layouts=Shard(-1), use_local_output=False),
    }


def block_plan(*, float8: bool) -> dict[str, Any]:
    """The styles inside one transformer block (submodule name -> style). ``float8``: torchao's FP8 styles for
    the linears (the model was converted to Float8Linear with tensorwise scaling)."""
    colwise, rowwise, prepare_input = _styles(float8)
    return {
        "attention_norm": SequenceParallel(),
        # the attention takes (x, cos, sin): x is gathered from its sequence shards, the rope tables are local
        "attention": prepare_input(input_layouts=(Shard(1), None, None),
                                   desired_input_layouts=(Replicate(), None, None)),
        "attention.wq": colwise(),
        "attention.wk": colwise(),
        "attention.wv": colwise(),
        "attention.wo": rowwise(output_layouts=Shard(1)),
        "ffn_norm": SequenceParallel(),
        "feed_forward": prepare_input(input_layouts=(Shard(1),), desired_input_layouts=(Replicate(),)),
        "feed_forward.w1": colwise(),
        "feed_forward.w2": rowwise(output_layouts=Shard(1)),
        "feed_forward.w3": colwise(),
    }


def apply_tp(model: nn.Module, tp_mesh: DeviceMesh, *, float8: bool = False) -> None:
    """Split ``model`` (a training.model.Transformer, before any other wrapping) over ``tp_mesh`` in place."""
    if float8 and tp_mesh.device_type == "cpu":  # every rank alike, before any collective of the styles
        raise ConfigError(f"fp8.torchao_recipe='tensorwise': with parallel.tp={tp_mesh.size()} on the CPU its Float8 "
                          "styles all-gather FP8 tensors, which gloo cannot; allowed: fp8.torchao_recipe='rowwise' "
                          "(the plain styles), or a GPU")
    tied = model.output.weight is model.tok_embeddings.weight
    parallelize_module(model, tp_mesh, root_plan())
    if tied:  # each style distributed its own copy: one parameter again (both are Shard(0) on tp_mesh)
        model.output.weight = model.tok_embeddings.weight
    for block in model.layers:
        parallelize_module(block, tp_mesh, block_plan(float8=float8))


@contextlib.contextmanager
def maybe_loss_parallel(enabled: bool) -> Iterator[None]:
    """Around the loss and its backward when the logits are vocabulary-sharded (tp > 1): cross_entropy then
    reduces the log-sum-exp across the tp ranks instead of gathering the logits."""
    with loss_parallel() if enabled else contextlib.nullcontext():
        yield


def _styles(float8: bool) -> tuple[Any, Any, Any]:
    if not float8:
        return ColwiseParallel, RowwiseParallel, PrepareModuleInput
    from torchao.float8.float8_tensor_parallel import (  # only with fp8.backend = torchao
        Float8ColwiseParallel,
        Float8RowwiseParallel,
        PrepareFloat8ModuleInput,
    )

    return Float8ColwiseParallel, Float8RowwiseParallel, PrepareFloat8ModuleInput
