"""`clusterctl submit` and `clusterctl commcheck` (the same path): checks, the one-job lock, the first N ready
nodes by private IP, the job's record, then the start through the stack's jobs document.

A job lives in two places: its record in the stack's job table (cluster_jobs.table; the record is the job's
truth and the one-job lock) and its processes on the nodes of its current attempt, reached through the jobs
document (cluster_jobs.document). Submit writes the record before any node is touched, so the job keeper,
which reads the same record, always knows what runs; a start that fails on a node is recorded failed and
stopped where it started."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, NoReturn

from cluster_aws import stack_outputs as stack
from cluster_aws.errors import EXIT_OK, ClusterctlError, one_line
from cluster_aws.nodes import Node, list_nodes, select_job_nodes
from cluster_jobs import records as job_records
from cluster_jobs.document import SubmitResult, query_job, submit_job
from cluster_jobs.node_states import NodeJobState
from cluster_jobs.request import JobRequest, bundle_config, new_job_id
from cluster_jobs.table import ACTIVE_STATES, JobAlreadyActive, JobRecord, JobTable
from clusterctl.jobs import dry_run
from clusterctl.render import to_json
from clusterctl.runtime import note, require_job_table, say, stack_outputs, warn
from instance_catalog.instance_types import get_instance_type
from node_bootstrap import jobs as node_jobs

if TYPE_CHECKING:
    from clusterctl.runtime import Runtime


def submit(args: argparse.Namespace, runtime: Runtime) -> int:
    request = checked_request(args, node_jobs.TRAINING_MODULE, bundle_config(args.config), tuple(args.overrides),
                              args.resume_from)
    if args.dry_run:
        return dry_run.show(args, runtime, request)
    return _submit(args, runtime, request)


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
    return _submit(args, runtime, checked_request(args, node_jobs.COMMCHECK_MODULE, "", overrides))


def checked_request(
    args: argparse.Namespace, module: str, config: str, overrides: tuple[str, ...], resume_from: str = ""
) -> JobRequest:
    """The request, checked offline before any AWS call (the config and the --set items by the trainer's own
    loader): a bad key is refused in one line also without credentials. Its nodes (unless --nodes) and GPUs per
    node come from the stack's outputs later; 0 until then (`validate` does not read them)."""
    request = JobRequest(
        config=config,
        nodes=args.nodes or 0,
        gpus_per_node=0,
        max_restarts=args.max_restarts,
        overrides=overrides,
        module=module,
        resume_from=resume_from,
    )
    request.validate()
    return request


def _say_spares(runtime: Runtime, outputs: stack.StackOutputs, count: int) -> None:
    """What the job leaves to the keeper: idle nodes are its hot spares (docs/operations.md, "Hot spares")."""
    idle = outputs.group_size - count
    if count > outputs.node_count and outputs.spare_nodes:
        taken = min(count - outputs.node_count, outputs.spare_nodes)
        note(runtime, f"this job runs on {taken} of the {outputs.spare_nodes} spare nodes (--nodes {count} > "
                      f"NodeCount {outputs.node_count}): {idle} left for a restart without waiting for a "
                      "replacement to boot")
    elif idle > 0 and outputs.spare_nodes:
        nodes = f"{idle} nodes stay idle as hot spares" if idle > 1 else "1 node stays idle as a hot spare"
        note(runtime, f"{nodes}: if the job loses a node, the job keeper restarts it on a spare in its next round")


def _submit(args: argparse.Namespace, runtime: Runtime, request: JobRequest, *, job_id: str = "",
            started: str = "", extra_json: dict[str, object] | None = None) -> int:
    """The stack's checks, the lock, the first N ready nodes by private IP, the record, then one SendCommand per
    50 nodes with the rendezvous on the first: the same for a training job, a commcheck and an export
    (export.py). `request` was checked offline (checked_request). `job_id`: the job's id (default: a new one
    from the time); `started`: the line said once the job started (default: how to follow it); `extra_json`:
    more fields for --json."""
    assert runtime.context is not None
    module = request.module
    outputs = stack_outputs(args, runtime)
    count = args.nodes or outputs.node_count
    request = dataclasses.replace(
        request, nodes=count, gpus_per_node=get_instance_type(outputs.instance_type).gpu_count
    )
    request.check_layout()  # [parallel]'s degrees on these nodes' GPUs, before anything is sent
    fp8_backend = request.require_fp8_backend(outputs.fp8_backends, outputs.stack_name)  # the nodes have it
    table = require_job_table(outputs, runtime, "not submitted")
    config_text = job_records.read_config_text(request.config)
    _refuse_while_active(table)  # before the nodes: a restarting job's nodes are not ready, and that is why
    selected = _select_nodes(outputs, runtime, count)
    _say_spares(runtime, outputs, count)
    for warning in request.run_length_warnings():  # the trainer's start-up warnings, said before the job is sent
        warn(runtime, warning)

    now = runtime.now()
    job_id = job_id or new_job_id(now)
    checkpoint_dir = ""
    if module in (node_jobs.TRAINING_MODULE, node_jobs.EXPORT_MODULE) and outputs.checkpoint_root:
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
        fp8_backend=fp8_backend,
    )
    _create(table, record)  # the record and the lock, before any node is touched
    if request.config.startswith("/"):
        note(runtime, f"{request.config} is a path on the nodes: job {job_id}'s record keeps the path, not the "
                       "content")

    try:
        result = submit_job(
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
        say(
            runtime,
            to_json(
                {
                    "jobId": job_id,
                    "rendezvousHost": result.rendezvous_host,
                    "nodes": [n.instance_id for n in selected],
                    "failed": {i.instance_id: i.error for i in result.failed},
                    "jobTable": table.table_name,
                    "checkpointDir": checkpoint_dir or None,
                    **(extra_json or {}),
                }
            ),
        )
    else:
        say(runtime, job_id)  # the first line, also when the start failed: what the record is under
    if result.failed:
        _failed_start(runtime, outputs, table, result)

    answers = [NodeJobState.from_invocation(i) for i in result.invocations.values()]
    try:
        job_records.update_record(table, job_id, lambda r: job_records.started(r, 1, answers), runtime.now())
    except Exception as e:  # noqa: BLE001 - the job runs, and the keeper moves its record on from `starting` too
        note(runtime, f"job {job_id} started, but its record still says starting: {one_line(str(e), 200)}")
    if args.json:
        return EXIT_OK
    if started:
        say(runtime, started)
    elif module == node_jobs.COMMCHECK_MODULE:
        say(
            runtime,
            f"all_reduce check started on {len(selected)} x {outputs.instance_type} "
            f"({request.gpus_per_node} GPUs each), rendezvous {result.rendezvous_host}; follow it with: "
            f"clusterctl status {job_id} (busbw) and clusterctl logs {job_id} --follow (the table, NCCL's "
            "network)",
        )
    else:
        say(
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
        note(runtime, f"job {job_id} could not be recorded as failed ({one_line(str(e), 200)}); its record "
                       f"holds the cluster's lock: clusterctl cancel {job_id} gives it back")


def _failed_start(
    runtime: Runtime,
    outputs: stack.StackOutputs,
    table: JobTable,
    result: SubmitResult,
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
        states = query_job(
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
