"""A silent hang in seconds without false alarms (issue 45): the hang watch (progress.py) with the trainer's phase
records, on a clock the test moves and lines the test feeds, as the supervisor's output thread feeds them; the
records' schema (job_report.phase_report); and the trainer's side (training/phases.py) printing what the watch
reads."""

from __future__ import annotations

import io
import json

import pytest
from hang_watch_support import FLOOR_S, START_S, STEP_FLOOR_S, STEP_S, Run, phase
from node_supervisor_support import make_settings, printing, run_job

from node_bootstrap.job_contract import PHASE_NAMES
from node_bootstrap.jobs.job_report import PhaseReport, Rejections, phase_report
from node_bootstrap.jobs.progress import HANG_FACTOR, MIN_INTERVALS, RECENT_INTERVALS, RESTART_MARKER


def test_a_blocking_save_a_validation_and_a_recompile_longer_than_many_steps_are_no_hang():
    run = Run().started()
    run.steps(10)
    assert run.watch.hang_timeout() == (STEP_FLOOR_S, "the step floor, jobStepHangFloorSeconds, above 5 x the "
                                                      "slowest of the recent step intervals 2 s")
    run.during("checkpoint_save", 75)  # each far longer than the step timeout (20 s) ...
    run.steps(5)
    run.during("validation", 100)  # ... and the first of its kind: the safety net, jobHangFloorSeconds
    run.steps(5)
    run.wait(1)  # a recompile in the middle of a step, its lazy backward after it
    run.during("compile", 60)
    run.during("compile", 50)
    run.steps(5)
    run.during("checkpoint_save", 200)  # seen before (75 s): 5 x 75 s now, above the safety net
    run.steps(5)
    assert run.hung is None and run.step == 31
    # the intervals that held a phase taught the step cadence nothing
    assert max(run.watch.recent) == STEP_S and run.watch.hang_timeout()[0] == STEP_FLOOR_S


def test_a_step_that_stops_is_hung_within_seconds_of_the_cadence():
    run = Run().started()
    run.steps(10)
    run.wait(STEP_FLOOR_S + 1)
    assert run.hung is not None and run.hung.startswith(
        "no trainer step for 20 s (the step floor, jobStepHangFloorSeconds, above 5 x the slowest of the recent "
        "step intervals 2 s), waiting for a step (last step seen: 11 at ")
    # slower steps: the cadence, not the floor
    run = Run().started()
    run.steps(10, seconds=6)
    run.wait(HANG_FACTOR * 6 - 0.5)
    assert run.hung is None
    run.wait(1)
    assert run.hung is not None and run.hung.startswith("no trainer step for 30 s (5 x the slowest of the recent ")


def test_the_cadence_is_recent_steps_outside_phases():
    run = Run().started()
    run.steps(5, seconds=15)  # a slow start: 5 x 15 s
    assert run.watch.hang_timeout()[0] == 75
    run.steps(RECENT_INTERVALS)  # the window forgets it
    assert run.watch.hang_timeout()[0] == STEP_FLOOR_S


def test_too_few_steps_outside_phases_get_the_safety_net():
    run = Run().started()
    run.steps(MIN_INTERVALS - 1)
    assert run.watch.hang_timeout() == (FLOOR_S, "the safety net, jobHangFloorSeconds: too few steps outside phases "
                                                 "seen to learn from")
    run.wait(FLOOR_S - 1)
    assert run.hung is None
    run.wait(1)
    assert run.hung is not None


def test_a_phase_past_its_own_bound_is_hung():
    run = Run().started()
    run.steps(10)
    run.feed(phase("checkpoint_save", "start", bound_s=45))
    run.wait(44.5)
    assert run.hung is None
    run.wait(1)
    assert run.hung is not None and run.hung.startswith(
        "the trainer's checkpoint_save phase did not end in 45 s (the phase's own bound) (last step seen: 11 at ")


def test_a_phase_without_a_bound_is_held_to_its_longest_run_or_the_safety_net():
    run = Run().started()
    run.steps(10)
    run.during("validation", 30)
    run.steps(5)
    run.feed(phase("validation", "start"))  # 5 x 30 s = 150 s
    run.wait(149)
    assert run.hung is None
    run.wait(2)
    assert run.hung is not None and "validation phase did not end in 150 s (5 x the longest validation 30 s" in run.hung
    # the first of its kind: jobHangFloorSeconds
    run = Run().started()
    run.steps(10)
    run.feed(phase("export", "start"))
    run.wait(FLOOR_S + 1)
    assert run.hung is not None and "export phase did not end in 120 s (the safety net, jobHangFloorSeconds: no " \
                                    "bound given and no export seen before)" in run.hung


def test_nested_phases_and_a_step_that_ends_what_is_open():
    run = Run().started()
    run.steps(10)
    run.feed(phase("validation", "start", bound_s=100))
    run.wait(60)
    run.during("compile", 90)  # a recompile inside the validation: the compile's bound (the safety net, 120 s)
    run.wait(99)  # back in the validation: its bound starts again
    assert run.hung is None
    run.feed(phase("checkpoint_save", "start", bound_s=600))  # its end record is lost ...
    run.steps(1)  # ... and the next step line ends it: the step cadence again
    run.wait(STEP_FLOOR_S + 1)
    assert run.hung is not None and run.hung.startswith("no trainer step for 20 s")


def test_before_the_first_step_phases_never_shorten_the_start_timeout():
    run = Run()
    run.during("checkpoint_load", 1)
    run.feed(phase("compile", "start", bound_s=10))
    run.wait(START_S - 60)  # a slow cold compile: the start timeout, not the compile's 10 s
    assert run.hung is None
    run.feed(phase("compile", "end"))
    run.wait(50)
    assert run.hung is None
    run.wait(20)
    assert run.hung is not None and "the start timeout, jobStartTimeoutSeconds" in run.hung


def test_a_torchrun_restart_closes_the_open_phases_and_gives_the_start_timeout():
    run = Run().started()
    run.steps(10)
    run.feed(phase("checkpoint_save", "start", bound_s=30))
    run.feed(b"E1123 api.py:1002] " + RESTART_MARKER + b"1) local_rank: 3 (pid: 25725) of binary: python3\n")
    run.wait(START_S - 10)  # not the save's 30 s: the restarted workers load and compile
    assert run.hung is None
    run.steps(1)
    run.wait(STEP_FLOOR_S + 1)
    assert run.hung is not None and run.hung.startswith("no trainer step for 20 s")


def test_a_trainer_without_phase_records_keeps_the_old_bounds():
    run = Run()
    run.steps(10)  # the first step's wait is the start timeout; no phase records
    assert not run.watch.phase_aware
    assert run.watch.hang_timeout()[0] == FLOOR_S  # 5 x 2 s, below the jobHangFloorSeconds floor
    run.wait(FLOOR_S - 1)
    assert run.hung is None


MALFORMED = [
    {"event": "phase", "phase": "nap", "state": "start"},  # an unknown name
    {"event": "phase", "phase": "compile", "state": "begin"},  # an unknown state
    {"event": "phase", "phase": "compile", "state": "start", "bound_s": 0},
    {"event": "phase", "phase": "compile", "state": "start", "bound_s": -5},
    {"event": "phase", "phase": "compile", "state": "start", "bound_s": True},
    {"event": "phase", "phase": "compile", "state": "start", "bound_s": "60"},
    {"event": "phase", "phase": "compile", "state": "start", "bound_s": 1e9},
    {"event": "phase", "phase": ["compile"], "state": "start"},
    {"event": "phase", "state": "start"},
]


def test_malformed_phase_records_are_dropped_and_counted_and_change_nothing():
    rejected = Rejections()
    run = Run(rejected=rejected).started()
    run.steps(10)
    for record in MALFORMED:
        run.feed(json.dumps(record).encode() + b"\n")
    run.feed(b'{"event": "phase", "phase": "compile", "state": "start", "bound_s": NaN}\n')
    run.feed(b'{"event": "phase", "phase": "compile", "state": "start", "bound_s": Infinity}\n')
    assert rejected.as_dict() == {"phaseRecord": len(MALFORMED) + 2}
    run.wait(STEP_FLOOR_S + 1)  # no phase was opened: the step cadence still holds
    assert run.hung is not None and run.hung.startswith("no trainer step for 20 s")
    # an old trainer's watch is not switched to the phase bounds by a malformed record either
    old = Run()
    old.feed(json.dumps(MALFORMED[0]).encode() + b"\n")
    assert not old.watch.phase_aware


@pytest.mark.parametrize("record, expected", [
    ({"event": "phase", "phase": "validation", "state": "start", "bound_s": 300},
     PhaseReport("validation", "start", 300.0)),
    ({"event": "phase", "phase": "checkpoint_save", "state": "end"}, PhaseReport("checkpoint_save", "end", None)),
    ({"event": "phase", "phase": "compile", "state": "start", "bound_s": 2.5}, PhaseReport("compile", "start", 2.5)),
])
def test_a_valid_phase_record_is_read(record, expected):
    rejected = Rejections()
    assert phase_report(record, rejected) == expected and not rejected.as_dict()


def test_the_supervisor_counts_malformed_phase_records_in_the_status(tmp_path):
    """The real supervisor, in-process: its watch reads the job's lines, the status records what it dropped."""
    lines = "".join(json.dumps(r) + "\n" for r in (
        {"event": "phase", "phase": "checkpoint_load", "state": "start"},
        {"event": "phase", "phase": "checkpoint_load", "state": "end"},
        *MALFORMED[:3],
        {"event": "step", "step": 1, "loss": 2.0},
    ))
    status = run_job(make_settings(tmp_path, hang_timeout_s=600), printing(lines))
    assert status["state"] == "succeeded"
    assert status["rejectedValues"] == {"phaseRecord": 3}


# --- the trainer's side ---------------------------------------------------------------------------------------


def test_the_trainer_prints_the_records_the_watch_reads():
    from training.phases import PHASES, PhaseReporter

    assert PHASES == PHASE_NAMES  # training cannot import the contract: the two lists are kept equal here
    out = io.StringIO()
    reporter = PhaseReporter(True, out)
    with pytest.raises(RuntimeError), reporter.phase("checkpoint_save", bound_s=45):
        raise RuntimeError("a failed save still ends its phase")
    rejected = Rejections()
    reports = [phase_report(json.loads(line), rejected) for line in out.getvalue().splitlines()]
    assert reports == [PhaseReport("checkpoint_save", "start", 45.0), PhaseReport("checkpoint_save", "end", None)]
    quiet = io.StringIO()
    with PhaseReporter(False, quiet).phase("validation"):  # not local rank 0, or no JSON lines
        pass
    assert quiet.getvalue() == ""


def test_a_recompile_is_a_compile_phase():
    import torch

    from training.phases import PhaseReporter

    out = io.StringIO()
    reporter = PhaseReporter(True, out)
    fn = torch.compile(lambda x: x * 2 + 1, backend="eager", dynamic=False)
    with reporter.compiles():
        fn(torch.ones(3))
        fn(torch.ones(5))  # a new shape: a recompile
    fn(torch.ones(7))  # outside: no records, the callbacks are removed
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert records == [{"event": "phase", "phase": "compile", "state": s} for s in ("start", "end") * 2]
