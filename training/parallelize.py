"""Process groups, and the parallelism applied to the model in torchtitan's order: activation checkpointing
-> per-block torch.compile -> FSDP2 ``fully_shard`` per transformer block, then the root.

Under torchrun every rank reads RANK / LOCAL_RANK / WORLD_SIZE (and MASTER_ADDR / MASTER_PORT) from the
environment. Run as a plain process, the same code path gets a one-rank process group on a free local port,
so FSDP2 runs on a 1-rank mesh instead of taking a separate non-distributed branch.
"""

from __future__ import annotations

import datetime
import gc
import logging
import os
import socket
import warnings
from collections.abc import Callable
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.device_mesh import DeviceMesh, init_device_mesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from training.config_sections import DEFAULT_INIT_TIMEOUT_S, DTYPE_NAMES, ParallelConfig
from training.errors import ConfigError

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}  # parallel.*_dtype names -> torch dtypes
TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job."""

    rank: int  # global rank
    local_rank: int  # rank on this node (= the GPU index under torchrun)
    world_size: int  # processes in the job
    device: torch.device  # cuda:<local_rank>, or cpu
    # processes per node (torchrun's LOCAL_WORLD_SIZE): torchrun numbers ranks node by node, so this rank's
    # node is rank // local_world_size (the local checkpoint tier places replicas on the next node by it)
    local_world_size: int = 1

    @property
    def node(self) -> int:
        return self.rank // self.local_world_size

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(timeout_s: float = DEFAULT_INIT_TIMEOUT_S) -> DistInfo:
    """Join (or create) the default process group, with a `timeout_s` for its collectives on every backend,
    and pick this rank's device.

    CUDA: ``cuda:<LOCAL_RANK>`` with NCCL for CUDA tensors plus gloo for CPU tensors (the DCP async save and
    small CPU-side agreements need a CPU backend; torchtitan initialises the same pair). CPU: gloo. Without
    torchrun's variables: a single-process group on a free port of 127.0.0.1. Calling it again returns the
    existing group's view."""
    use_cuda = torch.cuda.is_available()
    if all(name in os.environ for name in TORCHRUN_ENV):
        rank, local_rank, world_size = (_env_int(name) for name in TORCHRUN_ENV)
        init_method = "env://"
    else:
        rank, local_rank, world_size = 0, 0, 1
        init_method = f"tcp://127.0.0.1:{_free_port()}"
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if use_cuda else "gloo"
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    else:
        rank, world_size = dist.get_rank(), dist.get_world_size()
    local_world_size = _env_int("LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in os.environ else 1
    if local_world_size < 1 or world_size % local_world_size:
        local_world_size = 1  # not torchrun's homogeneous layout: every rank its own node
    return DistInfo(rank=rank, local_rank=local_rank, world_size=world_size, device=device,
                    local_world_size=local_world_size)


def set_process_group_timeout(timeout_s: float, info: DistInfo) -> None:
    """Set the default group's collective timeout (every backend; the data-parallel mesh is that group).

    A barrier first, as torchtitan's set_pg_timeouts does: a slow rank may still be inside an operation the
    longer start-up timeout allows while a fast one already issues a collective under the short one."""
    if not dist.is_initialized():
        return
    if info.device.type == "cuda":
        dist.barrier(device_ids=[info.local_rank])
        torch.cuda.synchronize(info.device)
    else:
        dist.barrier()
    # No public API sets a live group's timeout in torch 2.13; torchtitan calls the same function.
    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=timeout_s), None)
    log.info("process group timeout now %.0f s", timeout_s)


def destroy_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def release_process_groups(*, destroy: bool) -> None:
    """At the end of the process, before the interpreter's shutdown: leave the process group (with `destroy`)
    and free what still holds it, so the groups' C++ threads (the TCPStore's server, gloo's transport loop and
    workers) are joined now. destroy_process_group only unregisters a group: its object lives on while
    anything refers to it, and every DeviceMesh the run built does (its `_pg_registry`), kept by the model's
    reference cycles, by an error's traceback, and by DTensor's sharding-propagation cache for the whole
    process. Left to the interpreter's shutdown, a worker that drops a tensor then needs the GIL of an
    interpreter half torn down, and the process aborts ("terminate called without an active exception", exit
    -6 where the CLI returned 0 or 2). Not for a process that trains again: the meshes it clears are dead."""
    if destroy:
        destroy_distributed()
    if dist.is_initialized():  # left up on purpose (a failed NCCL group): nothing of it can be freed
        return
    # The scan sees what the collector tracks: in python -m training, only what was built after its imports
    # were frozen (gc.freeze), the meshes among it. isinstance on some of torch's lazily imported objects warns
    # (a FutureWarning from torch._library's fake script objects): the scan must print nothing after the CLI's
    # last line ("config error: ...")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meshes = [obj for obj in gc.get_objects() if isinstance(obj, DeviceMesh)]
    for mesh in meshes:
        registry = getattr(mesh, "_pg_registry", None)  # torch 2.13: group name -> ProcessGroup
        if isinstance(registry, dict):
            registry.clear()
    del meshes
    gc.collect()  # the model's cycles, and with them the last references to the groups


def build_data_parallel_mesh(info: DistInfo) -> DeviceMesh:
    """A 1-D mesh over every rank (FSDP2's data-parallel shard dimension, named "dp")."""
    return init_device_mesh(info.device.type, (info.world_size,), mesh_dim_names=("dp",))


def apply_parallelism(model: nn.Module, cfg: ParallelConfig, mesh: DeviceMesh, *,
                      checkpoint_fn: Callable[..., Any] | None = None) -> None:
    """Wrap ``model`` (a training.model.Transformer, typically still on the meta device and already FP8
    converted) in place: 1) activation checkpointing (with ``checkpoint_fn``, the FP8 backend's, when it has
    one), 2) torch.compile, per block, 3) FSDP2 per block, then the root. Parameter FQNs are unchanged except
    for checkpoint_wrapper's ``_checkpoint_wrapped_module.`` (which torch.distributed.checkpoint.state_dict
    removes)."""
    blocks = model.layers
    for i, block in enumerate(blocks):
        if cfg.activation_checkpointing:
            block = apply_activation_checkpointing(block, checkpoint_fn=checkpoint_fn)
        if cfg.compile:
            # Module.compile compiles in place, so FQNs get no "_orig_mod." and FSDP2's hooks stay outside
            # the compiled region (torchtitan's per-block compile); one graph per block is reused by all.
            block.compile(fullgraph=True)
        blocks[i] = block
    apply_fsdp(model, cfg, mesh)


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


def apply_fsdp(model: nn.Module, cfg: ParallelConfig, mesh: DeviceMesh) -> None:
    """FSDP2 per transformer block, then the root (embeddings, final norm, output head), with params
    gathered in ``param_dtype`` and gradients reduced in ``reduce_dtype``."""
    mp_policy = MixedPrecisionPolicy(
        param_dtype=DTYPES[cfg.param_dtype], reduce_dtype=DTYPES[cfg.reduce_dtype]
    )
    blocks = list(model.layers)
    for i, block in enumerate(blocks):
        # The last block is not resharded after forward: backward starts with it, so FSDP would gather it
        # again at once (torchtitan's parallelize_llama does the same).
        reshard = cfg.reshard_after_forward and i < len(blocks) - 1
        fully_shard(block, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=mesh, mp_policy=mp_policy, reshard_after_forward=cfg.reshard_after_forward)


def _env_int(name: str) -> int:
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment {name}={value!r}: allowed: an integer (set by torchrun)") from None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
