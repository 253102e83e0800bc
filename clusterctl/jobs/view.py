"""How the job commands show a job: its record (the attempts, the steps lost at each restart) and its nodes'
answers, as text for people and as JSON-ready dicts for scripts."""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence

from cluster_jobs import records as job_records
from cluster_jobs.export import export_place, exported_step
from cluster_jobs.goodput import job_goodput, summary_line
from cluster_jobs.node_states import GONE, NodeJobState, is_commcheck, overall_state, reported_busbw
from cluster_jobs.table import Attempt, JobRecord
from cluster_jobs.timeline import restart_seconds, timeline_lines
from clusterctl.jobs.layout_view import layout_line, record_layout
from clusterctl.render import format_table


def record_json(record: JobRecord, now: datetime.datetime) -> dict[str, object]:
    """The record's fields (snake_case, like the nodes' states), with each attempt's steps lost, the
    attempt number, the last step and the cost so far."""
    data = dataclasses.asdict(record)
    for attempt, raw in zip(record.attempts, data["attempts"], strict=True):
        raw["steps_lost"] = record.steps_lost(attempt.number)
    cost = job_records.cost_so_far_usd(record, now)
    restarts = [restart_seconds(record, number) for number in range(1, record.attempt)]
    layout = record_layout(record)
    goodput = job_goodput(record, now)  # computed from the record as read: never stale, no field to migrate
    data.update(goodput=None if goodput is None else goodput.to_json(),
                attempt=record.attempt, last_step=record.last_step,
                layout=None if layout is None else {"name": layout.name, **layout.settings()},
                cost_so_far_usd=None if cost is None else round(cost, 2),
                restarts=[r for r in restarts if r is not None])
    return data


def attempt_summary(state: str, attempt: int, max_job_restarts: int) -> str:
    """A job's state and attempt as `status` and `top` show them: `restarting, attempt 2 (restarts: 1 of at
    most 5)`. Attempt 1 is the submit; each restart on a new node set adds one."""
    return f"{state}, attempt {attempt} (restarts: {max(0, attempt - 1)} of at most {max_job_restarts})"


def format_record(record: JobRecord, checkpoint_bucket: str | None = None, nodes_state: str | None = None,
                  now: datetime.datetime | None = None) -> str:
    """The job as its record has it: the header, then one row per attempt (STEPS LOST: the step the attempt
    reached minus the step the next one resumed from), then each attempt's nodes. An export job says what it
    exports and where to, and where the model is in the checkpoint bucket (`nodes_state`: its nodes' overall
    state, which says succeeded before the job keeper's next round records it). With `now`, the goodput line
    (cluster_jobs/goodput.py: the time since the submit that trained, and the largest causes of the rest)."""
    what = f"{record.module} {record.config}".rstrip()
    lines = [
        f"job {record.job_id}: {attempt_summary(record.state, record.attempt, record.max_job_restarts)}; {what} on "
        f"{record.nodes} x {record.instance_type}"
    ]
    if record.reason:
        lines.append(f"reason: {record.reason}")
    place = export_place(record, checkpoint_bucket)
    if place is not None:
        lines += export_lines(record, place.fsx_dir, place.s3_uri, nodes_state)
    elif record.checkpoint_dir:
        lines.append(f"checkpoints: {record.checkpoint_dir}")
    if record.fp8_backend:
        lines.append(f"fp8 backend: {record.fp8_backend}")
    if (layout := layout_line(record)) is not None:  # the [parallel] degrees the submit sent
        lines.append(layout)
    rows = [
        (
            a.number,
            len(a.nodes),
            a.rendezvous_host,
            a.started_at,
            a.ended_at,
            a.step_reached,
            _resumed(a.resumed_from_step, a.resumed_from_tier),
            record.steps_lost(a.number),
            a.end_reason,
        )
        for a in record.attempts
    ]
    lines.append(format_table(
        ("ATTEMPT", "NODES", "RENDEZVOUS", "STARTED", "ENDED", "STEP", "RESUMED FROM", "STEPS LOST", "REASON"),
        rows,
    ))
    lines += [f"attempt {a.number} nodes: {', '.join(a.nodes)}{_summarized(a)}" for a in record.attempts]
    lines += timeline_lines(record)  # each restart's phases, in seconds from its fault
    if now is not None and (goodput := job_goodput(record, now)) is not None:
        lines.append(summary_line(goodput))
    if record.dropped_on_read:  # stored values outside the record's schema (cluster_jobs/record_schema.py)
        lines.append(f"dropped on read ({len(record.dropped_on_read)}): {'; '.join(record.dropped_on_read)}")
    return "\n".join(lines)


def export_lines(record: JobRecord, fsx_dir: str, s3_uri: str | None, nodes_state: str | None = None) -> list[str]:
    """What an export job exports and where, and where its model lands in S3 (nothing for an export that
    failed or was cancelled)."""
    step = exported_step(record)
    which = f"step {step}" if step is not None else "its newest complete step"
    lines = [f"export: job {record.resume_from}'s checkpoint, {which} -> {fsx_dir}"]
    where = s3_uri or "the checkpoint bucket (stack output CheckpointBucketName)"
    if "succeeded" in (record.state, nodes_state):
        lines.append(f"model: {where} (the data repository association copies it from {fsx_dir}; complete "
                     "once model.safetensors.index.json and every file it names are there)")
    elif record.state not in ("failed", "cancelled"):
        lines.append(f"model: lands in {where} once the export succeeds")
    return lines


def _summarized(attempt: Attempt) -> str:
    """An earlier attempt's node states, counted, once its reports were compacted (cluster_jobs/compaction.py):
    " (node states: gone 1, running 255; 1 report kept)"."""
    summary = attempt.node_summary
    if summary is None or not summary.reports:  # not compacted, or no node had answered
        return ""
    states = ", ".join(f"{state} {count}" for state, count in sorted(summary.states.items()))
    return f" (node states: {states}; {len(attempt.node_reports)} report(s) kept)"


def _resumed(step: int | None, tier: str | None) -> str | int | None:
    """The RESUMED FROM cell: the step, and its checkpoint tier when the trainer named one ("40 local")."""
    return f"{step} {tier}" if step is not None and tier else step


def states_json(job_id: str, states: Sequence[NodeJobState]) -> dict[str, object]:
    report: dict[str, object] = {"jobId": job_id, "state": overall_state(states), "nodes": list(states)}
    if is_commcheck(states):
        reported = reported_busbw(states)
        report["busbwGbps"] = reported.busbw_gbps if reported else None
        report["busbwSizeBytes"] = reported.busbw_size_bytes if reported else None
    return report


def format_states(states: Sequence[NodeJobState], label: str) -> str:
    """One row per node, then `<label>: <overall state> (<nodes>)`; for a commcheck, busbw where rank 0
    logged it instead of step and loss; for a job with [validation], its newest held-out loss."""
    overall = overall_state(states)
    if is_commcheck(states):
        return _format_commcheck_states(states, overall, label)
    # a VAL LOSS column only for a job with [validation] that has evaluated it (rank 0's node logs it)
    validated = any(s.last_val_loss is not None for s in states)
    rows = [
        (s.instance_id, s.state, s.exit_code, s.last_step, s.last_loss,
         *((_val_loss(s),) if validated else ()), s.network, s.started_at, s.ended_at, s.detail)
        for s in states
    ]
    headers = ("INSTANCE", "STATE", "EXIT", "STEP", "LOSS", *(("VAL LOSS",) if validated else ()), "NETWORK",
               "STARTED", "ENDED", "DETAIL")
    table = format_table(headers, rows)
    return "\n".join([table, *dropped_lines(states), f"{label}: {overall} ({_count_nodes(states)})"])


def dropped_lines(states: Sequence[NodeJobState]) -> list[str]:
    """One line per node whose answer held values outside the schema (cluster_jobs/node_answer.py): which
    fields, and why; never the values."""
    return [f"{s.instance_id}: {len(s.dropped)} value(s) of its answer dropped: {'; '.join(s.dropped)}"
            for s in states if s.dropped]


def _val_loss(state: NodeJobState) -> str | None:
    """The VAL LOSS cell: the held-out loss and the step it was evaluated after, "2.3456@1200"."""
    if state.last_val_loss is None:
        return None
    return f"{state.last_val_loss:.4f}@{state.last_val_step}"


def _format_commcheck_states(states: Sequence[NodeJobState], overall: str, label: str) -> str:
    reported = reported_busbw(states)
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
    table = format_table(
        ("INSTANCE", "STATE", "EXIT", "BUSBW GB/S", "SIZE", "NETWORK", "STARTED", "ENDED", "DETAIL"), rows
    )
    summary = "\n".join([*dropped_lines(states), f"{label}: {overall} ({_count_nodes(states)})"])
    if reported is not None:
        summary += f"; all_reduce busbw {reported.busbw_gbps:.1f} GB/s at {_format_mib(reported.busbw_size_bytes)}"
    else:
        summary += "; no busbw logged yet"
    return f"{table}\n{summary}"


def _count_nodes(states: Sequence[NodeJobState]) -> str:
    gone = sum(s.state == GONE for s in states)
    return f"{len(states)} nodes" + (f", {gone} gone (replaced)" if gone else "")


def _format_mib(size_bytes: int | None) -> str | None:
    return None if size_bytes is None else f"{size_bytes / 2**20:g} MiB"
