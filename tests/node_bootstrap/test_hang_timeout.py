"""The hang timeout the supervisor's watch learns from the trainer's step cadence (node_bootstrap/jobs/
progress.py), on a clock the test moves: the factor, the floor and the upper bound, and a restart's allowance.
The watch at work on real jobs is tests/node_bootstrap/test_job_hang.py."""

from __future__ import annotations

import json

from node_bootstrap.jobs.progress import MIN_INTERVALS, RESTART_MARKER, ProgressWatch


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def step_line(n):
    return json.dumps({"event": "step", "step": n}).encode() + b"\n"


def watch_with_steps(intervals_s, *, hang_s=1800.0, start_s=3600.0, floor_s=120.0):
    clock = Clock()
    watch = ProgressWatch(hang_s, start_s, floor_s=floor_s, clock=clock)
    clock.now += 500  # loading and compiling: the first step line's wait is no interval
    watch.observe(step_line(1))
    for i, interval in enumerate(intervals_s, start=2):
        clock.now += interval
        watch.observe(step_line(i))
    return watch, clock


def test_the_learned_timeout_is_the_factor_times_the_slowest_interval_between_floor_and_bound():
    watch, clock = watch_with_steps([20, 30, 25, 22])  # the slowest: 30 s
    assert watch.hang_timeout() == (150.0, "5 x the slowest step interval 30 s")
    clock.now += 149.9
    assert watch.overdue() is None
    clock.now += 0.1
    assert watch.overdue().startswith("no trainer step for 150 s (5 x the slowest step interval 30 s), waiting "
                                      "for a step (last step seen: 5 at ")
    # the slowest since the start, not of the last few: an interval that held a save keeps counting
    watch, _ = watch_with_steps([20, 30] + [2] * 50)
    assert watch.hang_timeout()[0] == 150.0
    # the floor and the upper bound
    assert watch_with_steps([2, 2, 2])[0].hang_timeout() == (120.0, "the floor, jobHangFloorSeconds, above 5 x "
                                                                     "the slowest step interval 2 s")
    assert watch_with_steps([400] * 3)[0].hang_timeout() == (
        1800.0, "the upper bound, jobHangTimeoutSeconds, below 5 x the slowest step interval 400 s")
    # a floor above the bound is the bound
    assert watch_with_steps([2, 2, 2], hang_s=60, floor_s=120)[0].hang_timeout()[0] == 60.0


def test_too_few_intervals_keep_the_upper_bound():
    watch, _ = watch_with_steps([2] * (MIN_INTERVALS - 1))
    assert watch.hang_timeout() == (1800.0, "the upper bound, jobHangTimeoutSeconds: too few steps seen to learn from")


def test_the_wait_for_the_first_step_after_a_restart_is_the_start_timeout_and_no_interval():
    watch, clock = watch_with_steps([2, 2, 2], floor_s=10)
    watch.observe(b"E1123 api.py:1002] " + RESTART_MARKER + b"1) local_rank: 3 (pid: 25725) of binary: python3\n")
    clock.now += 3599
    assert watch.overdue() is None  # the start timeout, not the learned 10 s
    watch.observe(step_line(5))
    assert watch.slowest_interval_s == 2 and watch.hang_timeout()[0] == 10.0
    clock.now += 10
    assert watch.overdue().startswith("no trainer step for 10 s (the floor, ")
