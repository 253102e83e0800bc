"""`clusterctl plan`'s answer for people: the step it assumes, one row per instance type at the node count put
forward (clusterctl.plan.choose), where each figure comes from, the rankings, the choice and why, and the commands
that act on it."""

from __future__ import annotations

import argparse
import math
from dataclasses import dataclass
from typing import Any

from clusterctl.plan import memory
from clusterctl.plan import options as plan
from clusterctl.plan.choose import COST_TIE_FRACTION, limit_reason
from clusterctl.plan.explain import flops_explain, time_cost_explain
from clusterctl.plan.fsx_cost import FsxCost
from clusterctl.plan.layouts import Layout
from clusterctl.plan.search import fsdp_step
from clusterctl.plan.workload import Workload
from clusterctl.render import format_table
from training.shapes import count_params
from training.young_daly import interval_line

GIB = memory.GIB
FEW_TOKENS = 1e6  # fewer is a few optimizer steps at most: likely a forgotten suffix (200 for 200B)
MFU_FROM = {"measured": "measured", "default": "assumed", "--mfu": "--mfu"}


@dataclass(frozen=True)
class PlanView:
    args: argparse.Namespace
    workload: Workload
    tokens: float
    global_batch_tokens: int
    fsx: FsxCost | None
    options: list[plan.Option]
    by_cost: list[plan.Option]
    by_time: list[plan.Option]
    commands: dict[str, Any] | None
    finetune: list[str] = ()  # clusterctl.plan.finetune's lines: each setting of a fine-tune and why

    @property
    def horizon_applies(self) -> bool:
        return self.args.choose == "cost" and self.args.nodes is None and self.args.deadline_days is None


def lines(view: PlanView) -> list[str]:
    args, workload, tokens = view.args, view.workload, view.tokens
    params = count_params(workload.model)
    out = [
        f"plan: {workload.name} ({params / 1e9:.2f}B parameters), {plan.format_tokens(tokens)} tokens, seq "
        f"{workload.seq_len} x micro-batch {workload.micro_batch_size} per GPU ({workload.config})",
        f"global batch: {view.global_batch_tokens:,} tokens a step at any node count ({_batch_source(view)}): "
        f"{math.ceil(tokens / view.global_batch_tokens):,} steps; gradient accumulation = global batch / (seq x "
        "micro-batch x GPUs), so only node counts that split it evenly are planned",
        format_table(
            ("TYPE", "GPUS", "FP8", "FITS FROM", "NODES", "LAYOUT", "ACCUM", "AC", "GIB/GPU", "MFU", "MFU FROM",
             "DAYS", "INSTANCES", "FSX", "TOTAL", "$/M TOKENS"),
            [_row(o) for o in view.options]),
    ]
    if tokens < FEW_TOKENS:
        out.insert(1, f"warning: --tokens {args.tokens} is {tokens:,.0f} tokens, under 1M: a forgotten suffix? "
                      f"(K, M, B, T: {args.tokens}B is {plan.format_tokens(tokens * 1e9)})")
    out += list(view.finetune)
    out += [f"{o.instance_type.name}: {o.problem}" for o in view.options if o.problem]
    out += [step_line(o, workload, view.global_batch_tokens) for o in view.options if o.viable and o.choice]
    # each GPU saves its shard: the state over the GPUs of one replica (HSDP's replicas hold copies)
    out += [interval_line(o.nodes, params, o.gpus // o.choice.layout.dp_replicate, o.choice.step.total_s)
            for o in view.options if o.viable and o.choice and o.nodes]
    out += [f"{o.instance_type.name}: {o.days:,.1f} days even at {o.nodes} nodes ({limit_reason(o)})"
            for o in view.options if o.viable and not o.within_horizon]
    out += list(dict.fromkeys(f"MFU {o.instance_type.gpu_model} fp8 {o.fp8_backend}: {o.mfu.detail}"
                              for o in view.options))
    if any("TP" in fits_from(o) for o in view.options):
        out.append("FITS FROM (TP t): the fewest nodes fit as FSDP over the other GPUs x TP t inside a node (the "
                   "layout with the least memory there); NODES and LAYOUT are where the plan runs it")
    if any(_mfu_scaled(o) for o in view.options):
        out.append("MFU FROM x3/4 (AC): activation checkpointing recomputes the forward, a third more work than the "
                   "model FLOPs count, so a figure without it is worth 3/4 with it (x4/3 the other way)")
    out.append(view.fsx.describe() if view.fsx else "FSx for Lustre: not counted (no cdk.json beside clusterctl)")
    if args.explain:
        out.append("arithmetic:")
        out += flops_explain(workload, tokens)
        for o in view.options:
            out.append(f"{o.instance_type.name} at {o.nodes or plan.MAX_NODES} nodes "
                       f"({(o.nodes or plan.MAX_NODES) * o.instance_type.gpu_count} GPUs), activation "
                       f"checkpointing {'on' if o.activation_checkpointing else 'off'}:")
            if o.memory is not None:
                out += memory.explain(o.memory)
            out += time_cost_explain(o)
    if not view.by_cost:
        out.append(_none_fits(view))
        return out
    out.append("by cost: " + ", ".join(f"{o.instance_type.name} ${o.cost_usd:,.0f}" for o in view.by_cost))
    out.append("by time: " + ", ".join(f"{o.instance_type.name} {o.days:,.1f} days" for o in view.by_time))
    chosen = (view.by_cost if args.choose == "cost" else view.by_time)[0]
    if view.horizon_applies and not chosen.within_horizon:
        out.append(f"warning: no plan finishes within {args.horizon_days:g} days: each type is shown at its fastest "
                   "count; --horizon-days allows longer")
    out.append(f"chosen: {chosen.instance_type.name} x {chosen.nodes}, {chosen.days:,.1f} days, "
               f"${chosen.cost_usd:,.0f} (${chosen.usd_per_million_tokens:,.2f} per million tokens): {_why(view)}; "
               "check the quota, deploy, then run:")
    commands = view.commands or {}
    out += [f"  {commands['quota']}", f"  {commands['deploy']}", f"  {commands['submit']}"]
    if commands["runWarnings"]:  # the trainer's own check of the submit line: it would print these at start-up
        out += [f"warning: {w}" for w in commands["runWarnings"]]
        if not view.finetune:
            out.append("warning: a run that continues published weights: clusterctl plan --finetune sizes the "
                       "warmup, learning rate and checkpoint and validation intervals for its length")
    out.append("estimates: on-demand us-east-1 list prices from the instance catalog; time from the step model: "
               "compute at the MFU above as the kernels' efficiency, plus the communication it does not hide "
               "(instance_catalog/network.py), with no restarts, checkpoint stalls or waiting for capacity. A "
               "Capacity Block is priced by its fee: clusterctl capacity offerings --regions ...")
    return out


def _none_fits(view: PlanView) -> str:
    """The last line when no type runs: the reason itself where every type has the same one (--nodes 3 that
    splits no global batch), else the advice for memory."""
    problems = list(dict.fromkeys(o.problem for o in view.options))
    advice = "try a shorter --seq-len, --micro-batch-size 1, or a later deadline"
    memory_only = all("does not fit" in p for p in problems)
    if len(problems) == 1:
        return f"no instance type fits: {problems[0]}" + (f"; {advice}" if memory_only else "")
    if memory_only:
        return f"no instance type fits: {advice}"
    return f"no instance type fits: {view.options[0].problem} (each type's reason is above)"


def _batch_source(view: PlanView) -> str:
    if view.args.global_batch_tokens:
        return "--global-batch-tokens"
    if view.workload.global_batch_tokens:
        return f"run.global_batch_tokens in {view.workload.config}"
    if view.finetune:
        return "the fine-tune default, Tulu 3's 128 x 4096 tokens (below)"
    return (f"the default, {plan.DEFAULT_GLOBAL_BATCH_TOKENS / 2**20:g}Mi tokens as Llama 2 and 3 trained; "
            "--global-batch-tokens changes it")


def _why(view: PlanView) -> str:
    args = view.args
    if args.nodes is not None:
        return f"the cheapest type at --nodes {args.nodes}" if args.choose == "cost" else \
            f"the fastest type at --nodes {args.nodes}"
    if args.deadline_days is not None:
        return (f"each type at the fewest nodes that finish within {args.deadline_days:g} days, then the "
                + ("cheapest" if args.choose == "cost" else "fastest"))
    if args.choose == "time":
        return "the fastest type, each at its fastest node count within the cluster's limit"
    return (f"the cheapest per token of the plans that finish within {args.horizon_days:g} days (costs within "
            f"{COST_TIE_FRACTION:.0%} count as equal: then the fewest nodes, easier to get)")


def _row(o: plan.Option) -> tuple[object, ...]:
    it = o.instance_type
    fits = fits_from(o)
    fp8 = o.fp8_backend if it.supports_fp8 and o.fp8_backend != "none" else ("available" if it.supports_fp8 else "no")
    mem = o.memory
    days = _fmt(o.days, ",.1f" if (o.days or 0) >= 10 else ".2f")
    if o.hours is not None and not o.within_horizon:
        days += f" (>{o.horizon_days:g})"
    return (
        it.name,
        f"{it.gpu_count}x{it.gpu_model} {it.gpu_memory_gib}G",
        fp8,
        fits,
        o.nodes if o.nodes else "-",
        o.choice.layout.name if o.viable and o.choice else "-",
        o.grad_accum_steps if o.viable else "-",
        "on" if o.activation_checkpointing else "off",
        "-" if mem is None else f"{mem.peak_bytes / GIB:.1f}/{mem.usable_bytes / GIB:.1f}",
        f"{o.mfu_effective:.2f}",
        MFU_FROM.get(o.mfu.source, o.mfu.source) + _mfu_scaled(o),
        days,
        _fmt(o.instances_usd, ",.0f", "$"),
        _fmt(o.fsx_usd, ",.0f", "$"),
        _fmt(o.cost_usd, ",.0f", "$"),
        _fmt(o.usd_per_million_tokens, ",.2f" if (o.usd_per_million_tokens or 0) >= 1 else ".4f", "$"),
    )


def fits_from(o: plan.Option) -> str:
    """The FITS FROM cell: the fewest nodes some layout fits on, "(AC)" where only with activation checkpointing
    (then from how many without), and "TP t" where that layout is FSDP x TP t rather than FSDP over every GPU."""
    without, with_ac = o.min_nodes_without_ac, o.min_nodes_with_ac
    if with_ac is None:
        return "-"

    def tags(layout: Layout | None, *first: str) -> str:
        found = [*first, *([f"TP {layout.tp}"] if layout is not None and layout.tp > 1 else [])]
        return f" ({', '.join(found)})" if found else ""

    if without == with_ac:
        return f"{without}{tags(o.fits_from_layout_without_ac)}"
    return f"{with_ac}{tags(o.fits_from_layout_with_ac, 'AC')}" + (
        f", {without}{tags(o.fits_from_layout_without_ac)} without" if without is not None else "")


def _mfu_scaled(o: plan.Option) -> str:
    """What the MFU column's figure is of its source: " x3/4 (AC)" where the row recomputes and the source did
    not (clusterctl.plan.mfu.RECOMPUTE_FACTOR), " x4/3 (no AC)" the other way, else ""."""
    if o.activation_checkpointing == o.mfu.activation_checkpointing:
        return ""
    return " x3/4 (AC)" if o.activation_checkpointing else " x4/3 (no AC)"


def _fmt(value: float | None, spec: str, prefix: str = "") -> str:
    return "-" if value is None else f"{prefix}{value:{spec}}"


def step_line(o: plan.Option, workload: Workload, global_batch_tokens: int) -> str:
    """The chosen layout at the option's count: the step split, the predicted MFU and tokens/s, the flags, and what
    it saves over FSDP across every GPU."""
    step, layout = o.choice.step, o.choice.layout
    line = (f"{o.instance_type.name} x {o.nodes}: {layout.name}, step {step.total_s:.2f} s = compute "
            f"{step.compute_s:.2f} s + exposed communication {step.exposed_s:.2f} s (FSDP {step.fsdp_exposed_s:.2f}, "
            f"HSDP {step.replica_exposed_s:.2f}, TP {step.tp_s:.2f}); predicted MFU {step.mfu:.3f}, "
            f"{step.tokens_per_s_per_gpu:,.0f} tokens/s per GPU; " + " ".join(f"--set {f}" for f in layout.overrides))
    if layout.dp_replicate == 1 and layout.tp == 1:
        return line
    fsdp = fsdp_step(workload, o.instance_type, o.nodes, global_batch_tokens, o.efficiency)
    if fsdp is None:
        return line + "; FSDP alone does not run or fit here"
    saved = 1 - step.total_s / fsdp.total_s
    return line + (f"; FSDP {layout.gpus} would take {fsdp.total_s:.2f} s a step "
                   f"({fsdp.exposed_s:.2f} s exposed): {percent(abs(saved))} {'saved' if saved >= 0 else 'more'}")


def percent(fraction: float) -> str:
    """A share as a percentage: one decimal under 10% (a 0.3% saving is not 0%), whole above; "<0.1%" for a
    share that one decimal would still print as 0.0%."""
    if 0 < fraction < 0.0005:
        return "<0.1%"
    return f"{fraction:.1%}" if fraction < 0.095 else f"{fraction:.0%}"
