"""Keeping a job's record inside one DynamoDB item: an attempt that is no longer the current one keeps only the
node reports that explain its end, and a summary of all of them (job_record.NodeSummary) that the readers need.

DynamoDB refuses an item over 400 KB. A node report with its phase seconds and last output is about 400 bytes
as JSON and 250 as DynamoDB counts it (item_size_bytes), so a record that kept every attempt's every report
grew by about 35 KB an attempt at 128 nodes and 70 KB at 256, passed 400 KB at 128 nodes x 12 attempts or
256 x 6, and then every save of it failed (the job keeper's round could not record the job, which held the
cluster's lock). Compacted, an earlier attempt costs its node list (about 20 bytes a node) and at most
KEPT_REPORTS reports: 256 nodes x 20 attempts is 189 KB (docs/operations.md, "One job at a time, and the job
table", has the measurements).

What the readers use of an earlier attempt's reports, and so what the summary keeps (readers ask node_summary,
which computes it from the reports for the current attempt, so a record's figures are the same before and
after its compaction): goodput.py the earliest node end (the fault, when it came before the keeper saw it),
the latest end when every node reported one (the processes' end), the newest last output of the running nodes
(a hang's start) and each phase's most milliseconds; timeline.py the compile-cache counts of the attempt after
a restart; `status` the count of nodes by state. The current attempt (the last) keeps every report: `status`
copies its nodes' answers into it, also after the job's end (a Capacity Block's nodes end after the record).

Compaction runs in JobTable.save, so every writer's save (the keeper's, clusterctl's) and the first save of an
older record compact what is no longer current; fit_record then checks the item's size against SAFE_ITEM_BYTES
and drops more, in order, what only people read: the kept reports' details and dropped-value warnings, then
the kept reports of earlier attempts, then the current attempt's details and warnings.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections import Counter
from collections.abc import Callable, Mapping, Sequence
from typing import Any

from cluster_jobs.job_record import Attempt, JobRecord, NodeReport, NodeSummary, parse_phase, parse_time

MAX_ITEM_BYTES = 400 * 1024  # DynamoDB's item size limit
SAFE_ITEM_BYTES = 350 * 1024  # past this, fit_record drops more: room for a record's growth between two saves
KEPT_REPORTS = 8  # of an earlier attempt: the reports of the nodes that explain its end, the earliest ended first
NOT_AN_END = ("running", "succeeded")  # a node in these states did not end the attempt

_LATEST = datetime.datetime.max.replace(tzinfo=datetime.UTC)


def summarize(reports: Sequence[NodeReport]) -> NodeSummary:
    """What the readers need of `reports` (see the module's docstring)."""
    ends = [(end, r.ended_at) for r in reports if (end := parse_time(r.ended_at)) is not None]
    running = [r for r in reports if r.state == "running"]
    outputs = [(parse_phase(r.last_output_at or ""), r.last_output_at) for r in running]
    # A hung node's supervisor saw its last progress (quiet_since): the attempt made none after it, since no rank
    # steps without the others, whatever its running nodes printed since (a peer's errors, a supervisor's line).
    progress = [(when, r.quiet_since) for r in reports if r.state == "hung" and r.quiet_since
                and (when := parse_phase(r.quiet_since)) is not None]
    outputs = progress or outputs
    phase_ms: dict[str, int] | None = None
    for report in reports:
        if report.phase_ms is not None:
            phase_ms = phase_ms if phase_ms is not None else {}
            for phase, ms in report.phase_ms.items():
                phase_ms[phase] = max(phase_ms.get(phase, ms), ms)
    return NodeSummary(
        reports=len(reports),
        states=dict(Counter(r.state for r in reports)),
        first_ended_at=min(ends)[1] if ends else None,
        last_ended_at=max(ends)[1] if ends and len(ends) == len(reports) else None,
        quiet_since=max(outputs)[1] if outputs and all(when is not None for when, _ in outputs) else None,  # type: ignore[type-var]
        phase_ms=phase_ms,
        compile_cache=dict(Counter(r.compile_cache for r in reports if r.compile_cache)),
    )


def node_summary(attempt: Attempt) -> NodeSummary:
    """The attempt's summary: the one it keeps once compacted, else its reports'."""
    return attempt.node_summary if attempt.node_summary is not None else summarize(attempt.node_reports)


def compact_attempt(attempt: Attempt, keep: int = KEPT_REPORTS) -> Attempt:
    """The attempt with its summary and, of its reports, only those of the nodes that explain its end (failed,
    hung, gone, not-found, ...): at most `keep`, the earliest ended first, in the attempt's order."""
    if attempt.node_summary is not None:
        return attempt
    ending = [(i, r) for i, r in enumerate(attempt.node_reports) if r.state not in NOT_AN_END]
    ending.sort(key=lambda item: (parse_time(item[1].ended_at) or _LATEST, item[0]))
    kept = [report for _, report in sorted(ending[:keep], key=lambda item: item[0])]
    return dataclasses.replace(attempt, node_reports=kept, node_summary=summarize(attempt.node_reports))


def compact_record(record: JobRecord) -> JobRecord:
    """The record with every attempt but the current one compacted."""
    earlier = [compact_attempt(a) for a in record.attempts[:-1]]
    if all(a is b for a, b in zip(earlier, record.attempts, strict=False)):
        return record
    return dataclasses.replace(record, attempts=[*earlier, *record.attempts[-1:]])


def fit_record(record: JobRecord, size_of: Callable[[JobRecord], int], limit: int = SAFE_ITEM_BYTES) -> JobRecord:
    """The record compacted, then, while `size_of` it is over `limit`, without more of what only people read
    (the module's docstring has the order). A record still over `limit` after all of it is returned as it is."""
    record = compact_record(record)
    for shrink in (_without_old_warnings, _without_old_reports, _without_current_warnings):
        if size_of(record) <= limit:
            break
        record = shrink(record)
    return record


def _plain(report: NodeReport) -> NodeReport:
    return dataclasses.replace(report, detail=None, dropped=[])


def _without_old_warnings(record: JobRecord) -> JobRecord:
    earlier = [dataclasses.replace(a, node_reports=[_plain(r) for r in a.node_reports]) for a in record.attempts[:-1]]
    return dataclasses.replace(record, attempts=[*earlier, *record.attempts[-1:]])


def _without_old_reports(record: JobRecord) -> JobRecord:
    earlier = [dataclasses.replace(a, node_reports=[]) for a in record.attempts[:-1]]
    return dataclasses.replace(record, attempts=[*earlier, *record.attempts[-1:]])


def _without_current_warnings(record: JobRecord) -> JobRecord:
    if not record.attempts:
        return record
    current = record.attempts[-1]
    plain = dataclasses.replace(current, node_reports=[_plain(r) for r in current.node_reports])
    return dataclasses.replace(record, attempts=[*record.attempts[:-1], plain])


def item_size_bytes(item: Mapping[str, Any]) -> int:
    """A DynamoDB item's size (low-level form, {"name": {"S": ...}}) as DynamoDB counts it (Developer Guide,
    "DynamoDB item sizes and formats"): each attribute's name and value in UTF-8 bytes; a number 1 byte per two
    significant digits plus 1; a boolean or null 1; a list or map 3 bytes, plus 1 per element, plus its
    elements (and a map's names). Numbers are approximate there too."""
    return sum(len(name.encode()) + _value_bytes(value) for name, value in item.items())


def _value_bytes(value: Mapping[str, Any]) -> int:
    (kind, inner), = value.items()
    if kind == "S":
        return len(inner.encode())
    if kind == "N":
        return _number_bytes(inner)
    if kind in ("BOOL", "NULL"):
        return 1
    if kind == "B":
        return len(inner)
    if kind == "L":
        return 3 + sum(1 + _value_bytes(v) for v in inner)
    if kind == "M":
        return 3 + sum(len(k.encode()) + 1 + _value_bytes(v) for k, v in inner.items())
    if kind == "SS":
        return sum(len(s.encode()) for s in inner)
    if kind == "NS":
        return sum(_number_bytes(n) for n in inner)
    return sum(len(b) for b in inner)  # BS


def _number_bytes(text: str) -> int:
    digits = text.lstrip("-").replace(".", "").strip("0")
    return (len(digits) + 1) // 2 + 1
