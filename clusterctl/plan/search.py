"""The layout `clusterctl plan` picks at a node count: of the layouts that can run there
(clusterctl.plan.layouts.candidates, or the one --layout names) and fit memory per GPU (clusterctl.plan.memory with
the layout's sharding; without activation checkpointing where that fits, else with it), the one with the least
step time (clusterctl.plan.step_time). The global batch and the GPUs are the same for every layout at a count, so
the least step time is the least time per token.

HSDP is weighed with shard groups of 1, 2, 4 ... nodes (replicas = nodes / group), TP at 1, 2, 4 and 8.

Whether a model fits at all (the FITS FROM column) is the fewest nodes any of those layouts fits memory on
(fewest_nodes_fit): FSDP over the GPUs at each TP degree that divides the model, since HSDP holds more per GPU
than FSDP at the same TP (each replica the whole sharded state) and so never fits first.
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterctl.plan.layouts import Layout, LayoutRequest, candidates, tp_degrees, tp_divides, why_not
from clusterctl.plan.memory import MemoryEstimate, RunShape, estimate_memory
from clusterctl.plan.step_time import FULL_RECOMPUTE, NO_RECOMPUTE, StepTime, step_time
from clusterctl.plan.workload import Workload
from instance_catalog.instance_types import InstanceType
from instance_catalog.network import get_network


@dataclass(frozen=True)
class LayoutChoice:
    layout: Layout
    activation_checkpointing: bool
    memory: MemoryEstimate
    step: StepTime


def layouts_at(workload: Workload, instance: InstanceType, nodes: int, global_batch_tokens: int,
               forced: LayoutRequest | None = None) -> tuple[list[Layout], str]:
    """(the layouts to weigh at `nodes`, why there are none: '' where there are)."""
    gpn = instance.gpu_count
    if global_batch_tokens % workload.seq_len:  # the trainer refuses a batch that is not whole samples
        return [], f"the global batch of {global_batch_tokens:,} tokens is not whole samples of {workload.seq_len}"
    samples = global_batch_tokens // workload.seq_len
    if forced is not None:
        layout = forced.at(nodes * gpn)
        if layout is None:
            return [], (f"--layout={forced.text!r}: the degrees do not multiply to the {nodes * gpn} GPUs of {nodes} "
                        "nodes")
        problem = why_not(layout, workload.model, nodes=nodes, gpus_per_node=gpn, samples_per_step=samples,
                          micro_batch_size=workload.micro_batch_size)
        return ([], f"--layout={forced.text!r} at {nodes} nodes: {problem}") if problem else ([layout], "")
    found = candidates(workload.model, nodes=nodes, gpus_per_node=gpn, samples_per_step=samples,
                       micro_batch_size=workload.micro_batch_size)
    # shard groups of 1, 2, 4 ... nodes: replicas = nodes / a power of two (or one group of all the nodes)
    found = [lay for lay in found if lay.dp_replicate == 1 or _power_of_two(nodes // lay.dp_replicate)]
    return found, "" if found else "no layout splits the global batch"


def memory_of(workload: Workload, instance: InstanceType, layout: Layout, ac: bool,
              global_batch_tokens: int) -> MemoryEstimate:
    accum = max(1, global_batch_tokens // (workload.seq_len * workload.micro_batch_size * layout.dp))
    run = RunShape(micro_batch_size=workload.micro_batch_size, seq_len=workload.seq_len, grad_accum_steps=accum,
                   activation_checkpointing=ac, reshard_after_forward=workload.reshard_after_forward)
    return estimate_memory(workload.model, run, layout.gpus, instance.gpu_memory_gib, tp=layout.tp,
                           replicas=layout.dp_replicate)


@dataclass(frozen=True)
class Fit:
    """The fewest nodes a model fits memory on, and the layout it fits as there."""

    nodes: int
    layout: Layout
    memory: MemoryEstimate


def fit_layouts(workload: Workload, instance: InstanceType, nodes: int) -> list[Layout]:
    """The layouts with the least memory per GPU at `nodes`: FSDP over the GPUs at each TP degree the model takes
    (whether the global batch splits is not asked: the NODES column is where it does)."""
    gpn = instance.gpu_count
    return [Layout(1, nodes * gpn // t, t) for t in tp_degrees(gpn) if tp_divides(workload.model, t)]


def least_memory(workload: Workload, instance: InstanceType, nodes: int, ac: bool,
                 global_batch_tokens: int) -> MemoryEstimate:
    """The least memory per GPU any layout needs at `nodes` (to say by how much nothing fits)."""
    return min((memory_of(workload, instance, layout, ac, global_batch_tokens)
                for layout in fit_layouts(workload, instance, nodes)), key=lambda m: m.peak_bytes)


def fewest_nodes_fit(workload: Workload, instance: InstanceType, ac: bool, global_batch_tokens: int,
                     max_nodes: int) -> Fit | None:
    """The fewest nodes (1..max_nodes) on which some layout fits, with or without activation checkpointing, and
    that layout (the smallest TP among equals); None where none fits on max_nodes. Per TP degree a binary
    search: memory per GPU only falls as nodes are added."""
    gpn, best = instance.gpu_count, None
    for tp in (t for t in tp_degrees(gpn) if tp_divides(workload.model, t)):
        def memory(nodes: int, tp: int = tp) -> MemoryEstimate:
            return memory_of(workload, instance, Layout(1, nodes * gpn // tp, tp), ac, global_batch_tokens)

        low, high = 1, max_nodes if best is None else best.nodes - 1
        if high < 1 or not memory(high).fits:
            continue
        while low < high:
            middle = (low + high) // 2
            low, high = (low, middle) if memory(middle).fits else (middle + 1, high)
        best = Fit(low, Layout(1, low * gpn // tp, tp), memory(low))
    return best


def best_layout(workload: Workload, instance: InstanceType, nodes: int, global_batch_tokens: int, efficiency: float,
                forced: LayoutRequest | None = None) -> tuple[LayoutChoice | None, str]:
    """(the fastest layout that fits at `nodes`, or None and why not)."""
    layouts, problem = layouts_at(workload, instance, nodes, global_batch_tokens, forced)
    network = get_network(instance.name)
    best: LayoutChoice | None = None
    smallest: MemoryEstimate | None = None
    for layout in layouts:
        for ac in (False, True):
            memory = memory_of(workload, instance, layout, ac, global_batch_tokens)
            if not memory.fits:
                smallest = memory if smallest is None or memory.peak_bytes < smallest.peak_bytes else smallest
                continue
            step = step_time(workload.model, seq_len=workload.seq_len, micro_batch_size=workload.micro_batch_size,
                             global_batch_tokens=global_batch_tokens, layout=layout, instance=instance,
                             network=network, efficiency=efficiency,
                             recompute=FULL_RECOMPUTE if ac else NO_RECOMPUTE,
                             reshard_after_forward=workload.reshard_after_forward,
                             fp8_all_gather=workload.fp8_all_gather and instance.supports_fp8)
            if best is None or step.total_s < best.step.total_s:
                best = LayoutChoice(layout, ac, memory, step)
            break  # with activation checkpointing it is only slower
    if best is None and layouts and smallest is not None:
        problem = (f"no layout fits on {nodes} nodes: {smallest.peak_bytes / 2**30:.1f} GiB per GPU at the least, "
                   f"{smallest.usable_bytes / 2**30:.1f} usable")
    return best, problem


def _power_of_two(value: int) -> bool:
    return value >= 1 and value & (value - 1) == 0


def fsdp_step(workload: Workload, instance: InstanceType, nodes: int, global_batch_tokens: int,
              efficiency: float) -> StepTime | None:
    """FSDP over every GPU at `nodes`, to show what the chosen layout saves; None where it cannot run or fit."""
    fsdp = LayoutRequest("dp_replicate=1,tp=1", 1, None, 1)
    choice, _ = best_layout(workload, instance, nodes, global_batch_tokens, efficiency, fsdp)
    return None if choice is None else choice.step
