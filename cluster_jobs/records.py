"""Between the jobs document and the job table: the record a submit writes, an attempt on a set of nodes, the
nodes' answers copied into a record, the changes a failed start and a cancel make, and a record's cost.

Pure functions on cluster_jobs.table's dataclasses (they return a new record, or None when there is
nothing to write), and one retry loop for writes that lose to another writer (the job keeper).
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Callable, Mapping, Sequence

from cluster_aws.errors import EXIT_USAGE, ClusterctlError
from cluster_aws.nodes import Node
from cluster_jobs.cost import SECONDS_PER_HOUR, estimate_cost
from cluster_jobs.node_states import NodeJobState
from cluster_jobs.request import REPO_ROOT, JobRequest
from cluster_jobs.table import (
    FINAL_STATES,
    MAX_CONFIG_TEXT_BYTES,
    Attempt,
    JobRecord,
    JobTable,
    JobTableError,
    NodeReport,
    StaleRecord,
    parse_time,
    utc_now_text,
)
from cluster_jobs.timeline import with_node_phases
from instance_catalog.instance_types import UnknownInstanceType
from node_bootstrap import jobs as node_jobs

CANCELLED_BY = "clusterctl cancel"
SAVE_TRIES = 5  # reads and writes of one change before giving up on a record that keeps changing


def job_checkpoint_dir(checkpoint_root: str, job_id: str) -> str:
    """The job's checkpoint directory as the nodes compute it (node_bootstrap.jobs.checkpoint_dir: the one
    rule, <checkpointRoot>/<job id>), from the node config's checkpointRoot."""
    settings = node_jobs.JobSettings(
        root="/", python="", bundle_dir="", env_file="", jobs_dir="", job_log_dir="",
        checkpoint_root=checkpoint_root, rendezvous_port=0, log_group_name="",
    )
    return node_jobs.checkpoint_dir(settings, job_id)


def read_config_text(config: str) -> str:
    """The training TOML's content for the record: a bundle path is read from this checkout (the bundle is
    built from it); an absolute path lives on the nodes only, and "" says so (a commcheck has no config)."""
    if not config or config.startswith("/"):
        return ""
    data = (REPO_ROOT / config).read_bytes()
    if len(data) > MAX_CONFIG_TEXT_BYTES:
        raise ClusterctlError(
            f"--config={config!r}: {len(data)} bytes; allowed: up to {MAX_CONFIG_TEXT_BYTES} (the job record "
            "keeps the config's content)",
            EXIT_USAGE,
        )
    return data.decode("utf-8")


def new_attempt(number: int, nodes: Sequence[Node], now: datetime.datetime) -> Attempt:
    """An attempt on `nodes` (ready, ordered by private IP): the first hosts the rendezvous, as
    cluster_jobs.document.submit_job starts it."""
    return Attempt(
        number=number,
        nodes=[n.instance_id for n in nodes],
        rendezvous_host=str(nodes[0].private_ip),
        started_at=utc_now_text(now),
    )


def new_record(
    request: JobRequest,
    job_id: str,
    *,
    instance_type: str,
    max_job_restarts: int,
    checkpoint_dir: str,
    config_text: str,
    attempt: Attempt,
    now: datetime.datetime,
    fp8_backend: str | None = None,
) -> JobRecord:
    """What a submit writes before any node is touched: state starting, its first attempt."""
    created = utc_now_text(now)
    return JobRecord(
        job_id=job_id,
        module=request.module,
        config=request.config,
        config_text=config_text,
        overrides=list(request.overrides),
        resume_from=request.resume_from,
        nodes=request.nodes,
        gpus_per_node=request.gpus_per_node,
        max_restarts=request.max_restarts,
        max_job_restarts=max_job_restarts,
        instance_type=instance_type,
        checkpoint_dir=checkpoint_dir,
        state="starting",
        created_at=created,
        updated_at=created,
        attempts=[attempt],
        fp8_backend=fp8_backend,
    )


def node_report(state: NodeJobState) -> NodeReport:
    """What the record keeps of a node's answer, parsed already (cluster_jobs/node_answer.py)."""
    return state.report()


def with_node_answers(record: JobRecord, states: Sequence[NodeJobState]) -> JobRecord | None:
    """The record with the nodes' answers as its current attempt's reports (a node that did not answer keeps
    its last report), their start-up phases in its timeline (as the keeper's rounds merge them: goodput's
    start-up categories read them) and the highest step they logged; None when that changes nothing."""
    current = record.current
    if current is None:
        return None
    previous = {r.instance_id: r for r in current.node_reports}
    reports = [
        previous[s.instance_id] if s.state == "unknown" and s.instance_id in previous else node_report(s)
        for s in states
    ]
    steps = [r.last_step for r in reports if r.last_step is not None]
    if current.step_reached is not None:
        steps.append(current.step_reached)
    step_reached = max(steps) if steps else None
    phased = with_node_phases(current, states)
    if reports == current.node_reports and step_reached == current.step_reached and phased is current:
        return None
    attempt = dataclasses.replace(phased, node_reports=reports, step_reached=step_reached)
    return dataclasses.replace(record, attempts=[*record.attempts[:-1], attempt])


def started(record: JobRecord, number: int, states: Sequence[NodeJobState]) -> JobRecord | None:
    """Every node of attempt `number` answered its start: the job runs (unless someone moved it on)."""
    if record.state != "starting" or record.attempt != number:
        return None
    answered = with_node_answers(record, states) or record
    return dataclasses.replace(answered, state="running")


def start_failure_reason(number: int, errors: Mapping[str, str], node_count: int) -> str:
    """Why attempt `number` failed to start, naming each node that did not start it ({instance id: why})."""
    details = "; ".join(f"{instance_id}: {error}" for instance_id, error in errors.items())
    return f"attempt {number} did not start on {len(errors)} of {node_count} nodes ({details})"


def failed(record: JobRecord, number: int, reason: str, now: datetime.datetime) -> JobRecord | None:
    """Attempt `number` could not be started: the job failed (which gives the lock back), unless it already
    reached a final state or moved on to another attempt."""
    if record.state in FINAL_STATES or record.attempt != number:
        return None
    return _ended(record, "failed", reason, now)


def cancelled(record: JobRecord, now: datetime.datetime) -> JobRecord | None:
    """clusterctl cancel: the job ends as cancelled (and gives the lock back); None if it already ended."""
    if record.state in FINAL_STATES:
        return None
    changed = _ended(record, "cancelled", f"cancelled with {CANCELLED_BY}", now)
    return dataclasses.replace(changed, cancel_requested_by=CANCELLED_BY)


def _ended(record: JobRecord, state: str, reason: str, now: datetime.datetime) -> JobRecord:
    ended_at = utc_now_text(now)
    attempts = list(record.attempts)
    if attempts and attempts[-1].ended_at is None:
        attempts[-1] = dataclasses.replace(attempts[-1], ended_at=ended_at, end_reason=reason)
    return dataclasses.replace(record, state=state, reason=reason, ended_at=ended_at, attempts=attempts)


@dataclasses.dataclass(frozen=True)
class Update:
    record: JobRecord  # as written, or as last read when there was nothing to write
    written: bool


def update_record(
    table: JobTable,
    job_id: str,
    change: Callable[[JobRecord], JobRecord | None],
    now: datetime.datetime,
    tries: int = SAVE_TRIES,
) -> Update:
    """Reads the job, applies `change` and writes the result; when another writer (the keeper) wrote in
    between, reads it again and applies `change` to what it wrote, so nobody's write is undone."""
    for _ in range(tries):
        read = table.get(job_id)
        if read is None:
            raise JobTableError(f"job {job_id}: not in the job table {table.table_name}")
        changed = change(read)
        if changed is None:
            return Update(read, written=False)
        try:
            return Update(table.save(changed, now), written=True)
        except StaleRecord:
            continue
    raise StaleRecord(f"job {job_id}: changed {tries} times while it was being updated; try again")


def attempt_hours(record: JobRecord, attempt: Attempt, now: datetime.datetime) -> float:
    """How long the attempt's nodes were the job's: until its end, the job's end, or now."""
    start = parse_time(attempt.started_at)
    end = parse_time(attempt.ended_at) or (parse_time(record.ended_at) if record.state in FINAL_STATES else None)
    if start is None:
        return 0.0
    return max(0.0, ((end or now) - start).total_seconds() / SECONDS_PER_HOUR)


def node_hours(record: JobRecord, now: datetime.datetime) -> float:
    """Each attempt's nodes x its hours, summed: what the job has held of the cluster so far."""
    return sum(len(a.nodes) * attempt_hours(record, a, now) for a in record.attempts)


def cost_so_far_usd(record: JobRecord, now: datetime.datetime) -> float | None:
    """The job's node-hours x the catalog's on-demand price (cluster_jobs.cost); None for an instance type the
    catalog does not have."""
    try:
        return estimate_cost(record.instance_type, 1, node_hours(record, now)).total_usd
    except UnknownInstanceType:
        return None
