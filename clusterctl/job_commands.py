"""The job commands: submit (and commcheck, the same path), jobs, status and cancel.

A job lives in two places: its record in the stack's job table (clusterctl.job_table; the record is the
job's truth and the one-job lock) and its processes on the nodes of its current attempt, reached through the
stack's jobs document (clusterctl.jobs). Submit writes the record before any node is touched; cancel marks it
before any node is stopped, so the job keeper, which reads the same record, never restarts a cancelled job;
status shows the record's attempts above the nodes' own answers and copies those answers into the record.
Jobs of a stack deployed before the job table (and jobs older than it) are found in SSM's command history.
"""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass
from typing import TYPE_CHECKING, NoReturn

from cluster_constructs.instance_types import get_instance_type
from clusterctl import job_records, job_view, jobs, stack
from clusterctl.aws import EXIT_FAILED, EXIT_OK, EXIT_STACK, EXIT_USAGE, ClusterctlError, one_line
from clusterctl.job_table import ACTIVE_STATES, JobAlreadyActive, JobRecord, JobTable, StaleRecord
from clusterctl.nodes import Node, list_nodes, select_job_nodes
from clusterctl.render import format_table, format_usd, to_json
from node_bootstrap import jobs as node_jobs

if TYPE_CHECKING:
    from clusterctl.cli import Runtime


def _print(runtime: Runtime, text: str) -> None:
    print(text, file=runtime.out, flush=True)


def _note(runtime: Runtime, text: str) -> None:
    print(f"clusterctl: note: {text}", file=runtime.err, flush=True)


def _outputs(args: argparse.Namespace, runtime: Runtime) -> stack.StackOutputs:
    assert runtime.context is not None
    return stack.read_stack_outputs(runtime.context.client("cloudformation"), args.stack, runtime.context.region)


def _job_table(outputs: stack.StackOutputs, runtime: Runtime) -> JobTable | None:
    """The stack's job table, or None for a stack deployed before it."""
    assert runtime.context is not None
    if outputs.job_table_name is None:
        return None
    return JobTable(runtime.context.client("dynamodb"), outputs.job_table_name)


def _require_job_table(outputs: stack.StackOutputs, runtime: Runtime, refused: str) -> JobTable:
    table = _job_table(outputs, runtime)
    if table is None:
        raise ClusterctlError(
            f"{refused}: stack {outputs.stack_name} predates the job table (no output {stack.JOB_TABLE_OUTPUT}): "
            "redeploy it with this version (cdk deploy), then every job is recorded, one runs at a time, and "
            "a job that loses a node is restarted",
            EXIT_STACK,
        )
    return table


# --- submit ----------------------------------------------------------------------------------------------


def submit(args: argparse.Namespace, runtime: Runtime) -> int:
    return _submit(args, runtime, node_jobs.TRAINING_MODULE, args.config, tuple(args.overrides), args.resume_from)


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
    """Checks, the lock, the first N ready nodes by private IP, the record, then one SendCommand per 50 nodes
    with the rendezvous on the first: the same for a training job and a commcheck."""
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
    table = _require_job_table(outputs, runtime, "not submitted")
    config_text = job_records.read_config_text(request.config)
    _refuse_while_active(table)  # before the nodes: a restarting job's nodes are not ready, and that is why
    selected = _select_nodes(outputs, runtime, count)

    now = runtime.now()
    job_id = jobs.new_job_id(now)
    checkpoint_dir = ""
    if module == node_jobs.TRAINING_MODULE and outputs.checkpoint_root:
        checkpoint_dir = job_records.job_checkpoint_dir(outputs.checkpoint_root, job_id)
    assert outputs.max_job_restarts is not None  # read with the table's name
    record = job_records.new_record(
        request,
        job_id,
        instance_type=outputs.instance_type,
        max_job_restarts=outputs.max_job_restarts,
        checkpoint_dir=checkpoint_dir,
        config_text=config_text,
        attempt=job_records.new_attempt(1, selected, now),
        now=now,
    )
    _create(table, record)  # the record and the lock, before any node is touched
    if request.config.startswith("/"):
        _note(runtime, f"{request.config} is a path on the nodes: job {job_id}'s record keeps the path, not the "
                       "content")

    try:
        result = jobs.submit_job(
            runtime.context.client("ssm"),
            outputs.job_document_name,
            selected,
            request,
            job_id,
            runtime.sleep,
            runtime.clock,
        )
    except Exception as error:
        reason = f"attempt 1 did not start: {one_line(str(error), 200)}"
        _record_failed_start(runtime, table, job_id, reason)
        raise
    if args.json:
        _print(
            runtime,
            to_json(
                {
                    "jobId": job_id,
                    "rendezvousHost": result.rendezvous_host,
                    "nodes": [n.instance_id for n in selected],
                    "failed": {i.instance_id: i.error for i in result.failed},
                    "jobTable": table.table_name,
                    "checkpointDir": checkpoint_dir or None,
                }
            ),
        )
    else:
        _print(runtime, job_id)  # the first line, also when the start failed: what the record is under
    if result.failed:
        _failed_start(runtime, outputs, table, result)

    answers = [jobs.NodeJobState.from_invocation(i) for i in result.invocations.values()]
    try:
        job_records.update_record(table, job_id, lambda r: job_records.started(r, 1, answers), runtime.now())
    except Exception as e:  # noqa: BLE001 - the job runs, and the keeper moves its record on from `starting` too
        _note(runtime, f"job {job_id} started, but its record still says starting: {one_line(str(e), 200)}")
    if args.json:
        return EXIT_OK
    if module == node_jobs.COMMCHECK_MODULE:
        _print(
            runtime,
            f"all_reduce check started on {len(selected)} x {outputs.instance_type} "
            f"({request.gpus_per_node} GPUs each), rendezvous {result.rendezvous_host}; follow it with: "
            f"clusterctl status {job_id} (busbw) and clusterctl logs {job_id} --follow (the table, NCCL's "
            "network)",
        )
    else:
        _print(
            runtime,
            f"started on {len(selected)} x {outputs.instance_type} ({request.gpus_per_node} GPUs each), "
            f"rendezvous {result.rendezvous_host}; follow it with: clusterctl logs {job_id} --follow",
        )
    return EXIT_OK


def _refuse_while_active(table: JobTable) -> None:
    holder = table.active()
    if holder is not None and holder.state in ACTIVE_STATES:
        raise JobAlreadyActive(holder.job_id, holder.state)


def _select_nodes(outputs: stack.StackOutputs, runtime: Runtime, count: int) -> list[Node]:
    assert runtime.context is not None
    found = list_nodes(
        runtime.context.client("autoscaling"), runtime.context.client("ec2"), outputs.auto_scaling_group_name
    )
    try:
        return select_job_nodes(found, count)
    except ClusterctlError as e:
        hint = (
            " (capacity-block: nodes launch when the block starts)"
            if outputs.capacity_mode == "capacity-block" and not found
            else ""
        )
        raise ClusterctlError(f"not submitted: {e}{hint}; see clusterctl nodes", e.exit_code) from None


def _create(table: JobTable, record: JobRecord) -> None:
    """Writes the record and takes the lock. A lock that outlived its job (its record is in a final state, or
    was deleted by hand) is given back once; a job that is active is never displaced (JobAlreadyActive)."""
    try:
        table.create(record)
    except JobAlreadyActive as refused:
        if refused.active_state in ACTIVE_STATES:
            raise
        table.release_lock(refused.active_job_id)
        table.create(record)


def _record_failed_start(runtime: Runtime, table: JobTable, job_id: str, reason: str) -> None:
    """Records the first attempt as failed (which gives the lock back); a failure to do so is a note, so
    the error that caused it is the one reported."""
    try:
        job_records.update_record(table, job_id, lambda r: job_records.failed(r, 1, reason, runtime.now()),
                                  runtime.now())
    except Exception as e:  # noqa: BLE001 - the start's own error follows
        _note(runtime, f"job {job_id} could not be recorded as failed ({one_line(str(e), 200)}); its record "
                       f"holds the cluster's lock: clusterctl cancel {job_id} gives it back")


def _failed_start(
    runtime: Runtime,
    outputs: stack.StackOutputs,
    table: JobTable,
    result: jobs.SubmitResult,
) -> NoReturn:
    """Some nodes did not start the job: the job failed. It is recorded so (the lock goes back; the keeper
    leaves a failed job alone), then stopped on the nodes where it did start, which would otherwise wait at
    the rendezvous for peers that never come."""
    assert runtime.context is not None
    errors = {i.instance_id: i.error for i in result.failed}
    reason = job_records.start_failure_reason(1, errors, len(result.nodes))
    _record_failed_start(runtime, table, result.job_id, reason)
    started_on = [n.instance_id for n in result.nodes if n.instance_id not in errors]
    still = []
    if started_on:
        states = jobs.query_job(
            runtime.context.client("ssm"),
            runtime.context.client("ec2"),
            outputs.job_document_name,
            result.job_id,
            started_on,
            "cancel",
            node_jobs.STOP_GRACE_SECONDS,
            runtime.sleep,
            runtime.clock,
        )
        still = [s.instance_id for s in states if s.state in ("running", "unknown")]
    stopped = f"; stopped where it started ({', '.join(started_on)})" if started_on else ""
    if still:
        stopped = (f"; stopping it where it started did not succeed on {', '.join(still)}: see clusterctl "
                   f"status {result.job_id}")
    raise ClusterctlError(f"job {result.job_id}: {reason}; recorded as failed{stopped}")


# --- jobs ------------------------------------------------------------------------------------------------


def jobs_list(args: argparse.Namespace, runtime: Runtime) -> int:
    outputs = _outputs(args, runtime)
    table = _require_job_table(outputs, runtime, "no jobs to list")
    now = runtime.now()
    every = list(table.jobs())
    records = every[: args.limit]
    holder = table.active()
    active = holder if holder is not None and holder.state in ACTIVE_STATES else None
    if args.json:
        _print(runtime, to_json({
            "jobTable": table.table_name,
            "activeJobId": active.job_id if active else None,
            "jobs": [job_view.record_json(r, now) for r in records],
        }))
        return EXIT_OK
    if not records:
        _print(runtime, f"no jobs in the job table {table.table_name} yet")
        return EXIT_OK
    rows = []
    for r in records:
        cost = job_records.cost_so_far_usd(r, now)
        rows.append((r.job_id, r.state, r.attempt, r.nodes, r.created_at, r.last_step,
                     None if cost is None else format_usd(cost)))
    _print(runtime, format_table(("JOB", "STATE", "ATTEMPT", "NODES", "STARTED", "STEP", "COST SO FAR"), rows))
    if len(every) > len(records):
        _print(runtime, f"the newest {len(records)} of {len(every)} jobs: --limit {len(every)} shows them all")
    if active is not None:
        _print(runtime, f"active: {active.job_id} ({active.state}); a cluster runs one job at a time")
    else:
        _print(runtime, "no active job: the cluster takes the next submit")
    return EXIT_OK


# --- status and cancel -----------------------------------------------------------------------------------


def status(args: argparse.Namespace, runtime: Runtime) -> int:
    jobs.validate_job_id(args.job_id)
    outputs = _outputs(args, runtime)
    table = _job_table(outputs, runtime)
    record = table.get(args.job_id) if table else None
    if table is None or record is None:
        states = _query_from_history(args, runtime, outputs, "status")
        _print_states(args, runtime, states, f"job {args.job_id}")
        return _status_exit(args, runtime, states)

    current = record.current
    states = _ask(runtime, outputs, args.job_id, current.nodes, "status") if current else []
    record = _copy_answers(runtime, table, record, states)
    if args.json:
        report = job_view.states_json(args.job_id, states)
        report.update(state=record.state, nodesState=report["state"],
                      record=job_view.record_json(record, runtime.now()))
        _print(runtime, to_json(report))
    else:
        _print(runtime, job_view.format_record(record))
        if current is not None:
            _print(runtime, "")
            _print_states(args, runtime, states, f"attempt {current.number}'s nodes")
    return _status_exit(args, runtime, states)


def _copy_answers(
    runtime: Runtime, table: JobTable, record: JobRecord, states: list[jobs.NodeJobState]
) -> JobRecord:
    """The nodes' answers into the record's current attempt, unless someone wrote the record since it was
    read (the keeper: its record stands, and the next status copies again). Returns the record as it is."""
    copied = job_records.with_node_answers(record, states)
    if copied is None:
        return record
    try:
        return table.save(copied, runtime.now())
    except StaleRecord:
        return record


def _status_exit(args: argparse.Namespace, runtime: Runtime, states: list[jobs.NodeJobState]) -> int:
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
    return EXIT_FAILED if states and jobs.overall_state(states) == "unknown" else EXIT_OK


def cancel(args: argparse.Namespace, runtime: Runtime) -> int:
    longest = node_jobs.MAX_CANCEL_TIMEOUT_SECONDS
    if not 0 <= args.timeout_seconds <= longest:
        raise ClusterctlError(
            f"--timeout-seconds={args.timeout_seconds}: allowed: 0-{longest} (the jobs document's "
            f"{node_jobs.COMMAND_TIMEOUT_SECONDS} s command timeout, less what cancel needs after SIGKILL)",
            EXIT_USAGE,
        )
    jobs.validate_job_id(args.job_id)
    outputs = _outputs(args, runtime)
    table = _job_table(outputs, runtime)
    if table is None or table.get(args.job_id) is None:
        states = _query_from_history(args, runtime, outputs, "cancel")
        _print_states(args, runtime, states, f"job {args.job_id}")
        return _cancel_exit(states)

    # The record first: once it says cancelled, the keeper leaves the job alone, whatever the nodes do next.
    now = runtime.now()
    update = job_records.update_record(table, args.job_id, lambda r: job_records.cancelled(r, now), now)
    record = update.record
    if not update.written:
        why = f": {record.reason}" if record.reason else ""
        if args.json:
            _print(runtime, to_json({"jobId": args.job_id, "state": record.state, "sent": False,
                                     "record": job_view.record_json(record, now)}))
        else:
            _print(runtime, f"job {args.job_id} already ended ({record.state}{why}); nothing sent")
        return EXIT_OK
    current = record.current
    nodes = current.nodes if current else []
    states = _ask(runtime, outputs, args.job_id, nodes, "cancel", args.timeout_seconds) if nodes else []
    record = _copy_answers(runtime, table, record, states)  # their exit codes and last steps
    if args.json:
        report = job_view.states_json(args.job_id, states)
        report.update(state=record.state, nodesState=report["state"], sent=bool(nodes),
                      record=job_view.record_json(record, now))
        _print(runtime, to_json(report))
    else:
        number = current.number if current else 0
        _print(runtime, f"job {args.job_id}: recorded as cancelled (it will not be restarted); stopping attempt "
                        f"{number} on its {len(nodes)} nodes")
        if states:
            _print_states(args, runtime, states, f"attempt {number}'s nodes")
    return _cancel_exit(states)


def _print_states(args: argparse.Namespace, runtime: Runtime, states: list[jobs.NodeJobState], label: str) -> None:
    if args.json:
        _print(runtime, to_json(job_view.states_json(args.job_id, states)))
    else:
        _print(runtime, job_view.format_states(states, label))


def _cancel_exit(states: list[jobs.NodeJobState]) -> int:
    return EXIT_FAILED if any(s.state in ("running", "unknown") for s in states) else EXIT_OK


def _ask(
    runtime: Runtime,
    outputs: stack.StackOutputs,
    job_id: str,
    instance_ids: Sequence[str],
    action: str,
    cancel_timeout_seconds: int = node_jobs.STOP_GRACE_SECONDS,
) -> list[jobs.NodeJobState]:
    """Runs `status` or `cancel` on the nodes that still exist (the others are reported gone); the answers in
    the order of `instance_ids` (an attempt's: by private IP, the rendezvous host first)."""
    assert runtime.context is not None
    states = jobs.query_job(
        runtime.context.client("ssm"),
        runtime.context.client("ec2"),
        outputs.job_document_name,
        job_id,
        instance_ids,
        action,
        cancel_timeout_seconds,
        runtime.sleep,
        runtime.clock,
    )
    order = {instance_id: i for i, instance_id in enumerate(instance_ids)}
    return sorted(states, key=lambda s: order.get(s.instance_id, len(order)))


# --- jobs not in the job table: SSM's command history ----------------------------------------------------


@dataclass(frozen=True)
class JobNodes:
    """The nodes to ask about a job: its start command's, or (history expired) every in-service node."""

    instance_ids: list[str]
    from_history: bool  # False: the job is not in SSM's command history, these are the in-service nodes


def _job_nodes_from_history(args: argparse.Namespace, runtime: Runtime, outputs: stack.StackOutputs) -> JobNodes:
    assert runtime.context is not None
    found = jobs.find_job(runtime.context.client("ssm"), outputs.job_document_name, args.job_id)
    if found is not None:
        return JobNodes(found.instance_ids, from_history=True)
    # SSM keeps 30 days of command history: ask every in-service node instead.
    members = list_nodes(
        runtime.context.client("autoscaling"), runtime.context.client("ec2"), outputs.auto_scaling_group_name
    )
    in_service = [n.instance_id for n in members if n.lifecycle_state == "InService"]
    if not in_service:
        raise ClusterctlError(
            f"job {args.job_id}: not in SSM's command history, and no node in service to ask"
        )
    return JobNodes(in_service, from_history=False)


def _query_from_history(
    args: argparse.Namespace, runtime: Runtime, outputs: stack.StackOutputs, action: str
) -> list[jobs.NodeJobState]:
    """Runs `action` on the job's nodes that still exist; a job no node has is an error of one line."""
    found = _job_nodes_from_history(args, runtime, outputs)
    states = _ask(runtime, outputs, args.job_id, found.instance_ids, action,
                  getattr(args, "timeout_seconds", node_jobs.STOP_GRACE_SECONDS))
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
