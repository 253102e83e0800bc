"""FSDP2 ``fully_shard`` per transformer block, then the root, on the data-parallel mesh: FSDP on a 1-D mesh,
HSDP on the 2-D (dp_replicate, dp_shard) one (shards inside a replica group, gradients all-reduced across
groups). Under tensor parallelism the parameters are already DTensors on the tp mesh; FSDP2 shards them
further (2-D parameters) as in torchtitan's apply_fsdp."""

from __future__ import annotations

import torch
from torch import nn
from torch.distributed.device_mesh import DeviceMesh
from torch.distributed.fsdp import MixedPrecisionPolicy, fully_shard

from training.config.parallel import DTYPE_NAMES, ParallelConfig

DTYPES = {name: getattr(torch, name) for name in DTYPE_NAMES}  # parallel.*_dtype names -> torch dtypes


def apply_fsdp(model: nn.Module, cfg: ParallelConfig, dp_mesh: DeviceMesh) -> None:
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
        fully_shard(block, mesh=dp_mesh, mp_policy=mp_policy, reshard_after_forward=reshard)
    fully_shard(model, mesh=dp_mesh, mp_policy=mp_policy, reshard_after_forward=cfg.reshard_after_forward)
