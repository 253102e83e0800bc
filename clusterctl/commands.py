"""The commands: each reads its arguments, calls the AWS-facing modules and prints a table or JSON."""

from __future__ import annotations

import argparse
from dataclasses import dataclass
from typing import TYPE_CHECKING

from cluster_constructs.instance_types import get_instance_type
from clusterctl import capacity, jobs, stack
from clusterctl import logs as job_logs
from clusterctl import quota as quotas
from clusterctl.aws import EXIT_FAILED, EXIT_OK, EXIT_USAGE, ClusterctlError
from clusterctl.cost import CostEstimate, cost_so_far, estimate_cost
from clusterctl.nodes import list_nodes, select_job_nodes
from clusterctl.render import format_table, format_time, format_usd, to_json
from node_bootstrap import jobs as node_jobs

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


# --- nodes and jobs ------------------------------------------------------------------------------------


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


def submit(args: argparse.Namespace, runtime: Runtime) -> int:
    return _submit(args, runtime, node_jobs.TRAINING_MODULE, args.config, tuple(args.overrides),
                   args.resume_from)


def commcheck(args: argparse.Namespace, runtime: Runtime) -> int:
    """The all_reduce bandwidth check (training/commcheck.py) through submit's path: its options travel as
    key=value overrides, which the node turns back into options (--min-busbw-gbps 350)."""
    options = {
        "sizes_mib": args.sizes_mib,
        "iters": args.iters,
        "warmup_iters": args.warmup_iters,
        "dtype": args.dtype,
        "min_busbw_gbps": args.min_busbw_gbps,
    }
    overrides = tuple(f"{key}={value}" for key, value in options.items() if value is not None)
    return _submit(args, runtime, node_jobs.COMMCHECK_MODULE, "", overrides)


def _submit(
    args: argparse.Namespace,
    runtime: Runtime,
    module: str,
    config: str,
    overrides: tuple[str, ...],
    resume_from: str = "",
) -> int:
    """Readiness, the first N ready nodes by private IP, the rendezvous on the first, one SendCommand per
    50 nodes: the same for a training job and a commcheck."""
    assert runtime.context is not None
    outputs = _outputs(args, runtime)
    count = args.nodes or outputs.node_count
    request = jobs.JobRequest(
        config=config,
        nodes=count,
        gpus_per_node=get_instance_type(outputs.instance_type).gpu_count,
        max_restarts=args.max_restarts,
        overrides=overrides,
        module=module,
        resume_from=resume_from,
    )
    request.validate()  # before any node is looked at
    found = list_nodes(
        runtime.context.client("autoscaling"), runtime.context.client("ec2"), outputs.auto_scaling_group_name
    )
    try:
        selected = select_job_nodes(found, count)
    except ClusterctlError as e:
        hint = (
            " (capacity-block: nodes launch when the block starts)"
            if outputs.capacity_mode == ("capacity-block") and not found
            else ""
        )
        raise ClusterctlError(f"not submitted: {e}{hint}; see clusterctl nodes", e.exit_code) from None
    job_id = jobs.new_job_id(runtime.now())
    result = jobs.submit_job(
        runtime.context.client("ssm"),
        outputs.job_document_name,
        selected,
        request,
        job_id,
        runtime.sleep,
        runtime.clock,
    )
    if args.json:
        _print(
            runtime,
            to_json(
                {
                    "jobId": job_id,
                    "rendezvousHost": result.rendezvous_host,
                    "nodes": [n.instance_id for n in selected],
                    "failed": {i.instance_id: i.error for i in result.failed},
                }
            ),
        )
    elif module == node_jobs.COMMCHECK_MODULE:
        _print(runtime, job_id)
        _print(
            runtime,
            f"all_reduce check started on {len(selected)} x {outputs.instance_type} "
            f"({request.gpus_per_node} GPUs each), rendezvous {result.rendezvous_host}; follow it with: "
            f"clusterctl status {job_id} (busbw) and clusterctl logs {job_id} --follow (the table, NCCL's "
            "network)",
        )
    else:
        _print(runtime, job_id)
        _print(
            runtime,
            f"started on {len(selected)} x {outputs.instance_type} ({request.gpus_per_node} GPUs each), "
            f"rendezvous {result.rendezvous_host}; follow it with: clusterctl logs {job_id} --follow",
        )
    if result.failed:
        details = "; ".join(f"{i.instance_id}: {i.error}" for i in result.failed)
        raise ClusterctlError(
            f"job {job_id} did not start on {len(result.failed)} of {len(selected)} nodes "
            f"({details}); stop the rest with: clusterctl cancel {job_id}"
        )
    return EXIT_OK


@dataclass(frozen=True)
class JobNodes:
    """The nodes to ask about a job: its start command's, or (history expired) every in-service node."""

    outputs: stack.StackOutputs
    instance_ids: list[str]
    from_history: bool  # False: the job is not in SSM's command history, these are the in-service nodes


def _job_nodes(args: argparse.Namespace, runtime: Runtime) -> JobNodes:
    assert runtime.context is not None
    jobs.validate_job_id(args.job_id)
    outputs = _outputs(args, runtime)
    ssm = runtime.context.client("ssm")
    record = jobs.find_job(ssm, outputs.job_document_name, args.job_id)
    if record is not None:
        return JobNodes(outputs, record.instance_ids, from_history=True)
    # SSM keeps 30 days of command history: ask every in-service node instead.
    found = list_nodes(
        runtime.context.client("autoscaling"), runtime.context.client("ec2"), outputs.auto_scaling_group_name
    )
    in_service = [n.instance_id for n in found if n.lifecycle_state == "InService"]
    if not in_service:
        raise ClusterctlError(
            f"job {args.job_id}: not in SSM's command history, and no node in service to ask"
        )
    return JobNodes(outputs, in_service, from_history=False)


def _query(args: argparse.Namespace, runtime: Runtime, action: str) -> list[jobs.NodeJobState]:
    """Runs `action` on the job's nodes that still exist; a job no node has is an error of one line."""
    assert runtime.context is not None
    found = _job_nodes(args, runtime)
    states = jobs.query_job(
        runtime.context.client("ssm"),
        runtime.context.client("ec2"),
        found.outputs.job_document_name,
        args.job_id,
        found.instance_ids,
        action,
        getattr(args, "timeout_seconds", node_jobs.STOP_GRACE_SECONDS),
        runtime.sleep,
        runtime.clock,
    )
    if any(s.state not in ("not-found", jobs.GONE) for s in states):
        return states
    gone = sum(s.state == jobs.GONE for s in states)
    if gone == len(states):
        if action == "cancel":
            return states  # nothing is left to stop: the table says so
        raise ClusterctlError(
            f"job {args.job_id}: all {gone} of its nodes are gone (replaced), so no node can report its "
            f"state; its log stays in CloudWatch Logs: clusterctl logs {args.job_id}"
        )
    asked = len(states) - gone
    if found.from_history:
        replaced = f", {gone} gone (replaced)" if gone else ""
        raise ClusterctlError(f"job {args.job_id}: none of its nodes has it ({asked} asked{replaced})")
    raise ClusterctlError(
        f"job {args.job_id}: unknown: not in SSM's command history (kept 30 days), and none of the {asked} "
        "in-service nodes has it"
    )


def _print_states(args: argparse.Namespace, runtime: Runtime, states: list[jobs.NodeJobState]) -> None:
    overall = jobs.overall_state(states)
    reported = jobs.reported_busbw(states)
    if args.json:
        report: dict[str, object] = {"jobId": args.job_id, "state": overall, "nodes": states}
        if jobs.is_commcheck(states):
            report["busbwGbps"] = reported.busbw_gbps if reported else None
            report["busbwSizeBytes"] = reported.busbw_size_bytes if reported else None
        _print(runtime, to_json(report))
        return
    if jobs.is_commcheck(states):
        _print_commcheck_states(args, runtime, states, overall, reported)
        return
    rows = [
        (
            s.instance_id,
            s.state,
            s.exit_code,
            s.last_step,
            s.last_loss,
            s.network,
            s.started_at,
            s.ended_at,
            s.detail,
        )
        for s in states
    ]
    _print(
        runtime,
        format_table(
            ("INSTANCE", "STATE", "EXIT", "STEP", "LOSS", "NETWORK", "STARTED", "ENDED", "DETAIL"), rows
        ),
    )
    _print(runtime, f"job {args.job_id}: {overall} ({_count_nodes(states)})")


def _count_nodes(states: list[jobs.NodeJobState]) -> str:
    gone = sum(s.state == jobs.GONE for s in states)
    return f"{len(states)} nodes" + (f", {gone} gone (replaced)" if gone else "")


def _format_mib(size_bytes: int | None) -> str | None:
    return None if size_bytes is None else f"{size_bytes / 2**20:g} MiB"


def _print_commcheck_states(
    args: argparse.Namespace,
    runtime: Runtime,
    states: list[jobs.NodeJobState],
    overall: str,
    reported: jobs.NodeJobState | None,
) -> None:
    """A commcheck's nodes: busbw where rank 0 logged it, instead of step and loss."""
    rows = [
        (
            s.instance_id,
            s.state,
            s.exit_code,
            None if s.busbw_gbps is None else f"{s.busbw_gbps:.1f}",
            _format_mib(s.busbw_size_bytes),
            s.network,
            s.started_at,
            s.ended_at,
            s.detail,
        )
        for s in states
    ]
    _print(
        runtime,
        format_table(
            ("INSTANCE", "STATE", "EXIT", "BUSBW GB/S", "SIZE", "NETWORK", "STARTED", "ENDED", "DETAIL"), rows
        ),
    )
    if reported is not None:
        _print(
            runtime,
            f"job {args.job_id}: {overall} ({_count_nodes(states)}); all_reduce busbw "
            f"{reported.busbw_gbps:.1f} GB/s at {_format_mib(reported.busbw_size_bytes)}",
        )
    else:
        _print(runtime, f"job {args.job_id}: {overall} ({_count_nodes(states)}); no busbw logged yet")


def status(args: argparse.Namespace, runtime: Runtime) -> int:
    states = _query(args, runtime, "status")
    _print_states(args, runtime, states)
    on_tcp = jobs.nodes_on_tcp(states)
    if on_tcp:
        running = jobs.overall_state(states) == "running"
        print(
            f"clusterctl: warning: NCCL is using TCP sockets, not EFA, on {', '.join(on_tcp)}: this job "
            f"{'runs' if running else 'ran'} at a fraction of the bandwidth; check `sudo "
            "PYTHONPATH=/opt/cluster/bundle python3 -m node_bootstrap check` on those nodes"
            + (f" and cancel the job (clusterctl cancel {args.job_id})" if running else ""),
            file=runtime.err,
            flush=True,
        )
        return EXIT_FAILED
    # A state nobody could read (no answer) is not an answer a script may take for success.
    return EXIT_FAILED if jobs.overall_state(states) == "unknown" else EXIT_OK


def cancel(args: argparse.Namespace, runtime: Runtime) -> int:
    assert runtime.context is not None
    longest = node_jobs.MAX_CANCEL_TIMEOUT_SECONDS
    if not 0 <= args.timeout_seconds <= longest:
        raise ClusterctlError(
            f"--timeout-seconds={args.timeout_seconds}: allowed: 0-{longest} (the jobs document's "
            f"{node_jobs.COMMAND_TIMEOUT_SECONDS} s command timeout, less what cancel needs after SIGKILL)",
            EXIT_USAGE,
        )
    states = _query(args, runtime, "cancel")
    _print_states(args, runtime, states)
    return EXIT_FAILED if any(s.state in ("running", "unknown") for s in states) else EXIT_OK


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
