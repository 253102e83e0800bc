"""`clusterctl plan`: reads its arguments, plans every instance type (clusterctl.plan.options, the node count to put
forward by clusterctl.plan.choose) and prints the table (clusterctl.plan.text), the rankings and the commands that
deploy and run the chosen option (or JSON). Needs no AWS access."""

from __future__ import annotations

import argparse
import math
from typing import TYPE_CHECKING, Any

from cluster_aws.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, ClusterctlError
from clusterctl.arguments import AddCommand, non_negative_int, positive_float
from clusterctl.capacity.pricing import CATALOG_PRICE_REGION
from clusterctl.plan import choose, memory, text
from clusterctl.plan import options as plan
from clusterctl.plan.choose import HORIZON_DAYS
from clusterctl.plan.finetune import GLOBAL_BATCH_TOKENS as FINETUNE_GLOBAL_BATCH_TOKENS
from clusterctl.plan.finetune import FinetuneSchedule, finetune_schedule
from clusterctl.plan.fsx_cost import PRICE_SOURCE, stack_fsx
from clusterctl.plan.layouts import LAYOUT_SYNTAX, LayoutRequest, parse_layout
from clusterctl.plan.mfu import load_measurements
from clusterctl.plan.options import DEFAULT_GLOBAL_BATCH_TOKENS, MAX_NODES
from clusterctl.plan.workload import Workload, load_workload, run_config
from clusterctl.render import deploy_command, to_json
from clusterctl.runtime import say
from instance_catalog.instance_types import INSTANCE_TYPES, get_instance_type
from training.config import packaged_config_names
from training.config.schedule import run_length_warnings
from training.shapes import count_params

if TYPE_CHECKING:
    from clusterctl.runtime import Runtime

GIB = memory.GIB


def add_parsers(add: AddCommand) -> None:
    """The `plan` subcommand; `add` is cli.build_parser's (it adds the global options)."""
    parser = add(
        "plan",
        "Before you buy: per instance type, whether the model trains (memory per GPU under the layout), on how "
        "many nodes, with which parallel layout, in how long, for how much (instances and FSx for Lustre); by "
        "default the cheapest "
        "per token of the node counts that finish within --horizon-days, with the commands that deploy and run "
        "it. Needs no AWS access. Exit 1 when no type fits.",
        epilog="Node counts: those that split the global batch (--global-batch-tokens) into whole micro-batches, "
        f"up to {MAX_NODES} (nodeCount + spareNodes). Memory: sharded fp32 parameters, gradients and AdamW moments "
        "(16 B per parameter / GPUs), "
        "FSDP2's gathered bf16 blocks and reduce-scatter buffers, activations with or without activation "
        "checkpointing, the default loss on the full logits (12 B x vocab per token; parallel.loss_chunk_tokens "
        "> 0 holds about 6 B x vocab per chunk token plus the output head's gradient instead: less when a "
        "micro-batch has at least dim + chunk tokens), a 5% allocator margin and a 3 GiB runtime reserve "
        "(--explain shows it all). Time: "
        "tokens / (GPUs x tokens/s per GPU), a step being its compute (training.shapes.flops_per_token over the "
        "dense BF16 peak x MFU) plus the communication compute does not hide (the layout's collectives over the "
        "instance type's network model, instance_catalog/network.py). Cost: the catalog's "
        "us-east-1 on-demand price, plus the stack's FSx for Lustre (cdk.json's size and throughput tier) at its "
        "us-east-1 list price.",
        example="clusterctl plan --model llama3-8b --tokens 200B",
    )
    parser.add_argument(
        "--model", required=True,
        help=f"a packaged training config ({', '.join(packaged_config_names())}), named as `python -m training "
        "--config` names it, or a training config TOML file",
    )
    parser.add_argument("--tokens", required=True, help="tokens to train: a positive count, e.g. 200B, 1T, 2e11")
    parser.add_argument(
        "--instance-types", metavar="TYPE,...", help="catalog types to consider (default: all of them)"
    )
    count = parser.add_mutually_exclusive_group()
    count.add_argument("--nodes", type=_node_count,
                       help=f"plan this node count, 1 to {MAX_NODES} (default: the count chosen per --choose)")
    count.add_argument(
        "--deadline-days", type=positive_float, metavar="DAYS",
        help="the fewest nodes that finish within DAYS (default: no deadline)",
    )
    parser.add_argument(
        "--horizon-days", type=positive_float, metavar="DAYS", default=HORIZON_DAYS,
        help=f"with --choose cost: the cheapest plan that finishes within DAYS (default {HORIZON_DAYS:g})",
    )
    parser.add_argument(
        "--global-batch-tokens", type=_positive_int, metavar="TOKENS",
        help="tokens per optimizer step at any node count (run.global_batch_tokens; default: the config's, else "
        f"{DEFAULT_GLOBAL_BATCH_TOKENS:,})",
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
        help="cost (default): each type at its cheapest per token within --horizon-days; time: each type at its "
        "fastest node count within the cluster's limit; prints the commands of the best",
    )
    parser.add_argument(
        "--layout", metavar="DEGREES",
        help=f"plan this parallel layout only: {LAYOUT_SYNTAX} (default: per node count, the fastest that fits: "
        "FSDP, HSDP with shard groups of 1, 2, 4 ... nodes, TP 2/4/8 inside a node, and their mixes)",
    )
    parser.add_argument(
        "--finetune", action="store_true",
        help="a run that continues published weights: the global batch (2**19 tokens, Tulu 3's), peak lr 2e-5 "
        "(torchtune's Llama 3.1 8B full fine-tune), a 3%% warmup, a cosine to 0, and checkpoint and validation "
        "intervals sized for the run's length, each printed with its reason and added to the submit line "
        "(default: on with --init-hf-dir or a config with init.hf_dir)",
    )
    parser.add_argument(
        "--init-hf-dir", metavar="DIR",
        help="the Hugging Face model directory on the nodes to start from (init.hf_dir, e.g. "
        "/fsx/data/Llama-3.1-8B): added to the submit line; implies --finetune (default: the config's, if any)",
    )
    parser.add_argument("--explain", action="store_true",
                        help="show the memory, FLOP, step-time (network model) and cost arithmetic")
    parser.set_defaults(handler=plan_command)


def _positive_int(text: str) -> int:
    try:
        value = int(text)
    except ValueError:
        value = 0
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: an integer >= 1")
    return value


def _node_count(text: str) -> int:
    value = _positive_int(text)
    if value > MAX_NODES:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: 1 to {MAX_NODES} (a cluster's nodeCount + spareNodes)")
    return value


def _fraction(text: str) -> float:
    value = positive_float(text)
    if value > 1:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: a fraction in (0, 1], e.g. 0.4")
    return value


def plan_command(args: argparse.Namespace, runtime: Runtime) -> int:
    if args.region not in (None, CATALOG_PRICE_REGION):
        raise ClusterctlError(
            f"--region={args.region}: plan prices every type at the catalog's {CATALOG_PRICE_REGION} list prices "
            f"and asks no AWS API; drop --region, and see {args.region}'s prices with `clusterctl capacity prices "
            f"--regions {args.region}`", EXIT_USAGE)
    workload = load_workload(args.model, args.seq_len, args.micro_batch_size)
    tokens = plan.parse_tokens(args.tokens)
    types = _instance_types(args.instance_types)
    if (args.nodes or 1) + args.spare_nodes > MAX_NODES:
        raise ClusterctlError(f"--spare-nodes={args.spare_nodes}: --nodes + --spare-nodes must be <= {MAX_NODES} "
                              f"(--nodes={args.nodes or 'at least 1'})", EXIT_USAGE)
    finetune = bool(args.finetune or args.init_hf_dir or workload.run_config.init.hf_dir)
    global_batch = args.global_batch_tokens or workload.global_batch_tokens or (
        FINETUNE_GLOBAL_BATCH_TOKENS if finetune else DEFAULT_GLOBAL_BATCH_TOKENS)
    schedule = finetune_schedule(math.ceil(tokens / global_batch), global_batch, workload.run_config,
                                 args.init_hf_dir or "") if finetune else None
    layout = _layout(args.layout)
    fsx = stack_fsx()
    measurements = load_measurements()
    options = [
        choose.plan_option(
            workload, get_instance_type(name), tokens, choose=args.choose, nodes=args.nodes,
            deadline_days=args.deadline_days, horizon_days=args.horizon_days, global_batch_tokens=global_batch,
            mfu_override=args.mfu, measurements=measurements, spare_nodes=args.spare_nodes,
            fsx_usd_per_hour=fsx.usd_per_hour if fsx else 0.0, layout=layout,
        )
        for name in types
    ]
    if layout is not None and not any(o.viable for o in options):
        raise ClusterctlError(f"{options[0].problem}; allowed: {LAYOUT_SYNTAX}, whose product is the GPUs, tp "
                              "dividing a node's GPUs and the model's heads, dp_replicate dividing the nodes",
                              EXIT_USAGE)
    by_cost, by_time = choose.rank(options, "cost"), choose.rank(options, "time")
    chosen = (by_cost if args.choose == "cost" else by_time)[:1]
    commands = _commands(args, workload, chosen[0], schedule) if chosen else None
    batch_given = bool(args.global_batch_tokens or workload.global_batch_tokens)
    finetune_lines = [] if schedule is None else schedule.lines(
        run_config(workload, schedule.overrides(workload.run_config)), batch_given=batch_given)
    plan_view = text.PlanView(args, workload, tokens, global_batch, fsx, options, by_cost, by_time, commands,
                              finetune_lines)
    say(runtime, to_json(_report(plan_view)) if args.json else "\n".join(text.lines(plan_view)))
    return EXIT_OK if chosen else EXIT_FAILED


def _layout(given: str | None) -> LayoutRequest | None:
    if given is None:
        return None
    try:
        return parse_layout(given)
    except ValueError as error:
        raise ClusterctlError(str(error), EXIT_USAGE) from None


def _instance_types(given: str | None) -> list[str]:
    if not given:
        return list(INSTANCE_TYPES)
    names = list(dict.fromkeys(n.strip() for n in given.split(",") if n.strip()))
    unknown = [n for n in names if n not in INSTANCE_TYPES]
    if unknown or not names:
        raise ClusterctlError(
            f"--instance-types={given!r}: allowed: a comma-separated subset of {', '.join(INSTANCE_TYPES)}",
            EXIT_USAGE,
        )
    return names


def _commands(args: argparse.Namespace, workload: Workload, option: plan.Option,
              schedule: FinetuneSchedule | None) -> dict[str, Any]:
    context = plan.deploy_context(option)
    overrides = plan.run_overrides(
        workload, option, seq_len_given=args.seq_len is not None, micro_batch_given=args.micro_batch_size is not None
    )
    if schedule is not None:
        overrides += schedule.overrides(workload.run_config)
    runs = run_config(workload, overrides)  # what the submit line runs, read as the trainer reads it
    name = option.instance_type.name
    return {
        "instanceType": name,
        "nodes": option.nodes,
        "cdkContext": context,
        "overrides": overrides,
        "quota": f"clusterctl quota --instance-type {name} --nodes {option.nodes + option.spare_nodes}",
        "deploy": deploy_command(args.stack, context),
        "submit": f"clusterctl submit --config {workload.config} --nodes {option.nodes} "
        + " ".join(f"--set {o}" for o in overrides),
        # the trainer's start-up check on the submit line's config (submit says the same before it sends)
        "runWarnings": run_length_warnings(runs, cluster_job=True),
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
        "nodeCounts": list(option.node_counts),
        "nodes": option.nodes,
        "spareNodes": option.spare_nodes,
        "gpus": option.gpus,
        "gradAccumSteps": option.grad_accum_steps if option.viable else None,
        "activationCheckpointing": option.activation_checkpointing,
        "memoryPerGpu": None if mem is None else {
            "peakGiB": round(mem.peak_bytes / GIB, 3),
            "usableGiB": round(mem.usable_bytes / GIB, 3),
            "peakPhase": mem.peak.name,
            "phases": {p.name: {what: round(b / GIB, 4) for what, b in p.parts} for p in mem.phases},
        },
        "layout": None if option.choice is None else {
            "name": option.choice.layout.name, "dpReplicate": option.choice.layout.dp_replicate,
            "dpShard": option.choice.layout.dp_shard, "tp": option.choice.layout.tp,
            "overrides": option.choice.layout.overrides,
        },
        "step": None if option.choice is None else _step_json(option),
        "mfu": round(option.mfu_effective, 4),
        "mfuSource": option.mfu.source,
        "mfuDetail": option.mfu.detail,
        "hours": _round(option.hours, 2),
        "days": _round(option.days, 2),
        "withinHorizon": option.within_horizon if option.hours is not None else None,
        "gpuHours": _round(option.gpu_hours, 1),
        "onDemandUsdPerInstanceHour": it.on_demand_usd_per_hour,
        "onDemandUsd": _round(option.instances_usd, 2),
        "fsxUsd": _round(option.fsx_usd, 2),
        "totalUsd": _round(option.cost_usd, 2),
        "usdPerMillionTokens": _round(option.usd_per_million_tokens, 4),
    }


def _report(view: text.PlanView) -> dict[str, Any]:
    workload, args = view.workload, view.args
    return {
        "model": workload.name,
        "config": workload.config,
        "params": count_params(workload.model),
        "tokens": view.tokens,
        "seqLen": workload.seq_len,
        "microBatchSize": workload.micro_batch_size,
        "globalBatchTokens": view.global_batch_tokens,
        "steps": math.ceil(view.tokens / view.global_batch_tokens),
        "horizonDays": args.horizon_days if args.choose == "cost" and args.nodes is None
        and args.deadline_days is None else None,
        "flopsPerToken": plan.flops_per_token(workload.model, workload.seq_len),
        "fsx": None if view.fsx is None else {
            "storageGiB": view.fsx.storage_gib, "throughputMBpsPerTiB": view.fsx.throughput_mbps_per_tib,
            "usdPerHour": round(view.fsx.usd_per_hour, 4), "source": view.fsx.source, "priceSource": PRICE_SOURCE,
        },
        "options": [_option_json(o) for o in view.options],
        "rankedByCost": [o.instance_type.name for o in view.by_cost],
        "rankedByTime": [o.instance_type.name for o in view.by_time],
        "choose": args.choose,
        "chosen": view.commands,
        "finetune": view.finetune or None,
        "priceSource": "instance catalog on-demand list price, us-east-1 Linux",
    }


def _round(value: float | None, digits: int) -> float | None:
    return None if value is None else round(value, digits)


def _step_json(option: plan.Option) -> dict[str, Any]:
    step = option.choice.step
    return {
        "seconds": round(step.total_s, 4), "computeSeconds": round(step.compute_s, 4),
        "exposedCommunicationSeconds": round(step.exposed_s, 4), "fsdpExposedSeconds": round(step.fsdp_exposed_s, 4),
        "hsdpExposedSeconds": round(step.replica_exposed_s, 4), "tpSeconds": round(step.tp_s, 4),
        "computeEfficiency": round(option.efficiency, 4), "predictedMfu": round(step.mfu, 4),
        "tokensPerSecondPerGpu": round(step.tokens_per_s_per_gpu, 1),
    }
