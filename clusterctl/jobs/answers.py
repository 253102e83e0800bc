"""Asking a job's nodes (status or cancel through the jobs document), copying their answers into the job's
record, and printing them. Jobs the job table does not hold (older than it, or a stack deployed before it) are
found through the start command in SSM's command history (30 days)."""

from __future__ import annotations

import argparse
from collections.abc import Sequence
from dataclasses import dataclass

from cluster_aws import stack_outputs as stack
from cluster_aws.errors import ClusterctlError
from cluster_aws.nodes import list_nodes
from cluster_jobs import records as job_records
from cluster_jobs.document import find_job, query_job
from cluster_jobs.node_states import GONE, NodeJobState
from cluster_jobs.table import JobRecord, JobTable, StaleRecord
from clusterctl.jobs import view as job_view
from clusterctl.render import to_json
from clusterctl.runtime import Runtime, say
from node_bootstrap import jobs as node_jobs


def print_states(args: argparse.Namespace, runtime: Runtime, states: list[NodeJobState], label: str) -> None:
    if args.json:
        say(runtime, to_json(job_view.states_json(args.job_id, states)))
    else:
        say(runtime, job_view.format_states(states, label))


@dataclass(frozen=True)
class JobNodes:
    """The nodes to ask about a job: its start command's, or (history expired) every in-service node."""

    instance_ids: list[str]
    from_history: bool  # False: the job is not in SSM's command history, these are the in-service nodes


def job_nodes_from_history(args: argparse.Namespace, runtime: Runtime, outputs: stack.StackOutputs) -> JobNodes:
    assert runtime.context is not None
    found = find_job(runtime.context.client("ssm"), outputs.job_document_name, args.job_id)
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


def query_from_history(
    args: argparse.Namespace, runtime: Runtime, outputs: stack.StackOutputs, action: str
) -> list[NodeJobState]:
    """Runs `action` on the job's nodes that still exist; a job no node has is an error of one line."""
    found = job_nodes_from_history(args, runtime, outputs)
    states = ask(runtime, outputs, args.job_id, found.instance_ids, action,
                  getattr(args, "timeout_seconds", node_jobs.STOP_GRACE_SECONDS))
    if any(s.state not in ("not-found", GONE) for s in states):
        return states
    gone = sum(s.state == GONE for s in states)
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


def ask(
    runtime: Runtime,
    outputs: stack.StackOutputs,
    job_id: str,
    instance_ids: Sequence[str],
    action: str,
    cancel_timeout_seconds: int = node_jobs.STOP_GRACE_SECONDS,
) -> list[NodeJobState]:
    """Runs `status` or `cancel` on the nodes that still exist (the others are reported gone); the answers in
    the order of `instance_ids` (an attempt's: by private IP, the rendezvous host first)."""
    assert runtime.context is not None
    states = query_job(
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


def copy_answers(
    runtime: Runtime, table: JobTable, record: JobRecord, states: list[NodeJobState]
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
