"""Is the trainer still making progress? Read from its own step lines, not from GPU utilization (a GPU
spinning in a hung NCCL kernel reads 100% busy).

The trainer prints `{"event": "step", "step": N, ...}` every `run.log_interval_steps` steps: global rank 0
with the full record, and local rank 0 of every other node a short one (training/metrics.py), so every
node's job log shows progress. The supervisor feeds each line of torchrun's output to a ProgressWatch.

How long a silence means a hang is learned from the job's own cadence, as NVIDIA's nvidia-resiliency-ext
computes its heartbeat timeouts (fault_tolerance TimeoutsCalc: the longest interval observed times a safety
factor, 5 by default):
- after a step line the deadline is now + HANG_FACTOR x the slowest interval between two step lines seen
  since the trainer (re)started, at least the floor (training.jobHangFloorSeconds), at most the upper bound
  (training.jobHangTimeoutSeconds, the stack's jobHangTimeoutMinutes). The slowest since the start, not of a
  sliding window: the intervals that hold a checkpoint save or a validation come every few hundred steps,
  and a window that forgot them would call the next one a hang. Until MIN_INTERVALS intervals are seen, the
  upper bound applies;
- the start, and torchrun restarting its workers after a failure, move the deadline to now + the start
  timeout (training.jobStartTimeoutSeconds): the first step after a start or a resume loads a checkpoint and
  compiles, and its wait is never counted as an interval. torchrun's agent logs the failure that precedes a
  restart at ERROR level, which its default LOGLEVEL (WARNING) prints: "failed (exitcode: N) local_rank: R
  (pid: P) of binary: ..." (torch/distributed/elastic/multiprocessing/api.py in torch 2.13).
Past the deadline the job is hung on this node. The floor covers what the cadence has not shown yet: the
first pause of a kind (a checkpoint's staging wait, a validation) before its interval was seen.
"""

import threading
import time
from typing import Callable, Optional

from node_bootstrap.jobs.job_report import Rejections, checked_int, find_last_event
from node_bootstrap.jobs.spec import utc_now

RESTART_MARKER = b"failed (exitcode: "
_STEP_HINT = b'"step"'


HANG_FACTOR = 5.0  # nvidia-resiliency-ext's FaultToleranceConfig.safety_factor default
MIN_INTERVALS = 3  # step-line intervals seen before the learned timeout replaces the upper bound


def _seconds(value: float) -> str:
    return f"{round(value, 1):g}"


class ProgressWatch:
    """Thread-safe: the supervisor's output thread observes, its watchdog thread asks `overdue`."""

    def __init__(self, hang_timeout_s: float, start_timeout_s: float, *, floor_s: float = 0.0,
                 factor: float = HANG_FACTOR, clock: Callable[[], float] = time.monotonic,
                 rejected: Optional[Rejections] = None) -> None:
        self.hang_timeout_s = hang_timeout_s  # the upper bound
        self.start_timeout_s = start_timeout_s
        self.floor_s = min(floor_s, hang_timeout_s)
        self.factor = factor
        self._clock = clock
        self._lock = threading.Lock()
        # where a step that fails job_report's schema is counted (the supervisor's, recorded in its status)
        self.rejected = rejected if rejected is not None else Rejections()
        # the step number of the last step line; None when it was no int in range (it still counts as progress)
        self.last_step: Optional[int] = None
        self.last_step_at: Optional[str] = None  # its UTC time
        self.slowest_interval_s = 0.0  # between two step lines, since the trainer (re)started
        self.intervals = 0
        self._last_step_clock: Optional[float] = None  # None: the next step line is the first after a start
        self._waiting_for = "the first step"
        self._timeout_s, self._basis = start_timeout_s, "the start timeout, jobStartTimeoutSeconds"
        self._deadline = clock() + start_timeout_s

    def hang_timeout(self) -> tuple[float, str]:
        """The silence after a step line that is a hang now, and why that long."""
        if self.intervals < MIN_INTERVALS:
            return self.hang_timeout_s, "the upper bound, jobHangTimeoutSeconds: too few steps seen to learn from"
        learned = self.factor * self.slowest_interval_s
        cadence = f"{self.factor:g} x the slowest step interval {self.slowest_interval_s:.3g} s"
        if learned >= self.hang_timeout_s:
            return self.hang_timeout_s, f"the upper bound, jobHangTimeoutSeconds, below {cadence}"
        if learned <= self.floor_s:
            return self.floor_s, f"the floor, jobHangFloorSeconds, above {cadence}"
        return learned, cadence

    def observe(self, line: bytes) -> None:
        if _STEP_HINT in line:
            event = find_last_event(line.decode("utf-8", "replace"), ("step",))
            if event is not None:
                with self._lock:
                    now = self._clock()
                    if self._last_step_clock is not None:
                        self.slowest_interval_s = max(self.slowest_interval_s, now - self._last_step_clock)
                        self.intervals += 1
                    self._last_step_clock = now
                    self.last_step = checked_int(event.get("step"), "lastStepSeen", self.rejected)
                    self.last_step_at = utc_now()
                    self._waiting_for = "a step"
                    self._timeout_s, self._basis = self.hang_timeout()
                    self._deadline = now + self._timeout_s
                return
        if RESTART_MARKER in line:
            with self._lock:
                self._last_step_clock = None  # the wait for the restarted workers' first step is no interval
                self._waiting_for = "the first step after torchrun restarted the workers"
                self._timeout_s, self._basis = self.start_timeout_s, "the start timeout, jobStartTimeoutSeconds"
                self._deadline = self._clock() + self.start_timeout_s

    def poll_interval_s(self) -> float:
        """How often the watchdog asks: a small part of the shortest timeout that can apply."""
        return min(1.0, max(0.05, min(self.hang_timeout_s, self.floor_s or self.hang_timeout_s) / 20))

    def overdue(self) -> Optional[str]:
        """None while on time; past the deadline, one line saying what was awaited, for how long and why that
        long, and the last step seen."""
        with self._lock:
            if self._clock() < self._deadline:
                return None
            last = (f"last step seen: {self.last_step} at {self.last_step_at}" if self.last_step is not None
                    else "no step seen")
            return (f"no trainer step for {_seconds(self._timeout_s)} s ({self._basis}), waiting for "
                    f"{self._waiting_for} ({last})")
