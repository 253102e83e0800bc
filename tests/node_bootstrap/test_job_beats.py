"""A stopped step found within a few step times (issue 45): the trainer's beats between its step lines, and its
data and staging waits reported as phases only when they run long; the hang watch (progress.py) reading them on
a clock the test moves; `status` still reading the step and loss from the step lines alone."""

from __future__ import annotations

import io
import json
import threading

import torch
from hang_watch_support import STEP_FLOOR_S, Run, beat, phase
from node_supervisor_support import make_settings, printing, run_job

from node_bootstrap.job_contract import BEAT_EVENT
from node_bootstrap.jobs.job_report import Rejections, beat_report, find_last_step
from node_bootstrap.jobs.progress import HANG_FACTOR

LOG_INTERVAL = 10  # run.log_interval_steps at 8B


def test_with_beats_a_stopped_step_is_hung_within_five_step_times_at_a_log_interval_of_ten():
    run = Run(log_interval=LOG_INTERVAL, beats=True).started()
    run.steps(30)
    run.wait(STEP_FLOOR_S - 0.5)
    assert run.hung is None
    run.wait(1)
    # step 31 printed no step line: its beat is the last step seen
    assert run.hung is not None and run.hung.startswith(
        "no trainer step for 20 s (the step floor, jobStepHangFloorSeconds, above 5 x the slowest of the recent "
        "step intervals 2 s), waiting for a step (last step seen: 31 at ")
    # slower steps: 5 x the step time, not 5 x ten of them
    run = Run(log_interval=LOG_INTERVAL, beats=True).started()
    run.steps(30, seconds=6)
    run.wait(HANG_FACTOR * 6 - 0.5)
    assert run.hung is None
    run.wait(1)
    assert run.hung is not None and run.hung.startswith("no trainer step for 30 s (5 x the slowest of the recent ")


def test_without_beats_the_cadence_is_that_of_ten_steps():
    """What the beats change: step lines alone at a log interval of 10 teach the watch 5 x 10 steps."""
    run = Run(log_interval=LOG_INTERVAL).started()
    run.steps(59)  # to step 60, a step line
    assert run.watch.hang_timeout()[0] == HANG_FACTOR * LOG_INTERVAL * 2.0
    run.wait(99)
    assert run.hung is None
    run.wait(2)
    assert run.hung is not None and run.hung.startswith("no trainer step for 100 s (5 x the slowest of the recent "
                                                        "step intervals 20 s)")


def test_beats_bring_no_false_alarm_for_saves_validations_recompiles_and_slow_waits():
    run = Run(log_interval=LOG_INTERVAL, beats=True).started()
    run.steps(25)
    run.during("checkpoint_save", 75)  # a blocking save, far longer than the step timeout (20 s)
    run.steps(4)
    run.wait(1)  # an async save's staging copy the next step waits for: past a second it is a save phase
    run.during("checkpoint_save", 40)
    run.steps(6)
    run.wait(1)  # the first read of a shard FSx imports lazily from S3
    run.during("data_wait", 90, bound_s=300)
    run.steps(5)
    run.during("validation", 100)
    run.during("compile", 60)
    run.steps(10)
    assert run.hung is None and run.step == 51
    assert max(run.watch.recent) == 2.0 and run.watch.hang_timeout()[0] == STEP_FLOOR_S


def test_a_stuck_read_is_hung_at_the_data_wait_bound():
    run = Run(log_interval=LOG_INTERVAL, beats=True).started()
    run.steps(24)
    run.wait(1)
    run.feed(phase("data_wait", "start", bound_s=300))
    run.wait(299)
    assert run.hung is None
    run.wait(2)
    assert run.hung is not None and run.hung.startswith(
        "the trainer's data_wait phase did not end in 300 s (the phase's own bound) (last step seen: 25 at ")


MALFORMED_BEATS = [
    {"event": "beat", "step": "12"},
    {"event": "beat", "step": -1},
    {"event": "beat", "step": True},
    {"event": "beat", "step": 12.0},
    {"event": "beat", "step": 10**12},
    {"event": "beat", "step": None},
    {"event": "beat"},
]


def test_malformed_beats_are_dropped_and_counted_and_are_no_progress():
    rejected = Rejections()
    run = Run(log_interval=LOG_INTERVAL, beats=True, rejected=rejected).started()
    run.steps(25)
    for record in MALFORMED_BEATS:  # one every 2 s: would they count, the step timeout would never pass
        run.wait(2)
        run.feed(json.dumps(record).encode() + b"\n")
    run.wait(STEP_FLOOR_S - 2 * len(MALFORMED_BEATS) + 1)
    assert run.hung is not None and "(last step seen: 26 at " in run.hung
    assert rejected.as_dict() == {"beatRecord": len(MALFORMED_BEATS)}


def test_status_reads_the_step_and_loss_from_the_step_lines_alone(tmp_path):
    """The real supervisor and `status`, in-process: beats after the last step line change neither."""
    lines = "".join(line.decode() for line in (
        phase("checkpoint_load", "start"), phase("checkpoint_load", "end"),
        b'[rank0]:{"event": "step", "step": 10, "loss": 2.25}\n', *(beat(n) for n in range(11, 20)),
        json.dumps(MALFORMED_BEATS[0]).encode() + b"\n",
    ))
    status = run_job(make_settings(tmp_path, hang_timeout_s=600), printing(lines))
    assert status["state"] == "succeeded"
    assert (status["lastStep"], status["lastLoss"]) == (10, 2.25)
    assert status["rejectedValues"] == {"beatRecord": 1}
    assert find_last_step(lines) == {"event": "step", "step": 10, "loss": 2.25}


# --- the trainer's side ---------------------------------------------------------------------------------------


class Lines(io.StringIO):
    """A stdout that says when a line containing `awaited` has been written."""

    def __init__(self, awaited: str):
        super().__init__()
        self.awaited, self.seen = awaited, threading.Event()

    def write(self, text: str) -> int:
        written = super().write(text)
        if self.awaited in text:
            self.seen.set()
        return written


def test_the_trainer_beats_what_the_watch_reads():
    from training.phases import BEAT, PhaseReporter

    assert BEAT == BEAT_EVENT  # training cannot import the contract: the two are kept equal here
    out = io.StringIO()
    PhaseReporter(True, out).beat(41)
    rejected = Rejections()
    assert beat_report(json.loads(out.getvalue()), rejected) == 41 and not rejected.as_dict()
    quiet = io.StringIO()
    PhaseReporter(False, quiet).beat(41)  # not local rank 0, or no JSON lines
    assert quiet.getvalue() == ""


class StuckSource:
    """A batch source whose read of `stuck_step` blocks until released (a read stuck on FSx)."""

    def __init__(self, stuck_step: int):
        self.stuck_step, self.released = stuck_step, threading.Event()

    def get(self, step: int, micro_step: int):
        if step == self.stuck_step:
            self.released.wait()
        x = torch.full((1, 4), step)
        return x, x + 1


def test_a_stuck_read_prints_a_data_wait_phase_with_its_bound_and_the_watch_holds_it(monkeypatch):
    from training import phases
    from training.data.batches import Prefetcher

    monkeypatch.setattr(phases, "SLOW_WAIT_S", 0.05)  # the threshold (1 s) is not what this test is about
    out = Lines('"state": "start"')
    reporter = phases.PhaseReporter(True, out)
    source = StuckSource(stuck_step=1)
    got = []

    def step_loop():
        with Prefetcher(source, start_step=0, grad_accum_steps=1, device="cpu", depth=1) as prefetcher:
            for _ in range(2):
                with reporter.data_wait():
                    got.append(int(prefetcher.next_step()[0][0][0, 0]))

    loop = threading.Thread(target=step_loop, daemon=True)
    loop.start()
    try:
        assert out.seen.wait(timeout=60), "no data_wait start while the read was stuck"
        (record,) = [json.loads(line) for line in out.getvalue().splitlines()]
        assert record == {"event": "phase", "phase": "data_wait", "state": "start", "bound_s": phases.DATA_WAIT_BOUND_S}
        # the supervisor, fed what the trainer printed one second after its last step
        run = Run(log_interval=LOG_INTERVAL, beats=True).started()
        run.steps(24)
        run.wait(1)
        run.feed(out.getvalue().encode())
        run.wait(phases.DATA_WAIT_BOUND_S - 1)
        assert run.hung is None
        run.wait(2)
        assert run.hung is not None and run.hung.startswith("the trainer's data_wait phase did not end in 300 s")
    finally:
        source.released.set()
        loop.join(timeout=60)
    assert got == [0, 1]  # the read came back: the wait ended, and so did its phase
    states = [json.loads(line)["state"] for line in out.getvalue().splitlines()]
    assert states == ["start", "end"]


def test_a_wait_shorter_than_the_threshold_prints_nothing(monkeypatch):
    from training import phases
    from training.data.batches import Prefetcher

    monkeypatch.setattr(phases, "SLOW_WAIT_S", 60.0)  # far beyond the batches a ready source hands over
    out = io.StringIO()
    reporter = phases.PhaseReporter(True, out)
    with Prefetcher(StuckSource(stuck_step=-1), start_step=0, grad_accum_steps=1, device="cpu") as prefetcher:
        for _ in range(5):
            with reporter.data_wait(), reporter.staging_wait():
                prefetcher.next_step()
    assert out.getvalue() == ""


def test_beat_report_reads_only_an_int_step_in_range():
    rejected = Rejections()
    assert [beat_report(r, rejected) for r in MALFORMED_BEATS] == [None] * len(MALFORMED_BEATS)
    assert [beat_report({"event": "beat", "step": n}, rejected) for n in (0, 10**12 - 1)] == [0, 10**12 - 1]
    assert rejected.as_dict() == {"beatRecord": len(MALFORMED_BEATS)}
