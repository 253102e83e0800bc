"""Goodput: a job's wall time since its submit, split with no gap and no overlap into productive training and
badput by cause, from what its record already holds (issue 45).

The record (cluster_jobs/table.py) holds the submit time, each attempt's start and end (the job keeper's,
to the second), its restart timeline (cluster_jobs/timeline.py: the keeper's fault_seen and ended, the nodes'
started, rendezvous_done, checkpoint_loaded, compiled, first_step, to the millisecond), the step it reached
and the step it resumed from. The time since the submit is walked in that order, and every second goes to
the category of the stretch it falls in:

- `waiting_for_nodes`: the submit to the first attempt's start, and a restart's wait from the attempt's end
  to the next attempt's start on a new node set (stopping the survivors, a spare or a replacement boot);
- `startup` (first attempt): its start to the trainer's process group (SSM, supervisor, torchrun, imports,
  rendezvous);
- `checkpoint_load` (first attempt): the rendezvous to the resume line; the model's build on the meta device
  and its sharding come before the load and are counted here;
- `compile` (first attempt): the resume line to the end of the first step (torch.compile compiles in the
  first forward and backward);
- `restart` (later attempts): the next attempt's start to its first step (its own start-up, load and compile:
  `clusterctl status` shows them phase by phase, timeline.timeline_lines);
- the training span (the first step to the fault, or to the attempt's end) holds the phases the trainer
  reported after its first step (training/phases.py; each node's supervisor sums their seconds, and its report
  keeps them, NodeReport.phase_ms): `checkpoint_save` (blocking saves, the SIGTERM stop's save and the loop's
  waits for an async save's staging), `validation_and_export` (held-out passes, the final export), `data_wait`
  (the loader's waits past a second) and `compile` (a recompile, a backward compiled lazily). The nodes run
  them together, so each category takes the most any node of the attempt reports (never more than the span);
- `productive`: the rest of the span times the share of its steps that counted, and `lost_progress` what is
  left: the steps the next attempt re-ran after resuming from an older checkpoint (step_reached - the next
  resumed_from_step). The record holds no time for each step, so it is split in proportion to the steps, at an
  even pace;
- `failure_detection`: the fault to the attempt's end. The fault is the first of: a node's job that ended
  before the keeper saw the fault, the moment the attempt went quiet (the newest of its hung nodes' last
  progress, NodeReport.quiet_since: their supervisors' watch waited that long before it stopped them; else of
  its running nodes' last output, NodeReport.last_output_at: a hung peer holds them silent inside a
  collective), the keeper's fault_seen;
- `job_end`: the last node's job ended to the keeper's round that recorded the attempt's end. A job stopped by
  the keeper (a Capacity Block's end) is recorded first and its nodes end after their stop's save: its wall
  time runs to the last node's end, and that save is `checkpoint_save`.

A record without phase seconds (nodes that predate them, a job whose trainer prints no phase records) leaves
those phases inside `productive`: `folded` (in `clusterctl status --json`) names them then. The trainer's own
final line gives its in-process split (training/goodput_line.py).

Times come from several machines' clocks (the keeper's, each node's): a boundary that lies before the one
before it (clock skew, a second-resolution time) ends its stretch at once, so stretches never overlap and
the categories always add up to the wall time.
"""

from __future__ import annotations

import dataclasses
import datetime

from cluster_jobs.compaction import node_summary
from cluster_jobs.job_record import parse_phase
from cluster_jobs.table import FINAL_STATES, Attempt, JobRecord, parse_time

PRODUCTIVE = "productive"
BADPUT = ("waiting_for_nodes", "startup", "checkpoint_load", "compile", "restart", "checkpoint_save",
          "validation_and_export", "data_wait", "lost_progress", "failure_detection", "job_end")
CATEGORIES = (PRODUCTIVE, *BADPUT)
# the trainer's phases (job_contract.PHASE_NAMES) -> the category of their seconds after the first step
PHASE_CATEGORIES = {"checkpoint_save": "checkpoint_save", "validation": "validation_and_export",
                    "export": "validation_and_export", "data_wait": "data_wait", "compile": "compile",
                    "checkpoint_load": "checkpoint_load"}
# a record with no phase seconds: the categories whose seconds stay in `productive`
FOLDED = {"checkpoint_save": PRODUCTIVE, "validation_and_export": PRODUCTIVE, "data_wait": PRODUCTIVE,
          "compile (after the first step)": PRODUCTIVE}
# the first attempt's start-up phases (timeline.NODE_PHASES) and the category of the stretch each one ends
FIRST_START = (("rendezvous_done", "startup"), ("checkpoint_loaded", "checkpoint_load"), ("compiled", "compile"),
               ("first_step", "compile"))


@dataclasses.dataclass(frozen=True)
class Goodput:
    wall_s: float  # the submit to the job's end (or now, while it is active)
    seconds: dict[str, float]  # CATEGORIES -> seconds; they add up to wall_s
    folded: dict[str, str] = dataclasses.field(default_factory=dict)  # FOLDED when the record has no phase seconds

    @property
    def goodput_pct(self) -> float | None:
        return None if self.wall_s <= 0 else 100.0 * self.seconds[PRODUCTIVE] / self.wall_s

    def largest_badput(self, count: int = 3) -> list[tuple[str, float]]:
        """The `count` badput categories that cost the most, largest first; those that cost nothing left out."""
        costs = sorted(((s, name) for name, s in self.seconds.items() if name != PRODUCTIVE and s > 0), reverse=True)
        return [(name, s) for s, name in costs[:count]]

    def to_json(self) -> dict[str, object]:
        pct = self.goodput_pct
        return {"goodput_pct": None if pct is None else round(pct, 2), "wall_s": round(self.wall_s, 3),
                "seconds": {name: round(s, 3) for name, s in self.seconds.items()}, "folded": dict(self.folded)}


def summary_line(goodput: Goodput) -> str:
    """What `status` prints: "goodput 87.1% of 1:02:03 (lost progress 6.2%, restart 3.9%, startup 1.1%)"."""
    pct = goodput.goodput_pct
    if pct is None:
        return "goodput: no time yet"
    causes = ", ".join(f"{name.replace('_', ' ')} {100 * s / goodput.wall_s:.1f}%"
                       for name, s in goodput.largest_badput())
    wall = datetime.timedelta(seconds=round(goodput.wall_s))
    return f"goodput {pct:.1f}% of {wall}" + (f" ({causes})" if causes else "")


class _Walk:
    """A cursor through the job's time: each `to` gives the stretch since the last boundary to a category."""

    def __init__(self, start: datetime.datetime, end: datetime.datetime) -> None:
        self.at, self.end = start, end
        self.seconds = dict.fromkeys(CATEGORIES, 0.0)

    def to(self, when: datetime.datetime | None, category: str) -> None:
        if when is None:
            return
        when = min(max(when, self.at), self.end)  # never back in time, never past the end
        self.seconds[category] += (when - self.at).total_seconds()
        self.at = when

    def span(self, until: datetime.datetime | None, counted_share: float, phases: dict[str, float]) -> None:
        """The training span up to `until`: the `phases` seconds in their categories (scaled down to the span
        if they exceed it), of the rest its `counted_share` productive and the others lost progress."""
        if until is None:
            return
        start = self.at
        self.to(until, PRODUCTIVE)
        span_s = (self.at - start).total_seconds()
        phase_s = sum(phases.values())
        scale = min(1.0, span_s / phase_s) if phase_s > 0 else 0.0
        for category, seconds in phases.items():
            self.seconds[category] += seconds * scale
        rest_s = span_s - phase_s * scale
        lost_s = rest_s * (1.0 - counted_share)
        self.seconds[PRODUCTIVE] -= span_s - rest_s + lost_s
        self.seconds["lost_progress"] += lost_s


def job_goodput(record: JobRecord, now: datetime.datetime) -> Goodput | None:
    """The record's time since the submit, by category; None when its submit time cannot be read."""
    submit = parse_time(record.created_at)
    if submit is None:
        return None
    final = record.state in FINAL_STATES
    end = (parse_time(record.ended_at) if final else None) or now
    if final and record.attempts:
        # the last attempt's millisecond "ended" can be a fraction past the record's second; the nodes of a job
        # the keeper stopped (a Capacity Block's end) end after the record, once their stop's save is written
        ends = [e for e in (_attempt_end(record.attempts[-1]), _jobs_ended(record.attempts[-1])) if e is not None]
        end = max([end, *ends])
    walk = _Walk(submit, max(end, submit))
    tail = "waiting_for_nodes"  # the category of the time after the last boundary, up to the end (or now)
    for index, attempt in enumerate(record.attempts):
        following = record.attempts[index + 1] if index + 1 < len(record.attempts) else None
        tail = _walk_attempt(walk, attempt, following, first=index == 0)
    walk.to(walk.end, "job_end" if final else tail)
    recorded = any(node_summary(a).phase_ms is not None for a in record.attempts)
    return Goodput(wall_s=(walk.end - submit).total_seconds(), seconds=walk.seconds,
                   folded={} if recorded else dict(FOLDED))


def _walk_attempt(walk: _Walk, attempt: Attempt, following: Attempt | None, *, first: bool) -> str:
    """Walks one attempt; returns the category of the time after its last boundary (a restart's wait for
    nodes once it ended; else what it is doing now)."""
    phase = lambda name: parse_phase(attempt.timeline.get(name, ""))  # noqa: E731
    walk.to(parse_time(attempt.started_at), "waiting_for_nodes")
    if first:
        # each phase seen ends its stretch; the first not seen yet names what the attempt is doing
        doing = [category for name, category in FIRST_START if phase(name) is None]
        for name, category in FIRST_START:
            walk.to(phase(name), category)
    else:
        doing = [] if phase("first_step") is not None else ["restart"]
        walk.to(phase("first_step"), "restart")
    stepped = phase("first_step") is not None or attempt.step_reached is not None
    ended = _attempt_end(attempt)
    fault = _fault_time(attempt)
    if stepped:
        walk.span(fault or _jobs_ended(attempt) or ended, _counted_share(attempt, following), _phase_seconds(attempt))
    if ended is None:
        return PRODUCTIVE if stepped else doing[0]
    # a fault: from it to the end; no fault: the processes ended, then the keeper's round saw it
    walk.to(ended, "failure_detection" if fault is not None else "job_end" if stepped else doing[0])
    walk.to(phase("survivors_stopped"), "waiting_for_nodes")  # to the millisecond: the survivors' stop
    return "waiting_for_nodes"


def _attempt_end(attempt: Attempt) -> datetime.datetime | None:
    """The keeper's record of the end: its millisecond "ended" phase, else the attempt's ended_at."""
    return parse_phase(attempt.timeline.get("ended", "")) or parse_time(attempt.ended_at)


def _jobs_ended(attempt: Attempt) -> datetime.datetime | None:
    """When the last of the attempt's nodes saw its job end (the nodes' reports), if every one says so."""
    return parse_time(node_summary(attempt).last_ended_at)


def _fault_time(attempt: Attempt) -> datetime.datetime | None:
    """The fault that ended the attempt: the first of a node whose job ended before the keeper saw it and the
    moment it went quiet (compaction.summarize's quiet_since), else the keeper's fault_seen; None
    for an attempt that ended without a fault (or has not ended)."""
    seen = parse_phase(attempt.timeline.get("fault_seen", ""))
    if seen is None:
        return None
    summary = node_summary(attempt)  # of its reports, or the one kept once they were compacted
    first, quiet = parse_time(summary.first_ended_at), parse_phase(summary.quiet_since or "")
    return min([e for e in (first, quiet) if e is not None and e < seen], default=seen)


def _phase_seconds(attempt: Attempt) -> dict[str, float]:
    """The seconds of each category in the attempt's training span: of each phase, the most any node reports
    (the nodes run their saves, validations and compiles together)."""
    seconds: dict[str, float] = {}
    for phase, ms in (node_summary(attempt).phase_ms or {}).items():  # each phase's most of any node
        if PHASE_CATEGORIES.get(phase) is not None and ms > 0:
            seconds[phase] = ms / 1000
    by_category: dict[str, float] = {}
    for phase, value in seconds.items():
        by_category[PHASE_CATEGORIES[phase]] = by_category.get(PHASE_CATEGORIES[phase], 0.0) + value
    return by_category


def _counted_share(attempt: Attempt, following: Attempt | None) -> float:
    """The share of the attempt's steps that counted: all but those the next attempt re-ran. 1 when the steps
    are not known (the record lacks step_reached or a resumed step): nothing is called lost without a record."""
    if following is None or following.resumed_from_step is None or attempt.step_reached is None:
        return 1.0
    start = attempt.resumed_from_step or 0
    ran = attempt.step_reached - start
    if ran <= 0:
        return 1.0
    counted = following.resumed_from_step - start
    return min(1.0, max(0.0, counted / ran))
