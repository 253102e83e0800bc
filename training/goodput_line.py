"""The trainer's own goodput: the share of this process's wall time its steps took (issue 45).

What the trainer can know of the job's goodput is its own process: from the moment `python -m training`
imported this package (STARTED_S) to now, the seconds that went to training steps. The steps' seconds are the
step records' own (training/metrics.py: the slowest rank's mean step time x the steps since the last logged
step), leaving out the first step of a start, whose forward and backward compile (torch.compile). So the rest
of the wall time is imports, the rendezvous, the model's build, the checkpoint load, the compile, validation
passes and the export; a blocking save and a data wait sit inside the measured step intervals and count as
steps here. The steps this process trains that a later restart re-runs, and every second outside the process
(waiting for nodes, the supervisor, torchrun, failure detection), only the job's record knows: `clusterctl
status` splits the whole job (cluster_jobs/goodput.py).

Every step record carries `goodput_pct` (its EMF metric `Goodput`, per job); the progress line of the run's
last step prints it with its seconds.
"""

from __future__ import annotations

import time

STARTED_S = time.monotonic()  # when the trainer's process imported this package (training.metrics imports it)


class TrainerGoodput:
    """Counted step seconds against the process's wall time. `clock`: seconds, monotonic (a test's own)."""

    def __init__(self, started_s: float = STARTED_S, clock=time.monotonic) -> None:
        self.started_s = started_s
        self.clock = clock
        self.step_s = 0.0  # seconds of counted steps so far
        self.last_step: int | None = None  # the last logged step: the steps since it share the next record's time

    def add(self, step: int, step_time_s: float, *, first_of_start: bool) -> None:
        """The step record of `step`: `step_time_s` (the slowest rank's mean) for each step since the last
        one logged. The first step of a start only marks where counting begins (it compiles)."""
        if not first_of_start and self.last_step is not None and step > self.last_step:
            self.step_s += step_time_s * (step - self.last_step)
        self.last_step = step

    def wall_s(self) -> float:
        return max(0.0, self.clock() - self.started_s)

    def pct(self) -> float:
        wall = self.wall_s()
        return 0.0 if wall <= 0 else min(100.0, 100.0 * self.step_s / wall)

    def line(self) -> str:
        """The run's last progress line's part: "goodput 91.2% (steps 120.5 s of 132.1 s in this process)"."""
        return f"goodput {self.pct():.1f}% (steps {self.step_s:.1f} s of {self.wall_s():.1f} s in this process)"
