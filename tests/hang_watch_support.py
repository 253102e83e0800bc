"""A trainer's output fed to the supervisor's hang watch (node_bootstrap/jobs/progress.py) as time passes on a
clock the test moves, as the supervisor's output thread feeds it (tests/node_bootstrap/test_job_phases.py,
test_job_beats.py)."""

from __future__ import annotations

import json

from node_bootstrap.jobs.progress import ProgressWatch

HANG_S, START_S, FLOOR_S, STEP_FLOOR_S = 1800.0, 3600.0, 120.0, 20.0
STEP_S = 2.0  # a P5 step at 8B: a few seconds


class Clock:
    def __init__(self):
        self.now = 1000.0

    def __call__(self):
        return self.now


def step(n: int) -> bytes:
    return b"[rank0]:" + json.dumps({"event": "step", "step": n, "loss": 2.5}).encode() + b"\n"


def beat(n: int) -> bytes:
    return b"[rank0]:" + json.dumps({"event": "beat", "step": n}).encode() + b"\n"


def phase(name: str, state: str, **extra) -> bytes:
    return json.dumps({"event": "phase", "phase": name, "state": state, **extra}).encode() + b"\n"


class Run:
    """`hung` is the first overdue answer, asked as often as the watchdog asks. `log_interval`: a step line every
    that many steps (and the first after a start), as run.log_interval_steps; `beats`: a beat after each other
    step (training/phases.py), else nothing between the step lines."""

    def __init__(self, log_interval: int = 1, beats: bool = False, **kwargs):
        self.clock = Clock()
        self.watch = ProgressWatch(HANG_S, START_S, floor_s=FLOOR_S, step_floor_s=STEP_FLOOR_S, clock=self.clock,
                                   **kwargs)
        self.hung: str | None = None
        self.step = 0
        self.log_interval = log_interval
        self.beats = beats
        self._first = True

    def wait(self, seconds: float) -> None:
        poll = self.watch.poll_interval_s()
        end = self.clock.now + seconds
        while self.clock.now < end and self.hung is None:
            self.clock.now = min(end, self.clock.now + poll)
            self.hung = self.watch.overdue()

    def feed(self, line: bytes) -> None:
        if self.hung is None:
            self.watch.observe(line)

    def steps(self, count: int, seconds: float = STEP_S) -> None:
        for _ in range(count):
            self.wait(seconds)
            self.step += 1
            if self._first or self.step % self.log_interval == 0:
                self.feed(step(self.step))
            elif self.beats:
                self.feed(beat(self.step))
            self._first = False

    def during(self, name: str, seconds: float, **extra) -> None:
        self.feed(phase(name, "start", **extra))
        self.wait(seconds)
        self.feed(phase(name, "end"))

    def started(self) -> Run:
        """A trainer that reports phases: its checkpoint load, then the first step after a compile."""
        self.during("checkpoint_load", 30)
        self.during("compile", 90)
        self.steps(1, 5)
        return self
