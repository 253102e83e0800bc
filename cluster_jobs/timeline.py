"""A restart's critical path, phase by phase: what the job keeper, the nodes' supervisors and the trainer record
of each attempt (Attempt.timeline), and the seconds from a fault to each phase of the attempt that replaced it.

The phases, in their order on the path:

- of the attempt that ended (the job keeper's): `fault_seen` (Attempt.fault_seen_by says what saw it), `ended`
  (the attempt recorded ended), `survivors_stopped` (the abort of its other nodes returned);
- of the next attempt, from its nodes (the latest node of each phase: a phase is done when every node is past
  it): `started` (the node's supervisor began), `rendezvous_done` (the trainer's process group was up),
  `checkpoint_loaded` (its resume line; Attempt.resumed_from_tier says which tier), `compiled` (the first
  forward and backward, where torch.compile compiles; each node's report says whether it compiled warm from
  the job's compile-cache snapshot), `first_step`.

Times are UTC to the millisecond ("2026-11-27T04:01:02.345Z"): each from its own machine's clock.
"""

from __future__ import annotations

import dataclasses
import datetime
from collections.abc import Sequence

from cluster_jobs.compaction import node_summary
from cluster_jobs.job_record import parse_phase
from cluster_jobs.node_states import NodeJobState
from cluster_jobs.table import Attempt, JobRecord

ENDING_PHASES = ("fault_seen", "ended", "survivors_stopped")
NODE_PHASES = ("started", "rendezvous_done", "checkpoint_loaded", "compiled", "first_step")
PHASES = ENDING_PHASES + NODE_PHASES


def phase_text(now: datetime.datetime) -> str:
    """`now` as a phase time: UTC, to the millisecond."""
    utc = now.astimezone(datetime.UTC)
    return utc.strftime("%Y-%m-%dT%H:%M:%S") + f".{utc.microsecond // 1000:03d}Z"


def with_node_phases(attempt: Attempt, states: Sequence[NodeJobState]) -> Attempt:
    """`attempt` with its nodes' phases: for each, the latest of the nodes that report it for this attempt."""
    timeline = dict(attempt.timeline)
    for phase in NODE_PHASES:
        seen = [(parse_phase(s.phases[phase]), s.phases[phase]) for s in states
                if s.attempt == attempt.number and s.phases and isinstance(s.phases.get(phase), str)]
        seen = [(when, text) for when, text in seen if when is not None]
        if seen:
            timeline[phase] = max(seen)[1]
    if timeline == attempt.timeline:
        return attempt
    return dataclasses.replace(attempt, timeline=timeline)


def restart_seconds(record: JobRecord, number: int) -> dict[str, object] | None:
    """The restart after attempt `number` as one JSON-ready object: the seconds from its fault to each phase (of
    `number`'s end and of the next attempt's start) that was recorded, what saw the fault, and the tier the next
    attempt loaded; None when attempt `number` saw no fault or no next attempt exists."""
    if number >= len(record.attempts):
        return None
    ended, following = record.attempts[number - 1], record.attempts[number]
    fault = parse_phase(ended.timeline.get("fault_seen", ""))
    if fault is None:
        return None
    seconds: dict[str, float] = {}
    for attempt, phases in ((ended, ENDING_PHASES), (following, NODE_PHASES)):
        for phase in phases:
            when = parse_phase(attempt.timeline.get(phase, ""))
            if when is not None:
                seconds[phase] = round((when - fault).total_seconds(), 3)
    # with torch.compile: how many of the next attempt's nodes compiled warm from the job's snapshot
    # (its summary's counts once it is no longer the current attempt: compaction.node_summary)
    compiled = node_summary(following).compile_cache
    return {"attempt": following.number, "fault": ended.end_reason, "fault_seen_by": ended.fault_seen_by,
            "tier": following.resumed_from_tier, "resumed_from_step": following.resumed_from_step,
            "compile_cache": {"snapshot": compiled.get("snapshot", 0), "nodes": sum(compiled.values())}
            if compiled else None,
            "seconds_from_fault": seconds}


def timeline_lines(record: JobRecord) -> list[str]:
    """What `clusterctl status` prints under the attempts: one line per restart, the seconds from the fault."""
    lines = []
    for number in range(1, len(record.attempts)):
        restart = restart_seconds(record, number)
        if restart is None:
            continue
        seconds = restart["seconds_from_fault"]
        assert isinstance(seconds, dict)
        cells = []
        for phase in PHASES[1:]:
            if phase in seconds:
                name = phase.replace("_", " ")
                if phase == "checkpoint_loaded" and restart["tier"]:
                    name += f" ({restart['tier']})"
                if phase == "compiled" and isinstance(restart["compile_cache"], dict):
                    name += " (warm on {snapshot} of {nodes} nodes)".format(**restart["compile_cache"])
                cells.append(f"{name} +{seconds[phase]:.1f} s")
        by = f" by {restart['fault_seen_by']}" if restart["fault_seen_by"] else ""
        lines.append(f"restart {number} -> {number + 1}: fault seen{by}; " + (", ".join(cells) or "no phase yet"))
    return lines
