"""`clusterctl plan`: reads its arguments, plans every instance type (clusterctl.plan.options) and prints the table,
the rankings and the commands that deploy and run the chosen option (or JSON). Needs no AWS access."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING, Any

from cluster_aws.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, ClusterctlError
from clusterctl.arguments import AddCommand, non_negative_int, positive_float
from clusterctl.plan import memory
from clusterctl.plan import options as plan
from clusterctl.plan.mfu import load_measurements
from clusterctl.plan.workload import Workload, load_workload
from clusterctl.render import format_table, to_json
from clusterctl.runtime import say
from instance_catalog.instance_types import INSTANCE_TYPES, get_instance_type
from training.shapes import count_params

if TYPE_CHECKING:
    from clusterctl.runtime import Runtime

GIB = memory.GIB


def add_parsers(add: AddCommand) -> None:
    """The `plan` subcommand; `add` is cli.build_parser's (it adds the global options)."""
    parser = add(
        "plan",
        "Before you buy: per instance type, whether the model trains (memory per GPU with FSDP full sharding), "
        "on how many nodes, in how long, for how much; ranked by cost and by time, with the commands that "
        "deploy and run the chosen one. Needs no AWS access. Exit 1 when no type fits.",
        epilog="Memory: sharded fp32 parameters, gradients and AdamW moments (16 B per parameter / GPUs), "
        "FSDP2's gathered bf16 blocks and reduce-scatter buffers, activations with or without activation "
        "checkpointing, the default loss on the full logits (12 B x vocab per token; parallel.loss_chunk_tokens "
        "> 0 holds about 6 B x vocab per chunk token plus the output head's gradient instead: less when a "
        "micro-batch has at least dim + chunk tokens), a 5% allocator margin and a 3 GiB runtime reserve "
        "(--explain shows it all). Time: "
        "training.shapes.flops_per_token x tokens / (GPUs x dense BF16 peak x MFU). Cost: the catalog's "
        "us-east-1 on-demand price.",
    )
    parser.add_argument(
        "--model", required=True,
        help="a preset (1b, llama3-8b, llama3-70b, ...: its packaged config) or a training config TOML file",
    )
    parser.add_argument("--tokens", required=True, help="tokens to train, e.g. 1T, 500B, 2e11")
    parser.add_argument(
        "--instance-types", metavar="TYPE,...", help="catalog types to consider (default: all of them)"
    )
    count = parser.add_mutually_exclusive_group()
    count.add_argument("--nodes", type=_positive_int, help="plan this node count (default: the fewest that fit)")
    count.add_argument(
        "--deadline-days", type=positive_float, metavar="DAYS",
        help="the fewest nodes that finish within DAYS",
    )
    parser.add_argument(
        "--spare-nodes", type=non_negative_int, default=0, metavar="N",
        help="hot spares beyond the job's nodes (the spareNodes setting): counted in the cost and the deploy "
        "command (default 0)",
    )
    parser.add_argument("--seq-len", type=_positive_int, help="tokens per sample (default: the config's)")
    parser.add_argument(
        "--micro-batch-size", type=_positive_int, help="samples per GPU per step (default: the config's)"
    )
    parser.add_argument(
        "--mfu", type=_fraction, metavar="FRACTION",
        help="model FLOPs utilization without activation checkpointing, e.g. 0.45 (default: a measured figure "
        "from benchmarks/mfu.json for the preset and GPU, else 0.40)",
    )
    parser.add_argument(
        "--choose", choices=("cost", "time"), default="cost",
        help="print the deploy and run commands of the cheapest (default) or the fastest option",
    )
    parser.add_argument("--explain", action="store_true", help="show the memory, FLOP, time and cost arithmetic")
    parser.set_defaults(handler=plan_command)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: an integer >= 1")
    return value


def _fraction(text: str) -> float:
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: a fraction in (0, 1], e.g. 0.4")
    return value


def plan_command(args: argparse.Namespace, runtime: Runtime) -> int:
    workload = load_workload(args.model, args.seq_len, args.micro_batch_size)
    tokens = plan.parse_tokens(args.tokens)
    types = _instance_types(args.instance_types)
    if args.deadline_days is not None and args.deadline_days <= 0:
        raise ClusterctlError(f"--deadline-days={args.deadline_days:g}: allowed: a number > 0", EXIT_USAGE)
    measurements = load_measurements()
    options = [
        plan.plan_option(
            workload, get_instance_type(name), tokens, nodes=args.nodes, deadline_days=args.deadline_days,
            mfu_override=args.mfu, measurements=measurements, spare_nodes=args.spare_nodes,
        )
        for name in types
    ]
    by_cost, by_time = plan.rank(options, "cost"), plan.rank(options, "time")
    chosen = (by_cost if args.choose == "cost" else by_time)[:1]
    commands = _commands(args, workload, chosen[0]) if chosen else None
    if args.json:
        say(runtime, to_json(_report(args, workload, tokens, options, by_cost, by_time, commands)))
    else:
        _print_text(args, runtime, workload, tokens, options, by_cost, by_time, commands)
    return EXIT_OK if chosen else EXIT_FAILED


def _instance_types(text: str | None) -> list[str]:
    if not text:
        return list(INSTANCE_TYPES)
    names = list(dict.fromkeys(n.strip() for n in text.split(",") if n.strip()))
    unknown = [n for n in names if n not in INSTANCE_TYPES]
    if unknown or not names:
        raise ClusterctlError(
            f"--instance-types={text!r}: allowed: a comma-separated subset of {', '.join(INSTANCE_TYPES)}",
            EXIT_USAGE,
        )
    return names


def _commands(args: argparse.Namespace, workload: Workload, option: plan.Option) -> dict[str, Any]:
    context = plan.deploy_context(option)
    overrides = plan.run_overrides(
        workload, option, seq_len_given=args.seq_len is not None, micro_batch_given=args.micro_batch_size is not None
    )
    name = option.instance_type.name
    return {
        "instanceType": name,
        "nodes": option.nodes,
        "cdkContext": context,
        "overrides": overrides,
        "quota": f"clusterctl quota --instance-type {name} --nodes {option.nodes + option.spare_nodes}",
        "deploy": f"npx cdk deploy {args.stack} " + " ".join(context),
        "submit": f"clusterctl submit --config {workload.config} --nodes {option.nodes} "
        + " ".join(f"--set {o}" for o in overrides),
    }


def _option_json(option: plan.Option) -> dict[str, Any]:
    it = option.instance_type
    mem = option.memory
    return {
        "instanceType": it.name,
        "gpu": f"{it.gpu_count}x {it.gpu_model} {it.gpu_memory_gib} GiB",
        "fp8Available": it.supports_fp8,
        "fp8Backend": option.fp8_backend,
        "viable": option.viable,
        "problem": option.problem or None,
        "minNodesWithoutActivationCheckpointing": option.min_nodes_without_ac,
        "minNodesWithActivationCheckpointing": option.min_nodes_with_ac,
        "nodes": option.nodes,
        "spareNodes": option.spare_nodes,
        "gpus": option.gpus,
        "activationCheckpointing": option.activation_checkpointing,
        "memoryPerGpu": None if mem is None else {
            "peakGiB": round(mem.peak_bytes / GIB, 3),
            "usableGiB": round(mem.usable_bytes / GIB, 3),
            "peakPhase": mem.peak.name,
            "phases": {p.name: {what: round(b / GIB, 4) for what, b in p.parts} for p in mem.phases},
        },
        "mfu": round(option.mfu_effective, 4),
        "mfuSource": option.mfu.source,
        "mfuDetail": option.mfu.detail,
        "hours": _round(option.hours, 2),
        "days": _round(option.hours and option.hours / plan.HOURS_PER_DAY, 2),
        "gpuHours": _round(option.gpu_hours, 1),
        "onDemandUsdPerInstanceHour": it.on_demand_usd_per_hour,
        "onDemandUsd": _round(option.cost_usd, 2),
        "usdPerMillionTokens": _round(option.usd_per_million_tokens, 4),
    }


def _report(args, workload, tokens, options, by_cost, by_time, commands) -> dict[str, Any]:
    return {
        "model": workload.name,
        "config": workload.config,
        "params": count_params(workload.model),
        "tokens": tokens,
        "seqLen": workload.seq_len,
        "microBatchSize": workload.micro_batch_size,
        "gradAccumSteps": workload.grad_accum_steps,
        "flopsPerToken": plan.flops_per_token(workload.model, workload.seq_len),
        "options": [_option_json(o) for o in options],
        "rankedByCost": [o.instance_type.name for o in by_cost],
        "rankedByTime": [o.instance_type.name for o in by_time],
        "choose": args.choose,
        "chosen": commands,
        "priceSource": "instance catalog on-demand list price, us-east-1 Linux",
    }


def _print_text(args, runtime, workload, tokens, options, by_cost, by_time, commands) -> None:
    params = count_params(workload.model)
    say(
        runtime,
        f"plan: {workload.name} ({params / 1e9:.2f}B parameters), {plan.format_tokens(tokens)} tokens, "
        f"seq {workload.seq_len} x micro-batch {workload.micro_batch_size} x accumulation "
        f"{workload.grad_accum_steps} per GPU ({workload.config})",
    )
    rows = [_row(o) for o in options]
    say(runtime, format_table(
        ("TYPE", "GPUS", "FP8", "FITS FROM", "NODES", "AC", "GIB/GPU", "MFU", "DAYS", "GPU-HOURS", "ON-DEMAND",
         "$/M TOKENS"), rows))
    for o in options:
        if o.problem:
            say(runtime, f"{o.instance_type.name}: {o.problem}")
    for detail in dict.fromkeys(f"MFU {o.instance_type.gpu_model} fp8 {o.fp8_backend}: {o.mfu.detail}"
                                for o in options):
        say(runtime, detail)
    if args.explain:
        say(runtime, "arithmetic:")
        for line in plan.flops_explain(workload, tokens):
            say(runtime, line)
        for o in options:
            say(runtime, f"{o.instance_type.name} at {o.nodes or plan.MAX_NODES} nodes "
                            f"({(o.nodes or plan.MAX_NODES) * o.instance_type.gpu_count} GPUs), activation "
                            f"checkpointing {'on' if o.activation_checkpointing else 'off'}:")
            if o.memory is not None:
                for line in memory.explain(o.memory):
                    say(runtime, line)
            for line in plan.time_cost_explain(o):
                say(runtime, line)
    if not by_cost:
        say(runtime, "no instance type fits: try a shorter --seq-len, --micro-batch-size 1, or a later deadline")
        return
    say(runtime, "by cost: " + ", ".join(f"{o.instance_type.name} ${o.cost_usd:,.0f}" for o in by_cost))
    say(runtime, "by time: " + ", ".join(
        f"{o.instance_type.name} {o.hours / plan.HOURS_PER_DAY:,.1f} days" for o in by_time))
    say(runtime, f"chosen ({'cheapest' if args.choose == 'cost' else 'fastest'}): {commands['instanceType']} x "
                    f"{commands['nodes']}; check the quota, deploy, then run:")
    say(runtime, f"  {commands['quota']}")
    say(runtime, f"  {commands['deploy']}")
    say(runtime, f"  {commands['submit']}")
    say(runtime, "estimates: on-demand us-east-1 list prices from the instance catalog; time at the MFU above, "
                    "with no restarts, checkpoint stalls or waiting for capacity. A Capacity Block is priced by its "
                    "fee: clusterctl capacity offerings --regions ...")


def _row(o: plan.Option) -> tuple[object, ...]:
    it = o.instance_type
    without, with_ac = o.min_nodes_without_ac, o.min_nodes_with_ac
    if with_ac is None:
        fits = "-"
    elif without == with_ac:
        fits = str(without)
    else:
        fits = f"{with_ac} (AC)" + (f", {without} without" if without is not None else "")
    fp8 = o.fp8_backend if it.supports_fp8 and o.fp8_backend != "none" else ("available" if it.supports_fp8 else "no")
    mem = o.memory
    return (
        it.name,
        f"{it.gpu_count}x{it.gpu_model} {it.gpu_memory_gib}G",
        fp8,
        fits,
        o.nodes if o.nodes else "-",
        "on" if o.activation_checkpointing else "off",
        "-" if mem is None else f"{mem.peak_bytes / GIB:.1f}/{mem.usable_bytes / GIB:.1f}",
        f"{o.mfu_effective:.2f}",
        _fmt(o.hours and o.hours / plan.HOURS_PER_DAY, ",.1f" if (o.hours or 0) >= 240 else ".2f"),
        _fmt(o.gpu_hours, ",.0f"),
        _fmt(o.cost_usd, ",.0f", "$"),
        _fmt(o.usd_per_million_tokens, ",.2f" if (o.usd_per_million_tokens or 0) >= 1 else ".4f", "$"),
    )


def _fmt(value: float | None, spec: str, prefix: str = "") -> str:
    return "-" if value is None else f"{prefix}{value:{spec}}"


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)
