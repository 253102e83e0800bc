"""The layout: how a job's ranks split into replica groups, shard groups and tensor-parallel groups, and
whether such a layout can run. No torch: clusterctl refuses a layout offline with the same code and the same
words as the trainer (from the node count and the instance type's GPUs), before anything is sent.

The mesh is (dp_replicate, dp_shard, tp), tp innermost: torchrun numbers ranks node by node, so the tp ranks
of a group are consecutive and sit on one node (NVLink), and a rank's data-parallel rank is ``rank // tp``.
"""

from __future__ import annotations

from dataclasses import dataclass

from training.config import RunConfig
from training.config.parallel import SHARD_REST, ParallelConfig
from training.config.sections import ModelConfig
from training.errors import ConfigError

MESH_DIMS = ("dp_replicate", "dp_shard", "tp")  # outermost first; the DeviceMesh's dimension names


@dataclass(frozen=True)
class Layout:
    """The three degrees of a job whose product is its world size (torchtitan's ParallelDims)."""

    dp_replicate: int  # replica groups: each holds the whole model, gradients all-reduced across them
    dp_shard: int  # ranks of a replica group that FSDP2 shards parameters, gradients and optimizer state over
    tp: int  # ranks of one node that split each block's matmuls and share each sample

    @property
    def world_size(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks: the ranks that read different samples."""
        return self.dp_replicate * self.dp_shard

    def dp_rank(self, rank: int) -> int:
        """The data-parallel rank of global ``rank``: every rank of a tp group reads the same samples."""
        return rank // self.tp

    @property
    def name(self) -> str:
        """FSDP 4, HSDP 2 x 2, TP 2 x FSDP 2, HSDP 2 x 2 x TP 2: the words the docs and the logs use."""
        if self.dp_replicate > 1:
            dp = f"HSDP {self.dp_replicate} x {self.dp_shard}"
        else:
            dp = f"FSDP {self.dp_shard}"
        return dp if self.tp == 1 else f"TP {self.tp} x {dp}"

    def settings(self) -> dict[str, int]:
        """The ``[parallel]`` fields that give this layout (for --set, the step records and clusterctl)."""
        return {"dp_replicate": self.dp_replicate, "dp_shard": self.dp_shard, "tp": self.tp}


def resolve_layout(parallel: ParallelConfig, *, world_size: int, gpus_per_node: int, model: ModelConfig,
                   run: RunConfig, fp8_backend: str = "none") -> Layout:
    """The layout ``parallel`` asks for on ``world_size`` ranks of ``gpus_per_node`` per node, or a ConfigError
    (one line: the setting, its value, what is allowed) when it cannot run with this model and batch."""
    fixed = parallel.dp_replicate * parallel.tp  # the degrees dp_shard's -1 leaves the rest of the ranks to
    if world_size % fixed:
        name, value = ("tp", parallel.tp) if world_size % parallel.dp_replicate == 0 else (
            "dp_replicate", parallel.dp_replicate)
        raise ConfigError(f"parallel.{name}={value}: dp_replicate {parallel.dp_replicate} x tp {parallel.tp} = {fixed} "
                          f"does not divide the world size {world_size}; allowed: degrees whose product divides "
                          f"{world_size} ({_divisors_text(world_size)})")
    dp_shard = world_size // fixed if parallel.dp_shard == SHARD_REST else parallel.dp_shard
    layout = Layout(parallel.dp_replicate, dp_shard, parallel.tp)
    if layout.world_size != world_size:
        raise ConfigError(f"parallel.dp_shard={dp_shard}: dp_replicate {parallel.dp_replicate} x dp_shard {dp_shard} "
                          f"x tp {parallel.tp} = {layout.world_size} ranks, the job has {world_size}; allowed: "
                          f"dp_shard = {world_size // fixed}, or -1 (the ranks left over)")
    _check_tp(layout, gpus_per_node=gpus_per_node, model=model, run=run, parallel=parallel, fp8_backend=fp8_backend)
    _check_replicas(layout, gpus_per_node=gpus_per_node)
    run.accumulation_steps(layout.dp_size)  # a global batch the data-parallel ranks cannot split: its own line
    return layout


def _check_tp(layout: Layout, *, gpus_per_node: int, model: ModelConfig, run: RunConfig, parallel: ParallelConfig,
              fp8_backend: str) -> None:
    tp = layout.tp
    if tp == 1:
        return
    if gpus_per_node % tp:
        raise ConfigError(f"parallel.tp={tp}: a tensor-parallel group stays on one node's {gpus_per_node} GPUs; "
                          f"allowed: {_divisors_text(gpus_per_node)}")
    # each rank holds heads / tp query and key/value heads, ffn_dim / tp of the MLP and vocab / tp of the head
    sizes = {"model.n_heads": model.n_heads, "model.n_kv_heads": model.n_kv_heads, "model.ffn_dim": model.ffn_dim,
             "model.vocab_size": model.vocab_size, "run.seq_len": run.seq_len}  # seq_len: sequence parallelism
    for name, size in sizes.items():
        if size % tp:
            common = [d for d in range(1, gpus_per_node + 1) if gpus_per_node % d == 0
                      and all(v % d == 0 for v in sizes.values())]
            raise ConfigError(f"parallel.tp={tp}: does not divide {name} ({size}); allowed: a divisor of the "
                              f"heads, key/value heads, MLP width, vocabulary and seq_len that fits a node: "
                              f"{', '.join(map(str, common))}")
    if parallel.loss_chunk_tokens:
        raise ConfigError(f"parallel.loss_chunk_tokens={parallel.loss_chunk_tokens}: allowed: 0 with parallel.tp > 1 "
                          "(under tensor parallelism the loss is already vocabulary-parallel: no rank holds the "
                          "full logits)")
    if fp8_backend == "te":
        raise ConfigError("fp8.backend='te': allowed with parallel.tp=1 only; under tensor parallelism use "
                          "fp8.backend='torchao' (its Float8 column/row-wise styles)")


def _check_replicas(layout: Layout, *, gpus_per_node: int) -> None:
    """A replica group is whole nodes, or a node holds whole replica groups: else a group straddles a node
    boundary and its shard traffic (every layer) mixes NVLink and EFA for nothing."""
    group = layout.dp_shard * layout.tp  # ranks of one replica group
    if group % gpus_per_node == 0 or gpus_per_node % group == 0:
        return
    nodes = max(1, layout.world_size // gpus_per_node)
    allowed = [d for d in range(1, layout.world_size // layout.tp + 1)
               if (layout.world_size // layout.tp) % d == 0
               and ((layout.world_size // d) % gpus_per_node == 0 or gpus_per_node % (layout.world_size // d) == 0)]
    raise ConfigError(f"parallel.dp_replicate={layout.dp_replicate}: replica groups of {group} ranks straddle "
                      f"nodes of {gpus_per_node} GPUs ({nodes} nodes); allowed: {', '.join(map(str, allowed))} "
                      "(a divisor of the nodes, or groups that fill a node evenly)")


def _divisors_text(n: int) -> str:
    return ", ".join(str(d) for d in range(1, n + 1) if n % d == 0)


def world_layout(parallel: ParallelConfig, *, nodes: int, gpus_per_node: int, model: ModelConfig, run: RunConfig,
                 fp8_backend: str = "none") -> Layout:
    """resolve_layout for a job of ``nodes`` nodes of ``gpus_per_node`` GPUs each (clusterctl's view)."""
    return resolve_layout(parallel, world_size=nodes * gpus_per_node, gpus_per_node=gpus_per_node, model=model,
                          run=run, fp8_backend=fp8_backend)
