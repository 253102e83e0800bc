"""`clusterctl plan`: for each instance type of the catalog, whether a model trains on it at all, on how many
nodes, in how long, and for how much; ranked by cost and by time.

Arithmetic, per instance type (every figure from one place):
- FLOPs: training.shapes.flops_per_token (6 x parameters + attention, the trainer's MFU count) x tokens.
- Memory: clusterctl.plan.memory, per GPU, at each node count; the smallest count that fits, without activation
  checkpointing if it fits so, else with it.
- Time: FLOPs / (GPUs x dense BF16 peak x MFU), with MFU from clusterctl.plan.mfu (3/4 of it when activation
  checkpointing recomputes the forward).
- Cost: nodes x hours x the catalog's on-demand price (instance_catalog/instance_types.py, us-east-1).
Idealised: no restarts, checkpoint stalls, queueing for capacity, or communication the MFU figure did not see.
"""

from __future__ import annotations

import dataclasses
import math
import re
from dataclasses import dataclass

from cluster_aws.errors import EXIT_USAGE, ClusterctlError
from clusterctl.plan.memory import MemoryEstimate, RunShape, estimate_memory
from clusterctl.plan.mfu import Measurement, MfuChoice, MfuQuery, choose_mfu
from clusterctl.plan.workload import Workload
from instance_catalog.instance_types import InstanceType
from training.shapes import count_params, flops_per_token

MAX_NODES = 256  # cluster_spec/context.py: nodeCount is 1 to 256
HOURS_PER_DAY = 24.0
SECONDS_PER_HOUR = 3600.0
_TOKEN_SUFFIXES = {"": 1, "K": 1e3, "M": 1e6, "B": 1e9, "G": 1e9, "T": 1e12}


def parse_tokens(text: str) -> float:
    """'1T', '500B', '2.5e12', '300M' -> tokens."""
    match = re.fullmatch(r"\s*([0-9]*\.?[0-9]+(?:[eE][+-]?[0-9]+)?)\s*([kKmMbBgGtT]?)\s*", text)
    value = float(match.group(1)) * _TOKEN_SUFFIXES[match.group(2).upper()] if match else math.nan
    if not (math.isfinite(value) and value >= 1):
        raise ClusterctlError(
            f"--tokens={text!r}: allowed: a number of tokens >= 1, with an optional K, M, B or T suffix (e.g. 1T)",
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
    """One instance type's answer."""

    instance_type: InstanceType
    fp8_backend: str  # the backend the run would use there ("none" where the GPU has no FP8)
    min_nodes_without_ac: int | None  # smallest node count that fits without activation checkpointing
    min_nodes_with_ac: int | None  # ... with it; None: not within MAX_NODES
    nodes: int | None  # the node count planned (--nodes, the deadline's, or the smallest that fits)
    activation_checkpointing: bool  # needed at `nodes`
    memory: MemoryEstimate | None  # per GPU at `nodes`
    mfu: MfuChoice
    total_flops: float
    tokens: float
    problem: str  # "" when the option is viable, else why not
    spare_nodes: int = 0  # hot spares the group holds beyond `nodes` (spareNodes): paid for, idle until a loss

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
    def mfu_effective(self) -> float:
        return self.mfu.at(self.activation_checkpointing)

    @property
    def fits(self) -> bool:
        return self.memory is not None and self.memory.fits

    @property
    def hours(self) -> float | None:
        if not self.nodes or not self.fits:
            return None
        return training_hours(self.total_flops, self.instance_type, self.nodes, self.mfu_effective)

    @property
    def gpu_hours(self) -> float | None:
        return None if self.hours is None else self.hours * self.gpus

    @property
    def cost_usd(self) -> float | None:
        """The whole group's: the job's nodes and the spares, for the training time."""
        if self.hours is None:
            return None
        return (self.nodes + self.spare_nodes) * self.hours * self.instance_type.on_demand_usd_per_hour

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


def run_shape(workload: Workload, activation_checkpointing: bool) -> RunShape:
    return RunShape(
        micro_batch_size=workload.micro_batch_size,
        seq_len=workload.seq_len,
        grad_accum_steps=workload.grad_accum_steps,
        activation_checkpointing=activation_checkpointing,
        reshard_after_forward=workload.reshard_after_forward,
    )


def memory_at(workload: Workload, instance: InstanceType, nodes: int, ac: bool) -> MemoryEstimate:
    return estimate_memory(workload.model, run_shape(workload, ac), nodes * instance.gpu_count,
                           instance.gpu_memory_gib)


def smallest_fit(workload: Workload, instance: InstanceType, ac: bool) -> int | None:
    """The fewest nodes (1..MAX_NODES) whose GPUs hold the step; memory per GPU only falls as nodes are added."""
    low, high = 1, MAX_NODES
    if not memory_at(workload, instance, high, ac).fits:
        return None
    while low < high:
        middle = (low + high) // 2
        if memory_at(workload, instance, middle, ac).fits:
            high = middle
        else:
            low = middle + 1
    return low


def plan_option(
    workload: Workload,
    instance: InstanceType,
    tokens: float,
    *,
    nodes: int | None = None,
    deadline_days: float | None = None,
    mfu_override: float | None = None,
    measurements: list[Measurement] | None = None,
    spare_nodes: int = 0,
) -> Option:
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
    without_ac = smallest_fit(workload, instance, False)
    with_ac = smallest_fit(workload, instance, True)
    total_flops = flops_per_token(workload.model, workload.seq_len) * tokens
    base = dict(instance_type=instance, fp8_backend=backend, min_nodes_without_ac=without_ac,
                min_nodes_with_ac=with_ac, mfu=mfu, total_flops=total_flops, tokens=tokens,
                spare_nodes=spare_nodes)

    def at(count: int, problem: str = "") -> Option:
        ac = without_ac is None or count < without_ac
        memory = memory_at(workload, instance, count, ac)
        return Option(nodes=count, activation_checkpointing=ac, memory=memory, problem=problem, **base)

    if with_ac is None:
        memory = memory_at(workload, instance, MAX_NODES, True)
        return Option(
            nodes=None, activation_checkpointing=True, memory=memory,
            problem=f"does not fit on {MAX_NODES} nodes, even with activation checkpointing "
            f"({memory.peak_bytes / 2**30:.1f} GiB per GPU, {memory.usable_bytes / 2**30:.1f} usable)",
            **base,
        )
    if nodes is not None:
        if nodes < with_ac:
            memory = memory_at(workload, instance, nodes, True)
            return Option(
                nodes=nodes, activation_checkpointing=True, memory=memory,
                problem=f"does not fit on {nodes} nodes (needs {with_ac}): "
                f"{memory.peak_bytes / 2**30:.1f} GiB per GPU, {memory.usable_bytes / 2**30:.1f} usable",
                **base,
            )
        return at(nodes)
    if deadline_days is not None:
        limit_hours = deadline_days * HOURS_PER_DAY
        for count in range(with_ac, MAX_NODES + 1):
            option = at(count)
            if option.hours <= limit_hours:
                return option
        slowest = at(MAX_NODES)
        return dataclasses.replace(
            slowest,
            problem=f"misses the deadline: {slowest.hours / HOURS_PER_DAY:.1f} days on {MAX_NODES} nodes "
            "(the most a cluster has)",
        )
    return at(with_ac)


def rank(options: list[Option], by: str) -> list[Option]:
    """Viable options, cheapest (by="cost") or fastest (by="time") first; the other figure breaks ties."""
    viable = [o for o in options if o.viable]
    if by == "cost":
        return sorted(viable, key=lambda o: (o.cost_usd, o.hours, o.instance_type.name))
    return sorted(viable, key=lambda o: (o.hours, o.cost_usd, o.instance_type.name))


def steps_for(workload: Workload, option: Option) -> int:
    """Optimizer steps that train at least the planned tokens on the option's GPUs."""
    tokens_per_step = workload.seq_len * workload.micro_batch_size * workload.grad_accum_steps * option.gpus
    return math.ceil(option.tokens / tokens_per_step)


def deploy_context(option: Option) -> list[str]:
    """The `cdk deploy` -c settings (cluster_spec/context.py SETTING_KEYS) for the option: on-demand capacity;
    a Capacity Block adds its own settings (`clusterctl capacity purchase` prints them)."""
    settings = [f"-c instanceType={option.instance_type.name}", f"-c nodeCount={option.nodes}"]
    return settings + ([f"-c spareNodes={option.spare_nodes}"] if option.spare_nodes else [])


def run_overrides(workload: Workload, option: Option, *, seq_len_given: bool, micro_batch_given: bool) -> list[str]:
    """The `--set` overrides that make the config file run what was planned."""
    overrides = [f"run.steps={steps_for(workload, option)}"]
    if seq_len_given:
        overrides.append(f"run.seq_len={workload.seq_len}")
    if micro_batch_given:
        overrides.append(f"run.micro_batch_size={workload.micro_batch_size}")
    if option.activation_checkpointing != workload.activation_checkpointing:
        overrides.append(f"parallel.activation_checkpointing={str(option.activation_checkpointing).lower()}")
    if option.fp8_backend != workload.fp8_backend:
        overrides.append(f"fp8.backend={option.fp8_backend}")
    return overrides


def flops_explain(workload: Workload, tokens: float) -> list[str]:
    cfg = workload.model
    non_embedding = count_params(cfg, include_embedding=False)
    per_token = flops_per_token(cfg, workload.seq_len)
    return [
        f"  FLOPs per token = 6 x {non_embedding:,} (parameters outside the embedding) + 12 x {cfg.n_layers} "
        f"layers x {cfg.dim} dim x {workload.seq_len} seq = {per_token:.4g} (training.shapes.flops_per_token, "
        "the trainer's MFU count)",
        f"  total = {per_token:.4g} x {tokens:.4g} tokens ({format_tokens(tokens)}) = {per_token * tokens:.4g} FLOPs",
    ]


def time_cost_explain(option: Option) -> list[str]:
    it = option.instance_type
    if option.hours is None:
        return []
    rate = option.gpus * it.peak_bf16_tflops_per_gpu * 1e12 * option.mfu_effective
    recompute = " (x 3/4: activation checkpointing recomputes the forward)" if (
        option.activation_checkpointing and not option.mfu.activation_checkpointing) else ""
    return [
        f"  throughput = {option.nodes} nodes x {it.gpu_count} GPUs x {it.peak_bf16_tflops_per_gpu:g} TFLOP/s "
        f"(dense BF16) x MFU {option.mfu_effective:.3f}{recompute} = {rate:.4g} FLOP/s",
        f"  time = {option.total_flops:.4g} / {rate:.4g} = {option.hours:,.1f} h "
        f"({option.hours / HOURS_PER_DAY:.1f} days); GPU-hours = {option.gpus} x {option.hours:,.1f} = "
        f"{option.gpu_hours:,.0f}",
        f"  cost = {_group(option)} x {option.hours:,.1f} h x ${it.on_demand_usd_per_hour:,.2f}/h (catalog on-demand, "
        f"us-east-1) = ${option.cost_usd:,.0f}; per million tokens ${option.usd_per_million_tokens:,.4f}",
    ]


def _group(option: Option) -> str:
    return f"({option.nodes} + {option.spare_nodes} spare)" if option.spare_nodes else str(option.nodes)
