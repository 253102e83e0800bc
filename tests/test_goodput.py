"""cluster_jobs/goodput.py: a job's wall time split into productive training and badput by cause, on records
built by hand (the keeper drill's own record: tests/drills/test_job_keeper_drill.py)."""

import datetime
import json

import pytest

from cluster_jobs.goodput import CATEGORIES, FOLDED, PRODUCTIVE, job_goodput, summary_line
from cluster_jobs.table import Attempt, JobRecord, NodeReport

T0 = datetime.datetime(2026, 11, 20, 23, 0, 0, tzinfo=datetime.UTC)


def at(seconds: float, ms: bool = False) -> str:
    """T0 + seconds as the record writes it: the keeper's second ("...Z") or a phase's millisecond."""
    when = T0 + datetime.timedelta(seconds=seconds)
    if ms:
        return when.strftime("%Y-%m-%dT%H:%M:%S") + f".{when.microsecond // 1000:03d}Z"
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def phases(**seconds: float) -> dict[str, str]:
    return {name: at(s, ms=True) for name, s in seconds.items()}


def record(attempts, *, state="succeeded", ended=None) -> JobRecord:
    return JobRecord(job_id="j-20261120-230000-ab12", module="training", config="c.toml", config_text="",
                     overrides=[], resume_from="", nodes=2, gpus_per_node=8, max_restarts=0, max_job_restarts=5,
                     instance_type="p5.48xlarge", checkpoint_dir="/fsx/c", state=state, created_at=at(0),
                     updated_at=at(0), attempts=attempts, ended_at=None if ended is None else at(ended))


def three_attempts() -> list[Attempt]:
    """Attempt 1 trains steps 1..100 and loses a node (its job ends at 290 s, the keeper sees it at 300 s);
    attempt 2 resumes from step 80 (20 steps lost), trains to 150 and is cut at 600 s; attempt 3 resumes from
    150 (nothing lost) and finishes step 200; its nodes' jobs end at 1000 s, the keeper records it at 1010 s."""
    first = Attempt(number=1, nodes=["i-a", "i-b"], rendezvous_host="10.0.0.1", started_at=at(2), ended_at=at(300),
                    step_reached=100, resumed_from_step=0,
                    node_reports=[NodeReport("i-a", "failed", ended_at=at(290)), NodeReport("i-b", "gone")],
                    timeline=phases(started=5, rendezvous_done=20, checkpoint_loaded=30, compiled=70, first_step=71,
                                    fault_seen=300, ended=300, survivors_stopped=304))
    second = Attempt(number=2, nodes=["i-a", "i-c"], rendezvous_host="10.0.0.1", started_at=at(340),
                     ended_at=at(600), step_reached=150, resumed_from_step=80,
                     timeline=phases(started=341, first_step=400, fault_seen=600, ended=600))
    third = Attempt(number=3, nodes=["i-a", "i-d"], rendezvous_host="10.0.0.1", started_at=at(610),
                    ended_at=at(1010), step_reached=200, resumed_from_step=150,
                    node_reports=[NodeReport("i-a", "succeeded", ended_at=at(1000)),
                                  NodeReport("i-d", "succeeded", ended_at=at(999))],
                    timeline=phases(started=611, first_step=650))
    return [first, second, third]


def test_every_second_since_the_submit_goes_to_one_category():
    goodput = job_goodput(record(three_attempts(), ended=1010), T0)
    assert goodput is not None
    seconds = goodput.seconds
    assert list(seconds) == list(CATEGORIES)
    assert goodput.wall_s == 1010
    assert sum(seconds.values()) == pytest.approx(goodput.wall_s, rel=0.01)
    assert seconds["waiting_for_nodes"] == pytest.approx(2 + 40 + 10)  # the submit; 300->340; 600->610
    assert seconds["startup"] == pytest.approx(18)  # attempt 1's start (2 s) to its rendezvous (20 s)
    assert seconds["checkpoint_load"] == pytest.approx(10)
    assert seconds["compile"] == pytest.approx(41)  # 30 -> 71: the first forward and backward compile
    assert seconds["restart"] == pytest.approx(60 + 40)  # 340 -> 400, 610 -> 650
    # attempt 1: its span 71 -> 290 (the first node's job ended: the fault), 80 of 100 steps counted
    # attempt 2: 400 -> 600, all 70 steps counted (attempt 3 resumed from its last); attempt 3: 650 -> 1000
    assert seconds["lost_progress"] == pytest.approx(219 * 0.2)
    assert seconds[PRODUCTIVE] == pytest.approx(219 * 0.8 + 200 + 350)
    assert seconds["failure_detection"] == pytest.approx(10 + 0)  # 290 -> 300; 600 -> 600
    assert seconds["job_end"] == pytest.approx(10)  # the nodes' jobs ended to the keeper's record
    assert goodput.goodput_pct == pytest.approx(100 * seconds[PRODUCTIVE] / 1010)
    assert goodput.to_json()["folded"] == FOLDED


def test_the_largest_causes_come_first_in_the_status_line():
    goodput = job_goodput(record(three_attempts(), ended=1010), T0)
    line = summary_line(goodput)
    assert line.startswith(f"goodput {goodput.goodput_pct:.1f}% of 0:16:50 (")
    assert line.endswith("(restart 9.9%, waiting for nodes 5.1%, lost progress 4.3%)")


def test_an_active_job_counts_up_to_now_in_what_it_is_doing():
    attempts = three_attempts()[:2]
    restarting = attempts[1]
    attempts[1] = Attempt(number=2, nodes=restarting.nodes, rendezvous_host=restarting.rendezvous_host,
                          started_at=restarting.started_at, timeline=phases(started=341, rendezvous_done=360))
    now = T0 + datetime.timedelta(seconds=380)
    goodput = job_goodput(record(attempts, state="running"), now)
    assert goodput.wall_s == 380
    assert goodput.seconds["restart"] == pytest.approx(40)  # 340 -> now, no first step yet
    assert sum(goodput.seconds.values()) == pytest.approx(380)
    # no next attempt resumed yet: attempt 1's steps are not called lost without a record
    assert goodput.seconds["lost_progress"] == 0


def test_clocks_that_disagree_never_make_a_negative_or_overlapping_stretch():
    attempts = three_attempts()
    # the second attempt's node clock is behind the keeper's: its first step "before" its start
    attempts[1].timeline["first_step"] = at(330, ms=True)
    goodput = job_goodput(record(attempts, ended=1010), T0)
    assert min(goodput.seconds.values()) >= 0
    assert sum(goodput.seconds.values()) == pytest.approx(1010)
    assert goodput.seconds["restart"] == pytest.approx(0 + 40)  # attempt 2's ended at once


def test_a_record_without_steps_counts_nothing_as_lost():
    attempts = three_attempts()
    attempts[0].step_reached = None
    goodput = job_goodput(record(attempts, ended=1010), T0)
    assert goodput.seconds["lost_progress"] == 0
    assert sum(goodput.seconds.values()) == pytest.approx(1010)


def test_status_prints_the_line_and_its_json_every_category_in_seconds():
    from clusterctl.jobs.view import format_record, record_json

    done = record(three_attempts(), ended=1010)
    goodput = job_goodput(done, T0)
    assert format_record(done, now=T0).splitlines()[-1] == summary_line(goodput)
    shown = record_json(done, T0)["goodput"]
    assert set(shown["seconds"]) == set(CATEGORIES)
    assert sum(shown["seconds"].values()) == pytest.approx(shown["wall_s"], rel=0.01)
    assert shown["goodput_pct"] == round(goodput.goodput_pct, 2)


def test_top_shows_the_running_jobs_goodput():
    from rich.console import Console

    from clusterctl.watch.collect import ClusterView, JobView, with_record
    from clusterctl.watch.view import render

    now = T0 + datetime.timedelta(seconds=700)
    running = record(three_attempts(), state="running")
    running.attempts[2].ended_at = None
    running.attempts[2].node_reports = []
    job = with_record(JobView("j-1", 160, 200, 2.5, 1e6, 40.0, 1.0, 1.0, 1.0, 0, 40.0, now), running, now)
    assert job.goodput is not None and job.goodput.wall_s == 700
    console = Console(width=200)
    with console.capture() as capture:
        console.print(render(ClusterView(stack_name="S", instance_type="p5.48xlarge", node_count=2, collected_at=now,
                                         nodes=[], job=job, group_created_at=now, cost_usd=1.0,
                                         usd_per_node_hour=55.0, job_source="job table")))
    assert summary_line(job.goodput) in capture.get()


def with_phase_ms(attempt: Attempt, *reports: NodeReport) -> Attempt:
    attempt.node_reports = list(reports)
    return attempt


def test_the_phase_seconds_move_out_of_productive_into_their_categories():
    attempts = three_attempts()
    # attempt 3 (650 -> 1000: all counted): its nodes saved, validated, exported, waited and recompiled together;
    # each category takes the most any node reports, not their sum
    with_phase_ms(attempts[2],
                  NodeReport("i-a", "succeeded", ended_at=at(1000),
                             phase_ms={"checkpoint_save": 30_000, "validation": 12_000, "export": 8_000,
                                       "data_wait": 5_000, "compile": 4_000}),
                  NodeReport("i-d", "succeeded", ended_at=at(999), phase_ms={"checkpoint_save": 25_000}))
    # attempt 1 (71 -> 290, 80 of its 100 steps counted): the phases first, then the rest split by steps
    attempts[0].node_reports[0].phase_ms = {"checkpoint_save": 19_000}
    goodput = job_goodput(record(attempts, ended=1010), T0)
    seconds = goodput.seconds
    assert sum(seconds.values()) == pytest.approx(goodput.wall_s) == 1010
    assert seconds["checkpoint_save"] == pytest.approx(30 + 19)
    assert seconds["validation_and_export"] == pytest.approx(20)
    assert seconds["data_wait"] == pytest.approx(5)
    assert seconds["compile"] == pytest.approx(41 + 4)  # the first start's, and the recompile after its first step
    assert seconds["lost_progress"] == pytest.approx((219 - 19) * 0.2)
    assert seconds[PRODUCTIVE] == pytest.approx((219 - 19) * 0.8 + 200 + 350 - 59)
    assert goodput.folded == {} and goodput.to_json()["folded"] == {}
    assert job_goodput(record(three_attempts(), ended=1010), T0).folded == FOLDED  # no record: still folded


def test_phase_seconds_beyond_the_span_are_scaled_to_it():
    attempts = three_attempts()
    with_phase_ms(attempts[1], NodeReport("i-a", "failed", phase_ms={"checkpoint_save": 300_000, "compile": 100_000}))
    goodput = job_goodput(record(attempts, ended=1010), T0)
    # attempt 2's span is 400 -> 600: its 400 s of phases are scaled to 200 s, 3 to 1
    assert goodput.seconds["checkpoint_save"] == pytest.approx(150)
    assert goodput.seconds["compile"] == pytest.approx(41 + 50)
    assert min(goodput.seconds.values()) >= 0
    assert sum(goodput.seconds.values()) == pytest.approx(1010)


def test_the_silence_of_running_nodes_before_the_fault_was_seen_is_failure_detection():
    attempts = three_attempts()
    # attempt 2 hangs at 550: its nodes, still running, last printed then; the keeper saw the fault at 600
    attempts[1].node_reports = [NodeReport("i-a", "running", last_output_at=at(550.25, ms=True)),
                                NodeReport("i-c", "running", last_output_at=at(549, ms=True))]
    goodput = job_goodput(record(attempts, ended=1010), T0)
    assert goodput.seconds["failure_detection"] == pytest.approx(10 + 49.75)
    assert goodput.seconds[PRODUCTIVE] == pytest.approx(219 * 0.8 + 150.25 + 350)
    assert sum(goodput.seconds.values()) == pytest.approx(1010)
    # a node that does not say when it last printed: the keeper's fault_seen, as before
    attempts[1].node_reports[1].last_output_at = None
    assert job_goodput(record(attempts, ended=1010), T0).seconds["failure_detection"] == pytest.approx(10)


def test_a_hung_nodes_last_progress_is_the_fault_whatever_its_running_peer_printed_since():
    attempts = three_attempts()
    # attempt 2: a rank of i-c stops at 540 (its last progress); its supervisor's watch stops the job at 560; i-a,
    # still running, printed its peer's errors and its supervisor's line until 565; the keeper sees it at 600
    attempts[1].node_reports = [
        NodeReport("i-a", "running", last_output_at=at(565, ms=True)),
        NodeReport("i-c", "hung", ended_at=at(560), hang_origin="here", quiet_since=at(540.5, ms=True))]
    goodput = job_goodput(record(attempts, ended=1010), T0)
    assert goodput.seconds["failure_detection"] == pytest.approx(10 + 59.5)
    assert sum(goodput.seconds.values()) == pytest.approx(1010)
    # a supervisor that predates quietSince: the job's end (560), the first of the nodes' ends
    attempts[1].node_reports[1].quiet_since = None
    assert job_goodput(record(attempts, ended=1010), T0).seconds["failure_detection"] == pytest.approx(10 + 40)


def test_a_job_the_keeper_stopped_runs_to_its_nodes_end_and_their_stop_save_is_checkpoint_save():
    """A Capacity Block's end: the keeper records the job cancelled at 500 s, its nodes save and end at 530 s."""
    stopped = Attempt(number=1, nodes=["i-a", "i-b"], rendezvous_host="10.0.0.1", started_at=at(2),
                      ended_at=at(500), step_reached=80, resumed_from_step=0,
                      node_reports=[
                          NodeReport("i-a", "cancelled", ended_at=at(530), phase_ms={"checkpoint_save": 28_000}),
                          NodeReport("i-b", "cancelled", ended_at=at(529), phase_ms={"checkpoint_save": 27_500})],
                      timeline=phases(started=5, rendezvous_done=20, checkpoint_loaded=30, compiled=70, first_step=71))
    goodput = job_goodput(record([stopped], state="cancelled", ended=500), T0)
    assert goodput.wall_s == 530
    assert goodput.seconds["checkpoint_save"] == pytest.approx(28)
    assert goodput.seconds[PRODUCTIVE] == pytest.approx(530 - 71 - 28)
    assert goodput.seconds["failure_detection"] == 0 and goodput.seconds["job_end"] == 0
    assert sum(goodput.seconds.values()) == pytest.approx(530)


def test_the_record_keeps_the_seconds_as_milliseconds_and_reads_them_back():
    from cluster_jobs.node_states import NodeJobState
    from cluster_jobs.ssm_commands import Invocation
    from cluster_jobs.table import _from_item, _to_item

    answer = json.dumps({"state": "running", "phaseSeconds": {"checkpoint_save": 1.2345, "validation": 2,
                                                              "bogus": 1.0, "compile": float("inf")},
                         "lastOutputAt": "2026-11-20T23:00:01.250Z"})
    state = NodeJobState.from_invocation(Invocation("i-a", "Success", 0, answer + "\n", ""))
    assert state.phase_seconds == {"checkpoint_save": 1.2345, "validation": 2.0}
    assert state.dropped == ("phaseSeconds: 2 of 4 items not a known phase with a finite number of seconds in "
                             "0..31622400",)
    report = state.report()
    assert (report.phase_ms, report.last_output_at) == ({"checkpoint_save": 1234, "validation": 2000},
                                                        "2026-11-20T23:00:01.250Z")
    stored = record([with_phase_ms(three_attempts()[0], report)], state="running")
    assert _from_item(_to_item(stored)).attempts[0].node_reports[0] == report
