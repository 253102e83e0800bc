"""The layouts `clusterctl plan` considers: `dp_replicate` x `dp_shard` x `tp` = the GPUs, torchtitan's degrees
under the trainer's names (`[parallel]`), TP groups inside a node, shard groups next, replicas last.

At N nodes of G GPUs: TP 1, 2, 4 ... up to G (where it divides the heads, the key/value heads, the MLP width and
the vocabulary); replicas that divide the nodes (shard groups of N / R whole nodes: FSDP is R = 1, HSDP R > 1);
the global batch split into whole micro-batches over the data-parallel ranks (R x S). `--layout` names one
(parse_layout), checked by the same rules (why_not).
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from training.shapes import ModelConfig

LAYOUT_SYNTAX = "dp_replicate=R,dp_shard=S,tp=T (any of them; dp_shard defaults to the GPUs left over), e.g. tp=8"
_KEYS = ("dp_replicate", "dp_shard", "tp")


@dataclass(frozen=True)
class Layout:
    dp_replicate: int  # replicas of the sharded model (HSDP when > 1): one gradient all-reduce across them
    dp_shard: int  # ranks one replica's parameters are sharded over (FSDP2)
    tp: int  # tensor-parallel ranks splitting each matmul, inside a node

    @property
    def gpus(self) -> int:
        return self.dp_replicate * self.dp_shard * self.tp

    @property
    def dp(self) -> int:
        """Data-parallel ranks: each reads its own samples."""
        return self.dp_replicate * self.dp_shard

    @property
    def name(self) -> str:
        data = f"HSDP {self.dp_replicate}x{self.dp_shard}" if self.dp_replicate > 1 else f"FSDP {self.dp_shard}"
        return data + (f" x TP {self.tp}" if self.tp > 1 else "")

    @property
    def overrides(self) -> list[str]:
        """The `--set` settings that make the trainer run this layout."""
        return [f"parallel.dp_replicate={self.dp_replicate}", f"parallel.dp_shard={self.dp_shard}",
                f"parallel.tp={self.tp}"]


@dataclass(frozen=True)
class LayoutRequest:
    """--layout as given: None where a degree was not named."""

    text: str
    dp_replicate: int | None
    dp_shard: int | None
    tp: int | None

    def at(self, gpus: int) -> Layout | None:
        """The layout at `gpus` GPUs; None where the degrees do not multiply to it."""
        replicate, tp = self.dp_replicate or 1, self.tp or 1
        shard = self.dp_shard if self.dp_shard is not None else gpus // (replicate * tp)
        layout = Layout(replicate, shard, tp)
        return layout if shard >= 1 and layout.gpus == gpus else None


def parse_layout(text: str) -> LayoutRequest:
    """'dp_replicate=4,tp=8' -> a request; ValueError with one line naming the value and the syntax."""
    degrees: dict[str, int] = {}
    for part in (p.strip() for p in text.split(",")):
        match = re.fullmatch(r"(dp_replicate|dp_shard|tp)\s*=\s*([0-9]+)", part)
        if not match or int(match.group(2)) < 1 or match.group(1) in degrees:
            raise ValueError(f"--layout={text!r}: allowed: {LAYOUT_SYNTAX}")
        degrees[match.group(1)] = int(match.group(2))
    return LayoutRequest(text, *(degrees.get(key) for key in _KEYS))


def tp_divides(cfg: ModelConfig, tp: int) -> bool:
    """TP splits heads, key/value heads, the MLP width and the vocabulary evenly."""
    return all(size % tp == 0 for size in (cfg.n_heads, cfg.n_kv_heads, cfg.ffn_dim, cfg.vocab_size))


def tp_degrees(gpus_per_node: int) -> list[int]:
    """The TP degrees the plan weighs: 1, 2, 4 ... dividing a node's GPUs (a TP group stays inside a node)."""
    return [t for t in (1, 2, 4, 8, 16) if t <= gpus_per_node and gpus_per_node % t == 0]


def why_not(layout: Layout, cfg: ModelConfig, *, nodes: int, gpus_per_node: int, samples_per_step: int,
            micro_batch_size: int) -> str:
    """'' when `layout` can run at `nodes` nodes, else why not (the trainer's own refusals, offline)."""
    if layout.gpus != nodes * gpus_per_node:
        return f"dp_replicate x dp_shard x tp = {layout.gpus}, not the {nodes * gpus_per_node} GPUs of {nodes} nodes"
    if layout.tp > gpus_per_node or gpus_per_node % layout.tp:
        return f"tp={layout.tp}: allowed: a divisor of the {gpus_per_node} GPUs of a node"
    if not tp_divides(cfg, layout.tp):
        return (f"tp={layout.tp} does not divide the heads ({cfg.n_heads}), key/value heads ({cfg.n_kv_heads}), MLP "
                f"width ({cfg.ffn_dim}) and vocabulary ({cfg.vocab_size})")
    if nodes % layout.dp_replicate:
        return f"dp_replicate={layout.dp_replicate} does not divide the {nodes} nodes"
    if samples_per_step % (layout.dp * micro_batch_size):
        return (f"the global batch of {samples_per_step} samples does not split into whole micro-batches of "
                f"{micro_batch_size} over {layout.dp} data-parallel ranks")
    return ""


def candidates(cfg: ModelConfig, *, nodes: int, gpus_per_node: int, samples_per_step: int,
               micro_batch_size: int) -> list[Layout]:
    """Every layout the plan weighs at `nodes` nodes: TP 1, 2, 4 ... inside a node, replicas dividing the nodes."""
    gpus = nodes * gpus_per_node
    layouts = [Layout(r, gpus // (r * t), t) for t in tp_degrees(gpus_per_node)
               for r in range(1, nodes + 1) if nodes % r == 0]
    return [lay for lay in layouts if not why_not(lay, cfg, nodes=nodes, gpus_per_node=gpus_per_node,
                                                   samples_per_step=samples_per_step,
                                                   micro_batch_size=micro_batch_size)]
