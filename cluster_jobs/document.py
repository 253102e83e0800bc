"""Jobs through the stack's SSM jobs document: start, find, status, cancel (docs/architecture.md section 5).

One `ssm:SendCommand` runs node_bootstrap.jobs on every node of a job; the nodes answer with one JSON
object on stdout, which the caller (clusterctl or the job keeper) reads back with `ssm:GetCommandInvocation`.
A job's nodes are found again from its start command (`ssm:ListCommands`; SSM keeps command history for 30
days).
"""

from __future__ import annotations

import datetime
import time
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cluster_aws.nodes import Node, split_addressable
from cluster_jobs.job_parameters import JobParameters, job_time
from cluster_jobs.node_states import NodeJobState
from cluster_jobs.ssm_commands import Clock, Invocation, Sleep, run_on_nodes
from node_bootstrap import job_contract

START_TIMEOUT_SECONDS = 180.0  # the node waits up to 30 s for its supervisor; SSM delivery adds latency
# How long an abort (abort_job) gives each node to record the end before it SIGKILLs what is left itself.
ABORT_STOP_SECONDS = job_contract.ABORT_STOP_SECONDS


STATUS_TIMEOUT_SECONDS = 120.0


@dataclass(frozen=True)
class SubmitResult:
    job_id: str
    rendezvous_host: str
    nodes: list[Node]
    invocations: dict[str, Invocation]

    @property
    def failed(self) -> list[Invocation]:
        return [i for i in self.invocations.values() if i.status != "Success"]


def submit_job(
    ssm: Any,
    document_name: str,
    nodes: Sequence[Node],
    request: JobParameters,
    job_id: str,
    sleep: Sleep = time.sleep,
    clock: Clock = time.monotonic,
) -> SubmitResult:
    """Starts the job on `nodes` (ready, ordered by private IP): the first hosts the c10d rendezvous."""
    request.validate()
    if len(nodes) != request.nodes:
        raise ValueError(f"{len(nodes)} nodes selected for a {request.nodes}-node job")
    rendezvous_host = str(nodes[0].private_ip)
    invocations = run_on_nodes(
        ssm,
        document_name,
        [n.instance_id for n in nodes],
        request.parameters(job_id, rendezvous_host),
        f"clusterctl start {job_id}",
        START_TIMEOUT_SECONDS,
        sleep,
        clock,
    )
    return SubmitResult(
        job_id=job_id, rendezvous_host=rendezvous_host, nodes=list(nodes), invocations=invocations
    )


@dataclass(frozen=True)
class StartCommand:
    """What the start command says about a job."""

    job_id: str
    instance_ids: list[str]
    requested_at: datetime.datetime
    parameters: dict[str, list[str]]


def find_job(ssm: Any, document_name: str, job_id: str) -> StartCommand | None:
    """The job's start command(s) in SSM's command history, or None (unknown id, or older than 30 days)."""
    filters = [{"key": "DocumentName", "value": document_name}]
    submitted = job_time(job_id)
    if submitted is not None:  # the id carries the submit time: skip older history
        after = submitted - datetime.timedelta(hours=1)
        filters.append({"key": "InvokedAfter", "value": after.strftime("%Y-%m-%dT%H:%M:%SZ")})
    instance_ids: list[str] = []
    requested: list[datetime.datetime] = []
    parameters: dict[str, list[str]] = {}
    for page in ssm.get_paginator("list_commands").paginate(Filters=filters):
        for command in page.get("Commands", []):
            params = command.get("Parameters", {})
            if (
                params.get("jobId") == [job_id]
                and params.get("action") == ["start"]
                and (command.get("DocumentName") == document_name)
            ):
                instance_ids += command.get("InstanceIds", [])
                requested.append(command["RequestedDateTime"])
                parameters = params
    if not instance_ids:
        return None
    return StartCommand(
        job_id=job_id,
        instance_ids=sorted(set(instance_ids)),
        requested_at=min(requested),
        parameters=parameters,
    )


def query_job(
    ssm: Any,
    ec2: Any,
    document_name: str,
    job_id: str,
    instance_ids: Sequence[str],
    action: str = "status",
    cancel_timeout_seconds: int = job_contract.STOP_GRACE_SECONDS,
    sleep: Sleep = time.sleep,
    clock: Clock = time.monotonic,
    cancel_mode: str = job_contract.CANCEL_SAVE,
) -> list[NodeJobState]:
    """Runs `status` or `cancel` on the job's nodes that still exist and returns each node's state, ordered
    by instance id; the nodes the Auto Scaling group replaced are reported gone, not asked (SSM refuses a
    command to a terminated instance). cancel_mode abort: no checkpoint, torchrun and its workers killed at
    once (job_contract.CANCEL_MODES); the document's default, save, is not sent."""
    addressable, gone = split_addressable(ec2, instance_ids)
    parameters = {"action": [action], "jobId": [job_id]}
    timeout_seconds = STATUS_TIMEOUT_SECONDS
    if action == "cancel":
        parameters["cancelTimeoutSeconds"] = [str(cancel_timeout_seconds)]
        if cancel_mode != job_contract.CANCEL_SAVE:
            parameters["cancelMode"] = [cancel_mode]
        timeout_seconds += cancel_timeout_seconds + 60  # SIGTERM grace, then the kill and the unit stop
    invocations = (
        run_on_nodes(
            ssm,
            document_name,
            addressable,
            parameters,
            f"clusterctl {action} {job_id}",
            timeout_seconds,
            sleep,
            clock,
        )
        if addressable
        else {}
    )
    refused = [i for i, invocation in invocations.items() if invocation.status == "InvalidInstanceId"]
    if refused:  # terminated between the look and the send, or an agent that is not registered: look again
        gone.update(split_addressable(ec2, refused)[1])
    states = [NodeJobState.from_invocation(i) for i in invocations.values() if i.instance_id not in gone]
    states += [NodeJobState.gone(instance_id, why) for instance_id, why in gone.items()]
    return sorted(states, key=lambda s: s.instance_id)


def abort_job(
    ssm: Any,
    ec2: Any,
    document_name: str,
    job_id: str,
    instance_ids: Sequence[str],
    sleep: Sleep = time.sleep,
    clock: Clock = time.monotonic,
) -> list[NodeJobState]:
    """`cancel` in mode abort on the nodes: torchrun and its workers SIGKILLed at once, no checkpoint, within
    ABORT_STOP_SECONDS (the job keeper's stop of an ended attempt's survivors: the job restarts from a checkpoint
    tier, and a collective save would block without the lost node)."""
    return query_job(ssm, ec2, document_name, job_id, instance_ids, "cancel",
                     cancel_timeout_seconds=ABORT_STOP_SECONDS, sleep=sleep, clock=clock,
                     cancel_mode=job_contract.CANCEL_ABORT)
