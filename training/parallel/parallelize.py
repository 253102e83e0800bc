"""The layout applied to the plain model, in torchtitan's order, written once: tensor parallelism ->
activation checkpointing -> per-block torch.compile -> FSDP2 ``fully_shard`` per transformer block, then the
root. TP comes first because it replaces the linears' weights with DTensors on the tp mesh, which FSDP2 then
shards again on the data-parallel mesh; checkpointing and compile wrap the block as TP left it.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from training.config.parallel import ParallelConfig
from training.parallel.fsdp import apply_fsdp
from training.parallel.mesh import ParallelMesh
from training.parallel.process_group import DistInfo
from training.parallel.tp import apply_tp


def build_data_parallel_mesh(info: DistInfo) -> DeviceMesh:
    """A 1-D mesh over every rank (plain FSDP's shard dimension): for the benchmark's torchtitan model and the
    tests that shard a module by hand. The trainer builds its named mesh from the layout (mesh.build_mesh)."""
    return init_device_mesh(info.device.type, (info.world_size,), mesh_dim_names=("dp_shard",))


def apply_parallelism(model: nn.Module, cfg: ParallelConfig, mesh: ParallelMesh, *,
                      checkpoint_fn: Callable[..., Any] | None = None, float8_tp: bool = False) -> None:
    """Wrap ``model`` (a training.model.Transformer, typically still on the meta device and already FP8
    converted) in place: 1) tensor parallelism on ``mesh.tp`` when tp > 1 (``float8_tp``: torchao's FP8
    styles), 2) activation checkpointing (with ``checkpoint_fn``, the FP8 backend's, when it has one),
    3) torch.compile, per block, 4) FSDP2 per block, then the root, on ``mesh.dp``. Parameter FQNs are
    unchanged except for checkpoint_wrapper's ``_checkpoint_wrapped_module.`` (which
    torch.distributed.checkpoint.state_dict removes)."""
    if mesh.layout.tp > 1:
        apply_tp(model, mesh.tp, float8=float8_tp)
        if cfg.compile:
            maybe_fresh_embedding_output(model)
    blocks = model.layers
    for i, block in enumerate(blocks):
        if cfg.activation_checkpointing:
            block = apply_activation_checkpointing(block, checkpoint_fn=checkpoint_fn)
        if cfg.compile:
            # Module.compile compiles in place, so FQNs get no "_orig_mod." and FSDP2's hooks stay outside
            # the compiled region (torchtitan's per-block compile); one graph per block is reused by all.
            block.compile(fullgraph=True)
        blocks[i] = block
    apply_fsdp(model, cfg, mesh.dp)


def maybe_fresh_embedding_output(model: nn.Module) -> None:
    """Under tensor parallelism, hand the first compiled block a copy of the embedding's output, not the
    tensor TP's output hook returns (DTensor.to_local of the sequence-sharded embedding).

    Measured with torch 2.13 (tests/training/layouts_entry.py, part 8): a compiled block whose input is that
    tensor returns no gradient for it under AOTAutograd, so the embedding's weight gets a zero gradient and the
    run trains with a frozen embedding, silently (on the CPU, Inductor and aot_eager alike; eager is right).
    A copy is a fresh tensor of one micro-batch's local activations (tokens/tp x dim), and its gradient flows.
    Only the untied embedding shows it: a tied one also gets the output head's gradient."""
    model.tok_embeddings.register_forward_hook(_fresh_output)


def _fresh_output(module: nn.Module, args: Any, output: Any) -> Any:
    return output.clone()


def apply_activation_checkpointing(block: nn.Module, *,
                                   checkpoint_fn: Callable[..., Any] | None = None) -> nn.Module:
    """The block wrapped so its forward is recomputed in backward: by ``checkpoint_fn(block, *args)`` when
    given (Transformer Engine's checkpoint, which recomputes under TE's FP8 recipe), else by non-reentrant
    torch.utils.checkpoint. Either way checkpoint_wrapper keeps the parameter FQNs the same.

    preserve_rng_state=False: the model has no dropout, so there is no RNG state to replay (torchtitan's
    setting; saving and restoring RNG state per block costs time)."""
    from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import checkpoint_wrapper

    if checkpoint_fn is not None:
        return checkpoint_wrapper(block, checkpoint_fn=checkpoint_fn)
    return checkpoint_wrapper(block, preserve_rng_state=False)
