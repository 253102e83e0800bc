"""The named device mesh of a layout, built once: (dp_replicate, dp_shard, tp), tp innermost, so the ranks of
a tensor-parallel group are consecutive global ranks, which torchrun places on one node."""

from __future__ import annotations

from dataclasses import dataclass

from torch.distributed.device_mesh import DeviceMesh, init_device_mesh

from training.parallel.layout import MESH_DIMS, Layout


@dataclass(frozen=True)
class ParallelMesh:
    """The world mesh and the sub-meshes each part of the parallelism uses."""

    layout: Layout
    world: DeviceMesh  # every rank, named MESH_DIMS

    @property
    def dp(self) -> DeviceMesh:
        """FSDP2's mesh: 2-D (dp_replicate, dp_shard) for HSDP (replicate on the first dimension, shard on the
        second), else the 1-D dp_shard mesh."""
        if self.layout.dp_replicate > 1:
            return self.world["dp_replicate", "dp_shard"]
        return self.world["dp_shard"]

    @property
    def tp(self) -> DeviceMesh:
        return self.world["tp"]


def build_mesh(layout: Layout, device_type: str) -> ParallelMesh:
    """The mesh of ``layout`` over the default process group's ranks (collective: every rank calls it)."""
    shape = (layout.dp_replicate, layout.dp_shard, layout.tp)
    return ParallelMesh(layout, init_device_mesh(device_type, shape, mesh_dim_names=MESH_DIMS))
