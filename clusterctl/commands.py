"""The commands: each reads its arguments, calls the AWS-facing modules and prints a table or JSON. The job
commands (submit, commcheck, jobs, status, cancel) are in clusterctl/job_commands.py (how they show a job:
clusterctl/job_view.py)."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from clusterctl import capacity, job_records, jobs, stack
from clusterctl import logs as job_logs
from clusterctl import quota as quotas
from clusterctl.aws import EXIT_FAILED, EXIT_OK, EXIT_USAGE, ClusterctlError
from clusterctl.cost import CostEstimate, cost_so_far, estimate_cost
from clusterctl.job_table import JobTable
from clusterctl.nodes import list_nodes
from clusterctl.render import format_table, format_time, format_usd, to_json

if TYPE_CHECKING:
    from clusterctl.cli import Runtime


def _print(runtime: Runtime, text: str) -> None:
    print(text, file=runtime.out, flush=True)


def _outputs(args: argparse.Namespace, runtime: Runtime) -> stack.StackOutputs:
    context = runtime.context
    assert context is not None
    return stack.read_stack_outputs(context.client("cloudformation"), args.stack, context.region)


# --- quota and capacity --------------------------------------------------------------------------------


def quota(args: argparse.Namespace, runtime: Runtime) -> int:
    context = runtime.context
    assert context is not None
    report = quotas.check_quota(
        context.client("ec2"), context.client("service-quotas"), args.instance_type, args.nodes
    )
    if args.json:
        _print(
            runtime,
            to_json(
                {
                    "instanceType": report.instance_type,
                    "nodes": report.nodes,
                    "quotaVcpus": report.quota_vcpus,
                    "usedVcpus": report.used_vcpus,
                    "requestedVcpus": report.requested_vcpus,
                    "neededVcpus": report.needed_vcpus,
                    "fits": report.fits,
                }
            ),
        )
    else:
        _print(runtime, "\n".join(report.summary()))
    return EXIT_OK if report.fits else EXIT_FAILED


def capacity_offerings(args: argparse.Namespace, runtime: Runtime) -> int:
    assert runtime.context is not None
    offerings = capacity.list_offerings(
        runtime.context.client("ec2"), args.instance_type, args.nodes, args.hours, args.start, args.end
    )
    if args.json:
        _print(runtime, to_json(offerings))
        return EXIT_OK
    if not offerings:
        _print(
            runtime,
            f"no Capacity Block offering for {args.nodes} x {args.instance_type} for {args.hours} h "
            "in this window: try other dates, fewer nodes or another region",
        )
        return EXIT_OK
    rows = [
        (
            o.offering_id,
            o.availability_zone,
            format_time(o.start),
            format_time(o.end),
            o.duration_hours,
            o.instance_count,
            f"{format_usd(o.upfront_fee)} {o.currency}",
            format_usd(o.price_per_instance_hour),
        )
        for o in offerings
    ]
    _print(
        runtime,
        format_table(
            ("OFFERING", "AZ", "START", "END", "HOURS", "INSTANCES", "UPFRONT FEE", "PER INSTANCE-HOUR"), rows
        ),
    )
    _print(runtime, "buy one with: clusterctl capacity purchase OFFERING")
    return EXIT_OK


def capacity_purchase(args: argparse.Namespace, runtime: Runtime) -> int:
    assert runtime.context is not None
    if not args.yes:
        answer = runtime.confirm(
            f"Buy Capacity Block offering {args.offering_id}? Its upfront fee is charged "
            "now and a purchase cannot be cancelled. Type 'yes' to buy: "
        )
        if answer.strip().lower() != "yes":
            _print(runtime, "not bought")
            return EXIT_FAILED
    reservation = capacity.purchase_block(runtime.context.client("ec2"), args.offering_id)
    settings = capacity.deploy_context(reservation, runtime.context.region or "")
    if args.json:
        _print(runtime, to_json({"reservation": reservation, "cdkContext": settings}))
        return EXIT_OK
    _print(
        runtime,
        f"bought {reservation.reservation_id}: {reservation.total_instances} x "
        f"{reservation.instance_type} in {reservation.availability_zone}, "
        f"{format_time(reservation.start)} to {format_time(reservation.end)} ({reservation.state})",
    )
    _print(runtime, "deploy the cluster on it with:")
    _print(runtime, f"  npx cdk deploy {args.stack} " + " ".join(settings))
    return EXIT_OK


def capacity_list(args: argparse.Namespace, runtime: Runtime) -> int:
    assert runtime.context is not None
    reservations = capacity.list_reservations(runtime.context.client("ec2"))
    if args.json:
        _print(runtime, to_json(reservations))
        return EXIT_OK
    rows = [
        (
            r.reservation_id,
            r.kind,
            r.instance_type,
            r.availability_zone,
            r.state,
            f"{r.available_instances}/{r.total_instances}",
            format_time(r.start),
            format_time(r.end) or "no end",
        )
        for r in reservations
    ]
    _print(
        runtime,
        format_table(("RESERVATION", "KIND", "TYPE", "AZ", "STATE", "AVAILABLE", "START", "END"), rows)
        if rows
        else "no capacity reservations or Capacity Blocks in this region",
    )
    return EXIT_OK


# --- nodes, logs and cost ------------------------------------------------------------------------------


def nodes(args: argparse.Namespace, runtime: Runtime) -> int:
    assert runtime.context is not None
    outputs = _outputs(args, runtime)
    found = list_nodes(
        runtime.context.client("autoscaling"), runtime.context.client("ec2"), outputs.auto_scaling_group_name
    )
    if args.json:
        _print(
            runtime,
            to_json([{**n.__dict__, "ready": n.ready, "notReadyReason": n.not_ready_reason} for n in found]),
        )
        return EXIT_OK
    rows = [
        (
            n.instance_id,
            n.private_ip,
            n.availability_zone,
            n.lifecycle_state,
            n.health_status,
            n.bootstrap or "-",
            "yes" if n.ready else f"no: {n.not_ready_reason}",
        )
        for n in found
    ]
    if rows:
        _print(
            runtime,
            format_table(("INSTANCE", "PRIVATE IP", "AZ", "LIFECYCLE", "HEALTH", "BOOTSTRAP", "READY"), rows),
        )
    ready = sum(n.ready for n in found)
    _print(
        runtime,
        f"{ready} of {outputs.node_count} nodes ready ({outputs.stack_name}: {outputs.node_count} x "
        f"{outputs.instance_type}, capacity {outputs.capacity_mode})",
    )
    return EXIT_OK


def logs(args: argparse.Namespace, runtime: Runtime) -> int:
    assert runtime.context is not None
    jobs.validate_job_id(args.job_id)
    outputs = _outputs(args, runtime)
    lines = job_logs.iter_job_log(
        runtime.context.client("logs"),
        outputs.log_group_name,
        args.job_id,
        args.node,
        args.follow,
        runtime.sleep,
    )
    try:
        for line in lines:
            _print(runtime, f"{format_time(line.timestamp)} [{line.instance_id}] {line.message}")
    except KeyboardInterrupt:
        if not args.follow:
            raise
    return EXIT_OK


def cost(args: argparse.Namespace, runtime: Runtime) -> int:
    if args.job:
        if args.nodes is not None or args.hours is not None:
            raise ClusterctlError(
                "--job takes the nodes and hours from the job: drop --nodes/--hours", EXIT_USAGE
            )
        assert runtime.context is not None
        jobs.validate_job_id(args.job)
        outputs = _outputs(args, runtime)
        recorded = _recorded_cost(runtime, outputs, args.job)
        if recorded is not None:
            estimate, label = recorded
            _print_cost(args, runtime, estimate, label)
            return EXIT_OK
        record = jobs.find_job(runtime.context.client("ssm"), outputs.job_document_name, args.job)
        if record is None:
            raise ClusterctlError(
                f"job {args.job}: not in SSM's command history (unknown id, or older than 30 days)"
            )
        estimate = cost_so_far(
            outputs.instance_type, len(record.instance_ids), record.requested_at, runtime.now()
        )
        label = f"job {args.job} so far ({format_time(record.requested_at)} to now)"
    else:
        if args.nodes is None or args.hours is None:
            raise ClusterctlError("cost needs --nodes and --hours (a plan) or --job JOB", EXIT_USAGE)
        estimate = estimate_cost(args.instance_type, args.nodes, args.hours)
        label = "plan"
    _print_cost(args, runtime, estimate, label)
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


def _print_cost(args: argparse.Namespace, runtime: Runtime, estimate: CostEstimate, label: str) -> None:
    if args.json:
        _print(
            runtime,
            to_json(
                {
                    "label": label,
                    "instanceType": estimate.instance_type,
                    "nodes": estimate.nodes,
                    "hours": round(estimate.hours, 4),
                    "usdPerInstanceHour": estimate.usd_per_instance_hour,
                    "usdPerHour": round(estimate.usd_per_hour, 2),
                    "totalUsd": round(estimate.total_usd, 2),
                    "gpuHours": round(estimate.gpu_hours, 2),
                }
            ),
        )
        return
    _print(
        runtime,
        f"{label}: {estimate.nodes} x {estimate.instance_type} for {estimate.hours:.2f} h = "
        f"{format_usd(estimate.total_usd)} ({format_usd(estimate.usd_per_hour)}/h, "
        f"{estimate.gpu_hours:,.0f} GPU-hours)",
    )
    _print(
        runtime,
        f"estimate at the catalog's on-demand price, {format_usd(estimate.usd_per_instance_hour)} per "
        "instance-hour (us-east-1 Linux); Capacity Blocks are priced by their upfront fee",
    )
