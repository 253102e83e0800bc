"""A job's record as the job table keeps it (cluster_jobs/table.py stores it, one DynamoDB item per job): the job,
its attempts, each attempt's nodes' reports and, once the attempt is no longer the current one, the summary of
those reports that the readers need (cluster_jobs/compaction.py writes it and keeps the item under DynamoDB's
400 KB)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass, field

from node_bootstrap.job_contract import TABLE_ACTIVE_STATES

ACTIVE_STATES = TABLE_ACTIVE_STATES  # the nodes check a start against the same states
FINAL_STATES = ("succeeded", "failed", "cancelled")
STATES = ACTIVE_STATES + FINAL_STATES


def utc_now_text(now: datetime.datetime) -> str:
    return now.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def parse_time(text: str | None) -> datetime.datetime | None:
    """A record's time: the keeper's and clusterctl's to the second ("2026-11-20T23:15:02Z"), a node's maybe
    with a fraction (node_answer.TIME_RE allows one); None for none, and for anything else a stored record
    holds (a time that does not parse must not stop a save, a keeper round or a status)."""
    if not text or not isinstance(text, str):
        return None
    for form in ("%Y-%m-%dT%H:%M:%SZ", "%Y-%m-%dT%H:%M:%S.%fZ"):
        try:
            return datetime.datetime.strptime(text, form).replace(tzinfo=datetime.UTC)
        except ValueError:
            continue
    return None


def parse_phase(text: str) -> datetime.datetime | None:
    """A phase time (UTC to the millisecond, "2026-11-27T04:01:02.345Z"); None when it is not one."""
    try:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except (TypeError, ValueError):
        return None


@dataclass
class NodeReport:
    """One node's last answer about the job (node_bootstrap.jobs status, through the jobs document)."""

    instance_id: str
    state: str  # running, succeeded, failed, cancelled, hung, not-found, unknown, gone
    exit_code: int | None = None
    last_step: int | None = None
    started_at: str | None = None
    ended_at: str | None = None
    detail: str | None = None
    compile_cache: str | None = None  # with torch.compile: "snapshot" (a warm compile) or "cold"; None: unknown
    # milliseconds the trainer spent in each phase after its first step (job_contract.PHASE_NAMES; milliseconds:
    # DynamoDB's serializer takes no float), and when the job last printed (UTC, to the millisecond)
    phase_ms: dict[str, int] | None = None
    last_output_at: str | None = None
    # a hung job's: where the node's supervisor found the hang (job_contract.HANG_ORIGINS); "here": the job keeper
    # restarts the job without this node where the group has another ready one (job_keeper/keeper.py)
    hang_origin: str | None = None
    quiet_since: str | None = None  # a hung job's: when its supervisor last saw it progress (UTC, to the ms)
    # what the node's answer held outside cluster_jobs/node_answer.py's schema, dropped: one warning each
    dropped: list[str] = field(default_factory=list)


@dataclass
class NodeSummary:
    """What the readers need of an attempt's node reports, kept when the reports themselves are compacted away
    (cluster_jobs/compaction.py): goodput's fault, end and phase seconds, the timeline's compile-cache counts,
    and how many nodes ended in each state. Times as the reports write them."""

    reports: int = 0  # the attempt's node reports when it was summarized
    states: dict[str, int] = field(default_factory=dict)  # state -> how many nodes reported it
    first_ended_at: str | None = None  # the earliest node's job end
    last_ended_at: str | None = None  # the latest node's job end, when every node reported one
    # when the attempt went quiet: the newest of its hung nodes' last progress (their supervisors' quiet_since),
    # else of its running nodes' last output, when each reported one
    quiet_since: str | None = None
    phase_ms: dict[str, int] | None = None  # phase -> the most milliseconds any node reported; None: no node did
    compile_cache: dict[str, int] = field(default_factory=dict)  # "snapshot"/"cold" -> nodes that reported it


@dataclass
class Attempt:
    """One start of the job on one node set. Attempt 1 is the submit; each restart adds one."""

    number: int
    nodes: list[str]  # instance ids, ordered by private IP
    rendezvous_host: str  # the private IP of the node hosting the c10d store (the first of `nodes`)
    started_at: str
    ended_at: str | None = None
    end_reason: str | None = None  # why it ended: the fault that caused the restart, or the final outcome
    step_reached: int | None = None  # the highest step its nodes logged
    resumed_from_step: int | None = None  # the checkpoint step it resumed from (0: from scratch); None: unknown
    resumed_from_tier: str | None = None  # "local" (node-local shards and replicas) or "durable" (FSx); None: fresh
    # every node's last answer while the attempt is the current one; after it, those that explain its end
    # (compaction.compact_attempt), and node_summary what the readers need of them all
    node_reports: list[NodeReport] = field(default_factory=list)
    node_summary: NodeSummary | None = None
    # its restart timeline: phase -> UTC time to the millisecond (cluster_jobs/timeline.py PHASES)
    timeline: dict[str, str] = field(default_factory=dict)
    fault_seen_by: str | None = None  # what saw the fault that ended it (the keeper round's trigger)


@dataclass
class JobRecord:
    job_id: str
    module: str  # node_bootstrap.jobs.MODULES
    config: str  # the training TOML's path as the nodes see it ("" for a commcheck)
    config_text: str  # its content at submit time ("" when it lives on the nodes only, or for a commcheck)
    overrides: list[str]
    resume_from: str  # another job whose checkpoints the first attempt may start from, or ""
    nodes: int
    gpus_per_node: int
    max_restarts: int  # torchrun's in-place restarts per attempt
    max_job_restarts: int  # the keeper's restarts on a new node set (the stack's maxJobRestarts)
    instance_type: str
    checkpoint_dir: str  # where every attempt saves and resumes ("" for a commcheck)
    state: str
    created_at: str
    updated_at: str
    attempts: list[Attempt] = field(default_factory=list)
    ended_at: str | None = None
    reason: str | None = None  # why the job is in its state: a restart's cause, or the final outcome
    cancel_requested_by: str | None = None  # "clusterctl cancel" or "capacity block end"
    fp8_backend: str | None = None  # the trainer's fp8.backend; None: not known here (a commcheck, a node config)
    version: int = 0  # optimistic concurrency: every put is conditional on the version read
    # stored values that did not fit their field when this record was read (cluster_jobs/record_schema.py),
    # dropped: shown by status and jobs, never written back (the next save writes the record clean)
    dropped_on_read: list[str] = field(default_factory=list, compare=False)

    @property
    def attempt(self) -> int:
        return len(self.attempts)

    @property
    def current(self) -> Attempt | None:
        return self.attempts[-1] if self.attempts else None

    @property
    def restarts(self) -> int:
        return max(0, len(self.attempts) - 1)

    @property
    def last_step(self) -> int | None:
        steps = [a.step_reached for a in self.attempts if a.step_reached is not None]
        return max(steps) if steps else None

    def steps_lost(self, number: int) -> int | None:
        """Steps attempt `number` reached that the next attempt had to redo (reached - resumed from)."""
        if number >= len(self.attempts):
            return None
        reached = self.attempts[number - 1].step_reached
        resumed = self.attempts[number].resumed_from_step
        if reached is None or resumed is None:
            return None
        return max(0, reached - resumed)
