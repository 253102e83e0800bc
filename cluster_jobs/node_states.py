"""A job as its nodes see it: one NodeJobState per node (running, failed, hung, gone, ...), and the job's
overall state, NCCL network and commcheck bandwidth derived from them."""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import dataclass

from cluster_jobs import node_answer
from cluster_jobs.ssm_commands import Invocation
from cluster_jobs.table import NodeReport
from node_bootstrap import job_contract

GONE = "gone"  # the node that ran the job is terminated (replaced): nothing is left to ask
HANG_HERE = job_contract.HANG_HERE  # a hung job's node whose supervisor found the hang on it


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
    resumed_from_tier: str | None = None  # its tier: "local" or "durable"; None: fresh, or not reported
    # with torch.compile, where this node's compile started: "snapshot" (warm, the job's compile cache) or "cold"
    compile_cache: str | None = None
    # the newest held-out loss ([validation]) rank 0 logged on this node, and the step it was evaluated after
    last_val_loss: float | None = None
    last_val_step: int | None = None
    # the restart timeline on the node (its supervisor's start and the trainer's phases: cluster_jobs/timeline.py)
    phases: dict[str, str] | None = None
    # the seconds the trainer spent in each phase after its first step (job_contract.PHASE_NAMES), and when the
    # job last printed (UTC, to the millisecond): the job's goodput reads them (cluster_jobs/goodput.py)
    phase_seconds: dict[str, float] | None = None
    last_output_at: str | None = None
    # a hung job's: where the node's supervisor found the hang (job_contract.HANG_ORIGINS: "here" names this node)
    # and one line of what it saw there (node_bootstrap/jobs/hang_origin.py)
    hang_origin: str | None = None
    hang_evidence: str | None = None
    quiet_since: str | None = None  # a hung job's: when its supervisor last saw it progress (UTC, to the ms)

    # what the answer held outside cluster_jobs/node_answer.py's schema, dropped: a warning each, never the value
    dropped: tuple[str, ...] = ()

    @classmethod
    def from_invocation(cls, invocation: Invocation) -> NodeJobState:
        """The node's answer through the one parser (cluster_jobs/node_answer.py): what a job printed reaches
        this side only as values that fit the schema."""
        payload = invocation.payload or {}
        state = payload.get("state")
        if isinstance(state, str) and state in job_contract.STATES:
            fields, dropped = node_answer.parse_payload(payload)
            return cls(invocation.instance_id, state, **fields, dropped=tuple(dropped))
        error = node_answer.node_error(invocation.error)
        if invocation.response_code == job_contract.EXIT_NOT_FOUND:
            return cls(invocation.instance_id, "not-found", None, None, None, None, None, error)
        return cls(invocation.instance_id, "unknown", None, None, None, None, None, error)

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

    def report(self) -> NodeReport:
        """What the job record keeps of this answer (its current attempt's node reports)."""
        return NodeReport(instance_id=self.instance_id, state=self.state, exit_code=self.exit_code,
                          last_step=self.last_step, started_at=self.started_at, ended_at=self.ended_at,
                          detail=self.detail, compile_cache=self.compile_cache, dropped=list(self.dropped),
                          phase_ms=None if self.phase_seconds is None else
                          {name: round(seconds * 1000) for name, seconds in self.phase_seconds.items()},
                          last_output_at=self.last_output_at, hang_origin=self.hang_origin,
                          quiet_since=self.quiet_since)


def is_commcheck(states: Sequence[NodeJobState]) -> bool:
    return any(s.module == job_contract.COMMCHECK_MODULE for s in states)


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
