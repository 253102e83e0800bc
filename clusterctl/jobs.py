"""Jobs through the stack's SSM document: submit, status, cancel (docs/architecture.md section 5).

One `ssm:SendCommand` runs node_bootstrap.jobs on every node of a job; the nodes answer with one JSON
object on stdout, which clusterctl reads back with `ssm:GetCommandInvocation`. A job's nodes are found
again from its start command (`ssm:ListCommands`; SSM keeps command history for 30 days).
"""

from __future__ import annotations

import datetime
import json
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import botocore.exceptions

from clusterctl.aws import EXIT_USAGE, ClusterctlError
from clusterctl.nodes import Node, split_addressable
from node_bootstrap import jobs as node_jobs
from training import config as training_config
from training.errors import ConfigError as TrainingConfigError

SEND_BATCH = 50  # ssm:SendCommand takes at most 50 InstanceIds (SSM API reference, SendCommand)
# The version CloudFormation deployed: the document's default version. $LATEST would run any newer version
# someone created with ssm:UpdateDocument outside the stack, before anyone set it as the default.
DOCUMENT_VERSION = "$DEFAULT"
POLL_SECONDS = 2.0
START_TIMEOUT_SECONDS = 180.0  # the node waits up to 30 s for its supervisor; SSM delivery adds latency
STATUS_TIMEOUT_SECONDS = 120.0
MAX_ATTEMPT = 1000  # the jobs document's `attempt` parameter: a positive integer up to 1000
TERMINAL_STATUSES = {
    "Success",
    "Failed",
    "Cancelled",
    "TimedOut",
    "DeliveryTimedOut",
    "ExecutionTimedOut",
    "Undeliverable",
    "Terminated",
    "InvalidPlatform",
    "AccessDenied",
}
REPO_ROOT = Path(__file__).resolve().parents[1]

Sleep = Callable[[float], None]
Clock = Callable[[], float]


def new_job_id(now: datetime.datetime) -> str:
    """Sortable (UTC time first), unique enough (16 random bits per second), and inside the SSM document's
    jobId pattern: j-20261120-231502-ab12."""
    return f"j-{now.astimezone(datetime.UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def job_time(job_id: str) -> datetime.datetime | None:
    """The submit time a clusterctl job id carries, None for other ids."""
    try:
        return datetime.datetime.strptime(job_id[2:17], "%Y%m%d-%H%M%S").replace(tzinfo=datetime.UTC)
    except ValueError:
        return None


@dataclass(frozen=True)
class JobRequest:
    config: str  # training TOML as the nodes see it, relative to the bundle dir or absolute; "" for commcheck
    nodes: int
    gpus_per_node: int
    max_restarts: int
    overrides: tuple[str, ...] = ()  # training: --set items; commcheck: its options as key=value
    module: str = node_jobs.TRAINING_MODULE  # what torchrun runs (node_bootstrap.jobs.MODULES)
    resume_from: str = ""  # training: another job whose checkpoints this one starts from; "" = its own only
    # 1 for a submit; the job keeper's restarts on a new node set count up (the jobs document's `attempt`)
    attempt: int = 1

    def validate(self) -> None:
        if self.module not in node_jobs.MODULES:
            raise ClusterctlError(
                f"module={self.module!r}: allowed: {', '.join(node_jobs.MODULES)}", EXIT_USAGE
            )
        for item in self.overrides:  # what the jobs document's allowedPattern takes
            if not node_jobs.OVERRIDE_RE.fullmatch(item):
                raise ClusterctlError(
                    f"--set {item!r}: allowed: key=value, a dotted key and a value of letters, "
                    "digits and _ . : / + , @ % - (no spaces or quotes)",
                    EXIT_USAGE,
                )
        if self.module == node_jobs.TRAINING_MODULE:
            try:
                for item in self.overrides:
                    node_jobs.check_not_checkpoint_dir(item)
            except node_jobs.JobError as e:
                raise ClusterctlError(str(e).replace("overrides item", "--set"), EXIT_USAGE) from None
            if self.resume_from and not node_jobs.JOB_ID_RE.fullmatch(self.resume_from):
                raise ClusterctlError(
                    f"--resume-from={self.resume_from!r}: allowed: the id of an earlier job on this cluster "
                    "(j-YYYYMMDD-HHMMSS-xxxx)",
                    EXIT_USAGE,
                )
            self._validate_config()
        elif self.resume_from:
            raise ClusterctlError(f"{self.module} takes no --resume-from", EXIT_USAGE)
        elif self.config:
            raise ClusterctlError(f"{self.module} takes no --config (got {self.config!r})", EXIT_USAGE)
        if not 0 <= self.max_restarts <= 99:
            raise ClusterctlError(f"--max-restarts={self.max_restarts}: allowed: 0-99", EXIT_USAGE)
        if not 1 <= self.attempt <= MAX_ATTEMPT:  # the jobs document's allowedPattern for `attempt`
            raise ClusterctlError(f"attempt={self.attempt}: allowed: 1-{MAX_ATTEMPT}", EXIT_USAGE)

    def _validate_config(self) -> None:
        if not node_jobs.CONFIG_RE.fullmatch(self.config) or ".." in self.config.split("/"):
            raise ClusterctlError(
                f"--config={self.config!r}: allowed: a .toml path of letters, digits, _ . / -", EXIT_USAGE
            )
        local_configs = REPO_ROOT / "training" / "configs"
        if (
            not self.config.startswith("/")
            and local_configs.is_dir()
            and not (REPO_ROOT / self.config).is_file()
        ):
            known = ", ".join(f"training/configs/{p.name}" for p in sorted(local_configs.glob("*.toml")))
            raise ClusterctlError(
                f"--config={self.config!r}: not in the bundle; allowed: {known}, or an "
                "absolute path on the nodes (e.g. on /fsx)",
                EXIT_USAGE,
            )
        self._validate_training_settings()

    def _validate_training_settings(self) -> None:
        """The trainer's own loader and validation (training.config, which imports no torch) on the config
        and the --set items, before anything is sent: a bad key or value is refused here, not on the nodes
        after the job was "started". A config on the nodes (an absolute path) cannot be read here: then the
        --set items are checked on their own (known section and key, a value of the field's type)."""
        try:
            if self.config.startswith("/"):
                training_config.parse_overrides(self.overrides)
            else:
                training_config.load_config(REPO_ROOT / self.config, self.overrides)
        except TrainingConfigError as e:
            raise ClusterctlError(f"not submitted: {self.config} with the --set items: {e}", EXIT_USAGE) from None

    def parameters(self, job_id: str, rendezvous_host: str) -> dict[str, list[str]]:
        parameters = {
            "action": ["start"],
            "jobId": [job_id],
            "config": [self.config],
            "nodes": [str(self.nodes)],
            "gpusPerNode": [str(self.gpus_per_node)],
            "rendezvousHost": [rendezvous_host],
            "maxRestarts": [str(self.max_restarts)],
            "overrides": [" ".join(self.overrides)],
        }
        # The document's default is training; leaving it out keeps training submits working against a
        # stack deployed before the module parameter existed (SSM rejects unknown parameters).
        if self.module != node_jobs.TRAINING_MODULE:
            parameters["module"] = [self.module]
        if self.resume_from:  # likewise: only sent when asked for
            parameters["resumeFrom"] = [self.resume_from]
        if self.attempt > 1:  # likewise: a submit works against a document deployed before `attempt` existed
            parameters["attempt"] = [str(self.attempt)]
        return parameters


@dataclass(frozen=True)
class Invocation:
    """One node's answer to one command."""

    instance_id: str
    status: str  # SSM: Success, Failed, TimedOut, Undeliverable, ...
    response_code: int | None  # the node command's exit code
    stdout: str
    stderr: str

    @property
    def payload(self) -> dict[str, Any] | None:
        """The JSON object node_bootstrap.jobs printed (its last stdout line)."""
        for line in reversed(self.stdout.strip().splitlines()):
            try:
                value = json.loads(line)
            except ValueError:
                continue
            return value if isinstance(value, dict) else None
        return None

    @property
    def error(self) -> str:
        """Why it failed, in one line."""
        if self.payload and self.payload.get("error"):
            return str(self.payload["error"])
        lines = (self.stderr or self.stdout).strip().splitlines()
        detail = f": {lines[-1]}" if lines else ""
        return f"SSM {self.status} (exit code {self.response_code}){detail}"


def run_on_nodes(
    ssm: Any,
    document_name: str,
    instance_ids: Sequence[str],
    parameters: dict[str, list[str]],
    comment: str,
    timeout_seconds: float,
    sleep: Sleep = time.sleep,
    clock: Clock = time.monotonic,
) -> dict[str, Invocation]:
    """Sends the document to the nodes (in batches of 50) and waits for every node's answer."""
    pending: dict[str, str] = {}  # instance id -> command id
    results: dict[str, Invocation] = {}

    def send(batch: list[str]) -> None:
        command = ssm.send_command(
            DocumentName=document_name,
            DocumentVersion=DOCUMENT_VERSION,
            InstanceIds=batch,
            Parameters=parameters,
            Comment=comment[:100],  # SSM: Comment is at most 100 characters
            TimeoutSeconds=max(30, int(timeout_seconds)),  # delivery timeout: an offline node fails fast
        )["Command"]
        pending.update({instance_id: command["CommandId"] for instance_id in batch})

    for start in range(0, len(instance_ids), SEND_BATCH):
        batch = list(instance_ids[start : start + SEND_BATCH])
        try:
            send(batch)
        except botocore.exceptions.ClientError as e:
            if _error_code(e) != "InvalidInstanceId":
                raise
            # One instance SSM cannot address (terminated since it was looked up, or its agent is not
            # registered) fails the whole batch: send to each alone, so the others are still reached.
            for instance_id in batch:
                try:
                    send([instance_id])
                except botocore.exceptions.ClientError as alone:
                    if _error_code(alone) != "InvalidInstanceId":
                        raise
                    message = alone.response.get("Error", {}).get("Message", "")
                    results[instance_id] = Invocation(
                        instance_id, "InvalidInstanceId", None, "",
                        f"SSM cannot address the instance (InvalidInstanceId: {message or 'no detail'})",
                    )
    deadline = clock() + timeout_seconds
    while pending:
        for instance_id, command_id in list(pending.items()):
            try:
                answer = ssm.get_command_invocation(CommandId=command_id, InstanceId=instance_id)
            except botocore.exceptions.ClientError as e:
                if _error_code(e) == "InvocationDoesNotExist":
                    continue  # SSM has not registered the invocation yet
                raise
            if answer["Status"] in TERMINAL_STATUSES:
                results[instance_id] = Invocation(
                    instance_id=instance_id,
                    status=answer["Status"],
                    response_code=answer.get("ResponseCode"),
                    stdout=answer.get("StandardOutputContent", ""),
                    stderr=answer.get("StandardErrorContent", ""),
                )
                del pending[instance_id]
        if pending:
            if clock() >= deadline:
                for instance_id in pending:
                    results[instance_id] = Invocation(
                        instance_id, "NoAnswer", None, "", f"no answer within {timeout_seconds:.0f} s"
                    )
                break
            sleep(POLL_SECONDS)
    return results


def _error_code(error: botocore.exceptions.ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


# --- submit --------------------------------------------------------------------------------------------


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
    request: JobRequest,
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


# --- find, status, cancel ------------------------------------------------------------------------------


@dataclass(frozen=True)
class JobRecord:
    """What the start command says about a job."""

    job_id: str
    instance_ids: list[str]
    requested_at: datetime.datetime
    parameters: dict[str, list[str]]


def find_job(ssm: Any, document_name: str, job_id: str) -> JobRecord | None:
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
    return JobRecord(
        job_id=job_id,
        instance_ids=sorted(set(instance_ids)),
        requested_at=min(requested),
        parameters=parameters,
    )


GONE = "gone"  # the node that ran the job is terminated (replaced): nothing is left to ask


@dataclass(frozen=True)
class NodeJobState:
    """One node's view of a job, from node_bootstrap.jobs status/cancel."""

    instance_id: str
    # running, succeeded, failed, cancelled, hung; not-found (no such job there); unknown (no answer); gone
    # (the instance is terminated: the Auto Scaling group replaced it)
    state: str
    exit_code: int | None
    last_step: int | None
    last_loss: float | None
    started_at: str | None
    ended_at: str | None
    detail: str | None  # an error, or what cancel did
    nccl_network: str | None = None  # NCCL's network on the node: Libfabric (EFA), Socket (TCP), IB; None: not yet
    nccl_provider: str | None = None  # aws-ofi-nccl's libfabric provider (efa) when the network is Libfabric
    module: str | None = None  # what the job runs: training or training.commcheck; None: no answer
    busbw_gbps: float | None = None  # commcheck: all_reduce busbw (GB/s) rank 0 logged on this node
    busbw_size_bytes: int | None = None  # the message size of busbw_gbps (the largest, once it finished)
    attempt: int | None = None  # the job keeper's attempt number the node runs (1 before any restart)
    resumed_from_step: int | None = None  # the checkpoint step the trainer resumed from (0: fresh)

    @classmethod
    def from_invocation(cls, invocation: Invocation) -> NodeJobState:
        payload = invocation.payload or {}
        state = payload.get("state")
        if state in node_jobs.STATES:
            return cls(
                invocation.instance_id,
                str(state),
                payload.get("exitCode"),
                payload.get("lastStep"),
                payload.get("lastLoss"),
                payload.get("startedAt"),
                payload.get("endedAt"),
                payload.get("cancel") or payload.get("error"),
                nccl_network=payload.get("ncclNetwork"),
                nccl_provider=payload.get("ncclProvider"),
                module=payload.get("module"),
                busbw_gbps=payload.get("busbwGbps"),
                busbw_size_bytes=payload.get("busbwSizeBytes"),
                attempt=payload.get("attempt"),
                resumed_from_step=payload.get("resumedFromStep"),
            )
        if invocation.response_code == node_jobs.EXIT_NOT_FOUND:
            return cls(invocation.instance_id, "not-found", None, None, None, None, None, invocation.error)
        return cls(invocation.instance_id, "unknown", None, None, None, None, None, invocation.error)

    @classmethod
    def gone(cls, instance_id: str, why: str) -> NodeJobState:
        return cls(instance_id, GONE, None, None, None, None, None, f"gone (replaced): {why}")

    @property
    def network(self) -> str | None:
        """For people: "Libfabric/efa", "Socket", or None before NCCL chose."""
        if self.nccl_network and self.nccl_provider:
            return f"{self.nccl_network}/{self.nccl_provider}"
        return self.nccl_network

    @property
    def nccl_over_tcp(self) -> bool:
        """NCCL fell back from EFA to TCP on this node: its Socket transport, or aws-ofi-nccl on a libfabric
        provider other than EFA (tcp, sockets)."""
        if self.nccl_network == "Socket":
            return True
        provider = self.nccl_provider or ""
        return self.nccl_network == "Libfabric" and provider != "" and not provider.startswith("efa")


def is_commcheck(states: Sequence[NodeJobState]) -> bool:
    return any(s.module == node_jobs.COMMCHECK_MODULE for s in states)


def reported_busbw(states: Sequence[NodeJobState]) -> NodeJobState | None:
    """The node whose log has the commcheck's busbw: rank 0 prints it, so one node of the job."""
    return next((s for s in states if s.busbw_gbps is not None), None)


def overall_state(states: Sequence[NodeJobState]) -> str:
    """The job's state: running while any node runs; hung if a node's supervisor stopped it for making no
    progress (the other nodes then fail at their collective timeout); failed if any node failed; succeeded
    if all did. Nodes that are gone do not count; a job whose nodes are all gone is "gone"."""
    names = {s.state for s in states if s.state != GONE}
    if not names and states:
        return GONE
    for state in ("running", "hung", "failed", "cancelled"):
        if state in names:
            return state
    if names == {"succeeded"}:
        return "succeeded"
    return "unknown"


def nodes_on_tcp(states: Sequence[NodeJobState]) -> list[str]:
    """The nodes where NCCL runs over TCP instead of EFA, when that matters: in a job of more than one node
    (on one node NCCL uses NVLink and the network is idle). A run whose logs show the Socket
    transport instead of Libfabric is broken."""
    job_nodes = [s for s in states if s.state not in ("not-found", GONE)]
    if len(job_nodes) < 2:
        return []
    return [s.instance_id for s in job_nodes if s.nccl_over_tcp]


def validate_job_id(job_id: str) -> None:
    if not node_jobs.JOB_ID_RE.fullmatch(job_id):
        raise ClusterctlError(
            f"job id {job_id!r}: allowed: the id `clusterctl submit` printed (j-YYYYMMDD-HHMMSS-xxxx)",
            EXIT_USAGE,
        )


def query_job(
    ssm: Any,
    ec2: Any,
    document_name: str,
    job_id: str,
    instance_ids: Sequence[str],
    action: str = "status",
    cancel_timeout_seconds: int = node_jobs.STOP_GRACE_SECONDS,
    sleep: Sleep = time.sleep,
    clock: Clock = time.monotonic,
) -> list[NodeJobState]:
    """Runs `status` or `cancel` on the job's nodes that still exist and returns each node's state, ordered
    by instance id; the nodes the Auto Scaling group replaced are reported gone, not asked (SSM refuses a
    command to a terminated instance)."""
    addressable, gone = split_addressable(ec2, instance_ids)
    parameters = {"action": [action], "jobId": [job_id]}
    timeout_seconds = STATUS_TIMEOUT_SECONDS
    if action == "cancel":
        parameters["cancelTimeoutSeconds"] = [str(cancel_timeout_seconds)]
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
