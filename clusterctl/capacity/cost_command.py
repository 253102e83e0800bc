"""`clusterctl cost`: the estimated on-demand cost, from the instance catalog, of a plan (--instance-type,
--nodes, --hours) or of a job so far (--job: from the job table's attempts)."""

from __future__ import annotations

import argparse
import dataclasses

from cluster_aws import stack_outputs as stack
from cluster_aws.errors import EXIT_OK, EXIT_USAGE, ClusterctlError
from cluster_jobs import records as job_records
from cluster_jobs.cost import CostEstimate, cost_so_far, estimate_cost
from cluster_jobs.document import find_job
from cluster_jobs.request import validate_job_id
from cluster_jobs.table import JobTable
from cluster_spec.settings import MAX_SPARE_NODES
from clusterctl.arguments import AddCommand, instance_type, non_negative_hours, positive_int
from clusterctl.capacity import pricing
from clusterctl.capacity.regions import regional_client
from clusterctl.render import format_time, format_usd, to_json
from clusterctl.runtime import Runtime, say, stack_outputs


def cost(args: argparse.Namespace, runtime: Runtime) -> int:
    if args.job:
        if args.nodes is not None or args.hours is not None or args.spare_nodes:
            raise ClusterctlError(
                "--job takes the nodes and hours from the job, and the spares from the stack: drop "
                "--nodes/--hours/--spare-nodes", EXIT_USAGE
            )
        assert runtime.context is not None
        validate_job_id(args.job)
        outputs = stack_outputs(args, runtime)
        recorded = _recorded_cost(runtime, outputs, args.job)
        if recorded is not None:
            estimate, label = recorded
            _print_cost(args, runtime, estimate, label, outputs.spare_nodes)
            return EXIT_OK
        record = find_job(runtime.context.client("ssm"), outputs.job_document_name, args.job)
        if record is None:
            raise ClusterctlError(
                f"job {args.job}: not in SSM's command history (unknown id, or older than 30 days)"
            )
        estimate = cost_so_far(
            outputs.instance_type, len(record.instance_ids), record.requested_at, runtime.now()
        )
        label = f"job {args.job} so far ({format_time(record.requested_at)} to now)"
        _print_cost(args, runtime, estimate, label, outputs.spare_nodes)
        return EXIT_OK
    if args.nodes is None or args.hours is None:
        raise ClusterctlError("cost needs --nodes and --hours (a plan) or --job JOB", EXIT_USAGE)
    _print_cost(args, runtime, estimate_cost(args.instance_type, args.nodes, args.hours), "plan", args.spare_nodes)
    return EXIT_OK


def _recorded_cost(
    runtime: Runtime, outputs: stack.StackOutputs, job_id: str
) -> tuple[CostEstimate, str] | None:
    """A job in the job table: its node-hours over every attempt (a restart's nodes are other instances, and
    SSM's history of the job's start commands names them all), as nodes x equivalent hours."""
    assert runtime.context is not None
    if outputs.job_table_name is None:
        return None
    record = JobTable(runtime.context.client("dynamodb"), outputs.job_table_name).get(job_id)
    if record is None:
        return None
    held = job_records.node_hours(record, runtime.now())
    attempts = "1 attempt" if record.attempt == 1 else f"{record.attempt} attempts"
    label = f"job {job_id} so far ({attempts} in the job table, {held:.2f} node-hours)"
    return estimate_cost(record.instance_type, record.nodes, held / record.nodes), label


def _regional_price(args: argparse.Namespace, runtime: Runtime, estimate: CostEstimate) -> tuple[CostEstimate, str]:
    """The estimate at --region's on-demand price from the AWS Price List (the catalog's is us-east-1's), and where
    the price came from; without --region, or with us-east-1, the catalog's."""
    catalog = (estimate, f"the catalog's on-demand price, {format_usd(estimate.usd_per_instance_hour)} per "
               f"instance-hour ({pricing.CATALOG_PRICE_REGION} Linux)")
    if args.region in (None, pricing.CATALOG_PRICE_REGION):
        return catalog
    assert runtime.context is not None
    client = regional_client(runtime.context, "pricing", pricing.PRICING_API_REGION)
    price = pricing.on_demand_prices(client, estimate.instance_type, [args.region])[args.region]
    if price.usd_per_hour is None:
        raise ClusterctlError(f"--region={args.region}: {price.note} ({estimate.instance_type})")
    regional = dataclasses.replace(estimate, usd_per_instance_hour=price.usd_per_hour)
    if price.source == "price-list":
        return regional, (f"{args.region}'s on-demand price from the AWS Price List, "
                          f"{format_usd(price.usd_per_hour)} per instance-hour (Linux)")
    return regional, f"{format_usd(price.usd_per_hour)} per instance-hour, the {price.note}"


def _print_cost(args: argparse.Namespace, runtime: Runtime, estimate: CostEstimate, label: str,
                spare_nodes: int) -> None:
    """The job's (or plan's) nodes, then the spares the group holds beside them over the same hours: idle, and
    billed all the same."""
    estimate, price_source = _regional_price(args, runtime, estimate)
    spares = dataclasses.replace(estimate, nodes=spare_nodes) if spare_nodes else None
    if args.json:
        say(
            runtime,
            to_json(
                {
                    "label": label,
                    "instanceType": estimate.instance_type,
                    "nodes": estimate.nodes,
                    "hours": round(estimate.hours, 4),
                    "usdPerInstanceHour": estimate.usd_per_instance_hour,
                    "priceSource": price_source,
                    "usdPerHour": round(estimate.usd_per_hour, 2),
                    "totalUsd": round(estimate.total_usd, 2),
                    "gpuHours": round(estimate.gpu_hours, 2),
                    "spareNodes": spare_nodes,
                    "spareUsd": round(spares.total_usd, 2) if spares else 0.0,
                    "totalWithSparesUsd": round(estimate.total_usd + (spares.total_usd if spares else 0.0), 2),
                }
            ),
        )
        return
    say(
        runtime,
        f"{label}: {estimate.nodes} x {estimate.instance_type} for {estimate.hours:.2f} h = "
        f"{format_usd(estimate.total_usd)} ({format_usd(estimate.usd_per_hour)}/h, "
        f"{estimate.gpu_hours:,.0f} GPU-hours)",
    )
    if spares is not None:
        say(runtime, f"plus {spare_nodes} hot spare{'s' if spare_nodes > 1 else ''} (spareNodes) over the same "
                     f"{estimate.hours:.2f} h = {format_usd(spares.total_usd)}: "
                     f"{format_usd(estimate.total_usd + spares.total_usd)} in all")
    say(runtime, f"estimate at {price_source}; Capacity Blocks are priced by their upfront fee")


def spare_nodes(text: str) -> int:
    """--spare-nodes: what the stack's spareNodes takes (cluster_spec.settings.MAX_SPARE_NODES), no more."""
    try:
        value = int(text)
    except ValueError:
        value = -1
    if not 0 <= value <= MAX_SPARE_NODES:
        raise argparse.ArgumentTypeError(f"{text}: allowed: an integer 0 to {MAX_SPARE_NODES} (the stack's "
                                         "spareNodes)")
    return value


def add_parsers(add: AddCommand) -> None:
    """`cost`."""
    cost_parser = add(
        "cost",
        "Estimated on-demand cost: for a plan (--instance-type, --nodes, --hours) or for a job so far (--job); at "
        "the instance catalog's us-east-1 price, or with --region at that region's from the AWS Price List.",
        example="clusterctl --region eu-north-1 cost --nodes 4 --hours 72",
    )
    cost_parser.add_argument("--instance-type", type=instance_type, default="p5.48xlarge",
                             help="a catalog instance type of the plan (default %(default)s)")
    cost_parser.add_argument("--nodes", type=positive_int,
                             help="nodes of the plan (no default: needed without --job)")
    cost_parser.add_argument("--hours", type=non_negative_hours,
                             help="hours of the plan, a number >= 0 (no default: needed without --job)")
    cost_parser.add_argument("--spare-nodes", type=spare_nodes, default=0, metavar="N",
                             help=f"hot spares beside the plan's nodes, 0 to {MAX_SPARE_NODES} as the stack's "
                             "spareNodes takes (a --job takes the stack's; default 0)")
    cost_parser.add_argument(
        "--job",
        metavar="JOB",
        help="a submitted job: its node-hours so far (from the job table: each attempt's nodes x its hours; for an "
        "older job: its nodes x the time since it started; default: none, a plan)",
    )
    cost_parser.set_defaults(handler=cost)
