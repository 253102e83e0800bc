"""The restart timeline: the phases the job keeper and the nodes record on each attempt (cluster_jobs/timeline.py),
kept through the job table, and what `clusterctl status` shows of them (the text under the attempts, the JSON's
"restarts"). The drills (tests/drills/) record them for real; here the record is written as the keeper leaves it."""

from __future__ import annotations

import dataclasses
import datetime
import json

from job_record_fakes import JOB, NOW, TINY, job_id_time

from cluster_jobs.node_states import NodeJobState
from cluster_jobs.records import node_report
from cluster_jobs.ssm_commands import Invocation
from cluster_jobs.table import Attempt, JobRecord, _from_item, _to_item
from cluster_jobs.timeline import phase_text, restart_seconds, with_node_phases
from clusterctl.jobs.view import format_record, record_json

FAULT = "node i-0b lost: gone (replaced): terminated"
BY = "autoscaling (EC2 Instance Terminate Successful: i-0b)"  # the keeper round's trigger


def restarted_record() -> JobRecord:
    first = Attempt(number=1, nodes=["i-0a", "i-0b"], rendezvous_host="10.0.1.10", started_at="2026-11-20T23:15:02Z",
                    ended_at="2026-11-20T23:20:00Z", end_reason=FAULT, step_reached=24,
                    fault_seen_by=BY,
                    timeline={"fault_seen": "2026-11-20T23:20:00.250Z", "ended": "2026-11-20T23:20:00.250Z",
                              "survivors_stopped": "2026-11-20T23:20:01.000Z"})
    second = Attempt(number=2, nodes=["i-0a", "i-0c"], rendezvous_host="10.0.1.10", started_at="2026-11-20T23:20:01Z",
                     resumed_from_step=20, resumed_from_tier="local",
                     timeline={"started": "2026-11-20T23:20:01.500Z"})
    return JobRecord(job_id=JOB, module="training", config=TINY, config_text="", overrides=[], resume_from="",
                     nodes=2, gpus_per_node=8, max_restarts=0, max_job_restarts=5, instance_type="p5.48xlarge",
                     checkpoint_dir=f"/fsx/checkpoints/{JOB}", state="running", created_at=job_id_time(JOB),
                     updated_at=job_id_time(JOB), attempts=[first, second])


def node(instance_id: str, attempt: int, **phases: str) -> NodeJobState:
    return NodeJobState(instance_id, "running", None, 21, 2.5, None, None, None, attempt=attempt, phases=phases)


def test_the_next_attempts_phases_are_each_the_latest_node_and_ignore_other_attempts():
    record = restarted_record()
    merged = with_node_phases(record.attempts[1], [
        node("i-0a", 2, started="2026-11-20T23:20:01.600Z", rendezvous_done="2026-11-20T23:20:04.000Z",
             checkpoint_loaded="2026-11-20T23:20:05.000Z", compiled="2026-11-20T23:20:09.000Z",
             first_step="2026-11-20T23:20:09.500Z"),
        node("i-0c", 2, started="2026-11-20T23:20:02.100Z", rendezvous_done="2026-11-20T23:20:04.200Z",
             checkpoint_loaded="2026-11-20T23:20:05.900Z"),  # no compile or step line from it yet
        node("i-0b", 1, first_step="2026-11-20T23:30:00.000Z"),  # a status of the old attempt: not this one's
    ])
    assert merged.timeline == {
        "started": "2026-11-20T23:20:02.100Z", "rendezvous_done": "2026-11-20T23:20:04.200Z",
        "checkpoint_loaded": "2026-11-20T23:20:05.900Z", "compiled": "2026-11-20T23:20:09.000Z",
        "first_step": "2026-11-20T23:20:09.500Z"}


def test_status_shows_each_phase_in_seconds_from_the_fault_and_the_table_keeps_them():
    record = restarted_record()
    second = with_node_phases(record.attempts[1], [node(
        "i-0c", 2, started="2026-11-20T23:20:02.100Z", rendezvous_done="2026-11-20T23:20:04.200Z",
        checkpoint_loaded="2026-11-20T23:20:05.900Z", compiled="2026-11-20T23:20:09.000Z",
        first_step="2026-11-20T23:20:09.550Z")])
    record.attempts[1] = second
    stored = _from_item(_to_item(record))  # what the job table holds and gives back
    assert stored.attempts[0].timeline == record.attempts[0].timeline
    assert stored.attempts[0].fault_seen_by == BY
    assert stored.attempts[1].timeline == second.timeline

    assert format_record(stored).splitlines()[-1] == (
        f"restart 1 -> 2: fault seen by {BY}; ended +0.0 s, survivors stopped +0.8 s, started +1.9 s, "
        "rendezvous done +4.0 s, checkpoint loaded (local) +5.7 s, compiled +8.8 s, first step +9.3 s")
    (restart,) = record_json(stored, NOW)["restarts"]
    assert restart == {"attempt": 2, "fault": FAULT, "fault_seen_by": BY, "tier": "local",
                       "resumed_from_step": 20, "compile_cache": None,  # no node reported one (no compile)
                       "seconds_from_fault": {"fault_seen": 0.0, "ended": 0.0, "survivors_stopped": 0.75,
                                              "started": 1.85, "rendezvous_done": 3.95, "checkpoint_loaded": 5.65,
                                              "compiled": 8.75, "first_step": 9.3}}


def answer(instance_id: str, compile_cache: object) -> NodeJobState:
    """A node's status answer for attempt 2, as the jobs document returns it."""
    payload = {"jobId": JOB, "state": "running", "attempt": 2, "lastStep": 21, "compileCache": compile_cache,
               "phases": {"compiled": "2026-11-20T23:20:09.000Z"}}
    return NodeJobState.from_invocation(Invocation(instance_id, "Success", 0, json.dumps(payload), ""))


def test_status_says_on_how_many_nodes_the_restart_compiled_warm_from_the_snapshot():
    record = restarted_record()
    states = [answer("i-0a", "cold"), answer("i-0c", "snapshot")]
    assert [s.compile_cache for s in states] == ["cold", "snapshot"]
    assert answer("i-0d", "lukewarm").compile_cache is None and answer("i-0d", None).compile_cache is None
    record.attempts[1] = dataclasses.replace(with_node_phases(record.attempts[1], states),
                                             node_reports=[node_report(s) for s in states])
    stored = _from_item(_to_item(record))  # the job table keeps each node's report
    assert [r.compile_cache for r in stored.attempts[1].node_reports] == ["cold", "snapshot"]
    assert "compiled (warm on 1 of 2 nodes) +8.8 s" in format_record(stored).splitlines()[-1]
    (restart,) = record_json(stored, NOW)["restarts"]
    assert restart["compile_cache"] == {"snapshot": 1, "nodes": 2}


def test_an_attempt_without_a_fault_has_no_restart_timeline():
    record = restarted_record()
    record.attempts[0].timeline = {}  # a record written before timelines, or an attempt that ended without one
    assert restart_seconds(record, 1) is None and restart_seconds(record, 2) is None
    assert "restart 1 -> 2" not in format_record(record)
    assert record_json(record, NOW)["restarts"] == []


def test_phase_times_are_utc_to_the_millisecond():
    when = datetime.datetime(2026, 11, 27, 5, 1, 2, 345678, tzinfo=datetime.timezone(datetime.timedelta(hours=2)))
    assert phase_text(when) == "2026-11-27T03:01:02.345Z"
