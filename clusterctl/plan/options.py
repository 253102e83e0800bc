"""`clusterctl plan`: for each instance type of the catalog, whether a model trains on it at all, on how many
nodes, in how long, and for how much; ranked by cost and by time.

Arithmetic, per instance type (every figure from one place):
- FLOPs: training.shapes.flops_per_token (6 x parameters + attention, the trainer's MFU count) x tokens.
- Memory: clusterctl.plan.memory, per GPU, at each node count; the smallest count that some layout fits on
  (FITS FROM: clusterctl.plan.search.fewest_nodes_fit, with the layout), without activation checkpointing if it
  fits so, else with it; each layout's own at each count.
- Layout and time: clusterctl.plan.search picks, at each count, the layout with the least step time
  (clusterctl.plan.step_time: compute at the efficiency from clusterctl.plan.mfu and clusterctl.plan.efficiency,
  plus the communication it does not hide); time = tokens / (GPUs x tokens/s per GPU).
- Node counts: those where some layout splits the global batch (tokens per optimizer step, the same at every
  node count) into whole micro-batches: global batch = seq x micro-batch x data-parallel ranks x accumulation.
- Cost: nodes x hours x the catalog's on-demand price (instance_catalog/instance_types.py, us-east-1), plus the
  stack's FSx for Lustre file system for the same hours (clusterctl.plan.fsx_cost).
- The choice (clusterctl.plan.choose): per type, the node count to act on.
Idealised: no restarts, checkpoint stalls or queueing for capacity; what the step model leaves out is in its
docstring.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from cluster_aws.errors import EXIT_USAGE, ClusterctlError
from cluster_spec.settings import MAX_NODE_COUNT
from clusterctl.plan.efficiency import compute_efficiency
from clusterctl.plan.layouts import Layout, LayoutRequest
from clusterctl.plan.memory import MemoryEstimate, RunShape, estimate_memory
from clusterctl.plan.mfu import Measurement, MfuChoice, MfuQuery, choose_mfu
from clusterctl.plan.search import LayoutChoice, best_layout, fewest_nodes_fit, layouts_at, least_memory
from clusterctl.plan.workload import Workload
from instance_catalog.instance_types import InstanceType
from training.shapes import flops_per_token

MAX_NODES = MAX_NODE_COUNT  # nodeCount + spareNodes: synthesis refuses more (cluster_spec/context.py)
# The global batch when the config sets none (run.global_batch_tokens = 0): 4M tokens, Llama 2's for every size
# (Touvron et al. 2023, section 2.2: "a global batch-size of 4M tokens") and where Llama 3 405B began. A power of
# two, so every power-of-two sequence, micro-batch and GPU count splits it evenly.
DEFAULT_GLOBAL_BATCH_TOKENS = 2**22
HOURS_PER_DAY = 24.0
SECONDS_PER_HOUR = 3600.0
_TOKEN_SUFFIXES = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_tokens(text: str) -> float:
    """'1T', '500B', '2.5e12', '300M' -> tokens."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtT]?)\s*", text)
    value = float(match.group(1)) * _TOKEN_SUFFIXES[match.group(2).upper()] if match else math.nan
    if not (math.isfinite(value) and value >= 1):
        raise ClusterctlError(
            f"--tokens={text!r}: allowed: a positive count of tokens, e.g. 200B, 1T or 2e11 (suffixes K, M, B, T)",
            EXIT_USAGE,
        )
    return value


def format_tokens(tokens: float) -> str:
    """1e12 -> '1T', 5e11 -> '500B', 2.5e9 -> '2.5B'."""
    for suffix, scale in (("T", 1e12), ("B", 1e9), ("M", 1e6), ("K", 1e3)):
        if tokens >= scale:
            return f"{tokens / scale:.4g}{suffix}"
    return f"{tokens:.4g}"


@dataclass(frozen=True)
class Option:
    """One instance type's answer at one node count."""

    instance_type: InstanceType
    fp8_backend: str  # the backend the run would use there ("none" where the GPU has no FP8)
    min_nodes_without_ac: int | None  # smallest node count some layout fits on without activation checkpointing
    min_nodes_with_ac: int | None  # ... with it; None: not within MAX_NODES
    nodes: int | None  # the node count planned
    activation_checkpointing: bool  # needed at `nodes`
    memory: MemoryEstimate | None  # per GPU at `nodes`
    mfu: MfuChoice
    total_flops: float
    tokens: float
    problem: str  # "" when the option is viable, else why not
    spare_nodes: int = 0  # hot spares the group holds beyond `nodes` (spareNodes): paid for, idle until a loss
    global_batch_tokens: int = 0  # tokens per optimizer step, whatever the node count (0: the config's shape)
    micro_batch_tokens: int = 0  # seq x micro-batch: one GPU's tokens per forward/backward
    fsx_usd_per_hour: float = 0.0  # the stack's FSx for Lustre file system (clusterctl.plan.fsx_cost)
    node_counts: tuple[int, ...] = ()  # the counts that fit and split the global batch evenly
    horizon_days: float | None = None  # the plan's horizon (clusterctl.plan.choose), None where none applies
    choice: LayoutChoice | None = None  # the layout at `nodes` and its step time (clusterctl.plan.search)
    efficiency: float = 0.0  # the compute efficiency the step time ran at (clusterctl.plan.efficiency)
    fits_from_layout_without_ac: Layout | None = None  # the layout that fits on min_nodes_without_ac
    fits_from_layout_with_ac: Layout | None = None  # ... on min_nodes_with_ac

    @property
    def viable(self) -> bool:
        return not self.problem

    @property
    def min_nodes(self) -> int | None:
        counts = [n for n in (self.min_nodes_without_ac, self.min_nodes_with_ac) if n is not None]
        return min(counts) if counts else None

    @property
    def gpus(self) -> int:
        return (self.nodes or 0) * self.instance_type.gpu_count

    @property
    def grad_accum_steps(self) -> int | None:
        """Micro-batches per GPU per optimizer step at `nodes`: the global batch over one micro-step's tokens."""
        if self.choice is not None:
            return self.choice.step.grad_accum_steps
        step = self.micro_batch_tokens * self.gpus
        return self.global_batch_tokens // step if step else None

    @property
    def mfu_effective(self) -> float:
        return self.mfu.at(self.activation_checkpointing)

    @property
    def fits(self) -> bool:
        return self.memory is not None and self.memory.fits

    @property
    def hours(self) -> float | None:
        if not self.nodes or not self.fits:
            return None
        if self.choice is not None:  # the step model: compute and the communication it does not hide
            return self.tokens / (self.gpus * self.choice.step.tokens_per_s_per_gpu) / SECONDS_PER_HOUR
        return training_hours(self.total_flops, self.instance_type, self.nodes, self.mfu_effective)

    @property
    def days(self) -> float | None:
        return None if self.hours is None else self.hours / HOURS_PER_DAY

    @property
    def within_horizon(self) -> bool:
        return self.horizon_days is None or (self.hours is not None and self.hours <= self.horizon_days * 24)

    @property
    def gpu_hours(self) -> float | None:
        return None if self.hours is None else self.hours * self.gpus

    @property
    def instances_usd(self) -> float | None:
        """The whole group's instances: the job's nodes and the spares, for the training time."""
        if self.hours is None:
            return None
        return (self.nodes + self.spare_nodes) * self.hours * self.instance_type.on_demand_usd_per_hour

    @property
    def fsx_usd(self) -> float | None:
        return None if self.hours is None else self.hours * self.fsx_usd_per_hour

    @property
    def cost_usd(self) -> float | None:
        """Instances and FSx for Lustre, for the training time."""
        if self.hours is None:
            return None
        return self.instances_usd + self.fsx_usd

    @property
    def usd_per_million_tokens(self) -> float | None:
        return None if self.cost_usd is None else self.cost_usd / (self.tokens / 1e6)


def training_hours(total_flops: float, instance: InstanceType, nodes: int, mfu: float) -> float:
    """Wall-clock hours for `total_flops` model FLOPs on `nodes` instances at `mfu` of the dense BF16 peak."""
    flops_per_second = nodes * instance.gpu_count * instance.peak_bf16_tflops_per_gpu * 1e12 * mfu
    return total_flops / flops_per_second / SECONDS_PER_HOUR


def effective_fp8_backend(workload: Workload, instance: InstanceType) -> str:
    """The config's FP8 backend where the GPU has FP8 tensor cores, else none (A100: bf16)."""
    return workload.fp8_backend if instance.supports_fp8 else "none"


def micro_step_tokens(workload: Workload, instance: InstanceType, nodes: int) -> int:
    """Tokens of one micro-batch on every GPU of `nodes` nodes."""
    return workload.seq_len * workload.micro_batch_size * instance.gpu_count * nodes


def splits_evenly(workload: Workload, instance: InstanceType, nodes: int, global_batch_tokens: int) -> bool:
    return global_batch_tokens % micro_step_tokens(workload, instance, nodes) == 0


def run_shape(workload: Workload, activation_checkpointing: bool, grad_accum_steps: int | None = None) -> RunShape:
    return RunShape(
        micro_batch_size=workload.micro_batch_size,
        seq_len=workload.seq_len,
        grad_accum_steps=workload.grad_accum_steps if grad_accum_steps is None else grad_accum_steps,
        activation_checkpointing=activation_checkpointing,
        reshard_after_forward=workload.reshard_after_forward,
    )


def memory_at(workload: Workload, instance: InstanceType, nodes: int, ac: bool,
              global_batch_tokens: int | None = None) -> MemoryEstimate:
    """Per GPU at `nodes`; with a global batch, its gradient accumulation there (more than one micro-batch keeps
    the sharded gradients through the forward)."""
    accum = None if not global_batch_tokens else max(
        1, math.ceil(global_batch_tokens / micro_step_tokens(workload, instance, nodes)))
    return estimate_memory(workload.model, run_shape(workload, ac, accum), nodes * instance.gpu_count,
                           instance.gpu_memory_gib)


def smallest_fit(workload: Workload, instance: InstanceType, ac: bool, global_batch_tokens: int | None = None,
                 max_nodes: int = MAX_NODES) -> int | None:
    """The fewest nodes (1..max_nodes) whose GPUs hold the step as FSDP over every GPU; memory per GPU only falls
    as nodes are added. The plan's FITS FROM weighs every layout (clusterctl.plan.search.fewest_nodes_fit)."""
    def fits(count: int) -> bool:
        return memory_at(workload, instance, count, ac, global_batch_tokens).fits

    low, high = 1, max_nodes
    if not fits(high):
        return None
    while low < high:
        middle = (low + high) // 2
        if fits(middle):
            high = middle
        else:
            low = middle + 1
    return low


def plan_counts(
    workload: Workload,
    instance: InstanceType,
    tokens: float,
    *,
    global_batch_tokens: int = DEFAULT_GLOBAL_BATCH_TOKENS,
    mfu_override: float | None = None,
    measurements: list[Measurement] | None = None,
    spare_nodes: int = 0,
    fsx_usd_per_hour: float = 0.0,
    layout: LayoutRequest | None = None,
) -> tuple[Option, list[Option]]:
    """(a stand-in Option that carries the type's facts, and its answer at every node count that fits and splits
    the global batch evenly, fewest nodes first). Where there is none, the stand-in says why (its problem)."""
    backend = effective_fp8_backend(workload, instance)
    query = MfuQuery(
        preset=workload.preset,
        gpu=instance.gpu_model,
        fp8_backend=backend,
        fp8_recipe=workload.fp8_recipe if backend == workload.fp8_backend else "",
        seq_len=workload.seq_len,
        compile=workload.compile,
        micro_batch_size=workload.micro_batch_size,
    )
    mfu = choose_mfu(override=mfu_override, query=query, measurements=measurements or [])
    limit = MAX_NODES - spare_nodes
    fit_without = fewest_nodes_fit(workload, instance, False, global_batch_tokens, limit)
    fit_with = fewest_nodes_fit(workload, instance, True, global_batch_tokens, limit)
    without_ac, with_ac = (None if f is None else f.nodes for f in (fit_without, fit_with))
    efficiency = compute_efficiency(mfu, workload.model)
    even = [n for n in range(1, limit + 1) if with_ac is not None and n >= with_ac
            and layouts_at(workload, instance, n, global_batch_tokens, layout)[0]]
    choices = {n: best_layout(workload, instance, n, global_batch_tokens, efficiency, layout)[0] for n in even}
    counts = tuple(n for n in even if choices[n] is not None)
    base = dict(instance_type=instance, fp8_backend=backend, min_nodes_without_ac=without_ac,
                min_nodes_with_ac=with_ac, mfu=mfu, total_flops=flops_per_token(workload.model, workload.seq_len)
                * tokens, tokens=tokens, spare_nodes=spare_nodes, global_batch_tokens=global_batch_tokens,
                micro_batch_tokens=workload.seq_len * workload.micro_batch_size,
                fsx_usd_per_hour=fsx_usd_per_hour, node_counts=counts, efficiency=efficiency,
                fits_from_layout_without_ac=fit_without and fit_without.layout,
                fits_from_layout_with_ac=fit_with and fit_with.layout)

    def at(count: int) -> Option:
        choice = choices[count]
        return Option(nodes=count, activation_checkpointing=choice.activation_checkpointing, memory=choice.memory,
                      problem="", choice=choice, **base)

    if with_ac is None:
        memory = least_memory(workload, instance, limit, True, global_batch_tokens)
        return Option(
            nodes=None, activation_checkpointing=True, memory=memory,
            problem=f"does not fit on {limit} nodes, even with activation checkpointing "
            f"({memory.peak_bytes / 2**30:.1f} GiB per GPU, {memory.usable_bytes / 2**30:.1f} usable)",
            **base,
        ), []
    if not counts and layout is not None:
        return Option(nodes=None, activation_checkpointing=True, memory=None, problem=_layout_problem(
            workload, instance, with_ac, limit, global_batch_tokens, efficiency, layout), **base), []
    if not counts:
        per_rank = workload.seq_len * workload.micro_batch_size
        return Option(
            nodes=None, activation_checkpointing=True, memory=None,
            problem=f"fits from {with_ac} nodes, but no count from {with_ac} to {limit} splits the global batch of "
            f"{global_batch_tokens:,} tokens into whole micro-batches ({per_rank:,} tokens per data-parallel rank: "
            f"seq {workload.seq_len} x micro-batch {workload.micro_batch_size}; a node is {instance.gpu_count} "
            f"ranks, or {instance.gpu_count} / tp with TP); --global-batch-tokens a multiple of {per_rank:,} x the "
            "data-parallel ranks",
            **base,
        ), []
    return at(counts[0]), [at(n) for n in counts]


def _layout_problem(workload: Workload, instance: InstanceType, first: int, limit: int, global_batch_tokens: int,
                    efficiency: float, layout: LayoutRequest) -> str:
    """Why --layout runs at no node count from `first` to `limit`: its reason at the first count."""
    return best_layout(workload, instance, first, global_batch_tokens, efficiency, layout)[1] + (
        f" (and at every count up to {limit})" if limit > first else "")


def at_nodes(standin: Option, options: list[Option], workload: Workload, nodes: int,
             layout: LayoutRequest | None = None) -> Option:
    """The type at exactly `nodes` (--nodes), or why not."""
    if standin.min_nodes_with_ac is None:
        return standin
    by_count = {o.nodes: o for o in options}
    if nodes in by_count:
        return by_count[nodes]
    it = standin.instance_type
    if nodes >= standin.min_nodes_with_ac:
        _, problem = best_layout(workload, it, nodes, standin.global_batch_tokens, standin.efficiency, layout)
        if problem and (layout is not None or "fits" in problem):
            return dataclasses.replace(standin, nodes=nodes, memory=None, problem=problem)
    if nodes < standin.min_nodes_with_ac:
        memory = least_memory(workload, it, nodes, True, standin.global_batch_tokens)
        problem = (f"does not fit on {nodes} nodes (needs {standin.min_nodes_with_ac}): "
                   f"{memory.peak_bytes / 2**30:.1f} GiB per GPU, {memory.usable_bytes / 2**30:.1f} usable")
    else:
        memory = None
        problem = (f"{nodes} nodes do not split the global batch of {standin.global_batch_tokens:,} tokens into "
                   f"whole micro-batches ({micro_step_tokens(workload, it, nodes):,} tokens per micro-step); "
                   f"node counts that do: {', '.join(map(str, standin.node_counts)) or 'none'}")
    return dataclasses.replace(standin, nodes=nodes, memory=memory, problem=problem)


def steps_for(workload: Workload, option: Option) -> int:
    """Optimizer steps that train at least the planned tokens at the option's global batch."""
    return math.ceil(option.tokens / option.global_batch_tokens)


def deploy_context(option: Option) -> list[str]:
    """The `cdk deploy` -c settings (cluster_spec/context.py SETTING_KEYS) for the option: on-demand capacity;
    a Capacity Block adds its own settings (`clusterctl capacity purchase` prints them)."""
    settings = [f"-c instanceType={option.instance_type.name}", f"-c nodeCount={option.nodes}"]
    return settings + ([f"-c spareNodes={option.spare_nodes}"] if option.spare_nodes else [])


def run_overrides(workload: Workload, option: Option, *, seq_len_given: bool, micro_batch_given: bool) -> list[str]:
    """The `--set` overrides that make the config file run what was planned."""
    overrides = [f"run.steps={steps_for(workload, option)}"]
    if option.global_batch_tokens != workload.global_batch_tokens:
        overrides.append(f"run.global_batch_tokens={option.global_batch_tokens}")
    if workload.grad_accum_steps != 1:  # derived from the global batch, which the trainer refuses beside it
        overrides.append("run.grad_accum_steps=1")
    if seq_len_given:
        overrides.append(f"run.seq_len={workload.seq_len}")
    if micro_batch_given:
        overrides.append(f"run.micro_batch_size={workload.micro_batch_size}")
    if option.activation_checkpointing != workload.activation_checkpointing:
        overrides.append(f"parallel.activation_checkpointing={str(option.activation_checkpointing).lower()}")
    if option.fp8_backend != workload.fp8_backend:
        overrides.append(f"fp8.backend={option.fp8_backend}")
    if option.choice is not None:  # the layout, always: the trainer's defaults are FSDP over every rank
        overrides += option.choice.layout.overrides
    return overrides
