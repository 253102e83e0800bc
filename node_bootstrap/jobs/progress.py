"""Is the trainer still making progress? Read from its own step lines, not from GPU utilization (a GPU
spinning in a hung NCCL kernel reads 100% busy).

The trainer prints `{"event": "step", "step": N, ...}` every `run.log_interval_steps` steps: global rank 0
with the full record, and local rank 0 of every other node a short one (training/metrics.py), so every
node's job log shows progress; and, after every other step, local rank 0 of every node a beat,
`{"event": "beat", "step": N}` (job_contract.BEAT_EVENT, training/phases.py). A beat is a step line here (its
step checked by job_report.beat_report; a malformed one is dropped, counted and no progress), so the cadence
below is that of single steps: with step lines alone, at a log interval of 10, it was that of ten. The
supervisor feeds each line of torchrun's output to a ProgressWatch.

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

A trainer that prints phase records (job_contract.PHASE_EVENT: a compile, a blocking save, a validation, an
export started or ended, training/phases.py) is held to tighter bounds (issue 45), from its first valid record on:
- during a phase, the phase's own bound: the one its record gives, else HANG_FACTOR x the longest run of that
  phase seen, at least jobHangFloorSeconds (the first of a kind); phases nest (a recompile inside a
  validation), and when an inner one ends the outer one's bound starts again;
- between phases, the step cadence: HANG_FACTOR x the slowest of the last RECENT_INTERVALS intervals between
  step lines that held no phase, at least the step floor (training.jobStepHangFloorSeconds, seconds where
  jobHangFloorSeconds is minutes); until MIN_INTERVALS such intervals are seen, jobHangFloorSeconds. A window,
  not the slowest since the start: the long pauses are phases now, and their intervals are never learned.
A step line ends any phase still open (the trainer went on; an end record may have been dropped). Before the
first step after a (re)start the start timeout still applies; a phase then only ever moves the deadline later.
The timeouts are capped at the upper bound, jobHangTimeoutSeconds, in both modes. A malformed phase record is
dropped and counted (job_report.phase_report) and changes nothing.

The watch also sums the seconds the trainer spent in each phase after its first step since the (re)start
(`phase_seconds`, status "phaseSeconds"): a phase inside another counts for the inner one only, so no second
counts twice; before the first step (the start-up's checkpoint load and compile, which the restart timeline
times already) nothing counts. The job's goodput moves them out of its productive time (cluster_jobs/goodput.py).
"""

import threading
import time
from collections import deque
from typing import Callable, Optional

from node_bootstrap.config import DEFAULT_JOB_STEP_HANG_FLOOR_SECONDS
from node_bootstrap.job_contract import BEAT_EVENT, PHASE_EVENT
from node_bootstrap.jobs.job_report import Rejections, beat_report, checked_int, find_last_event, phase_report
from node_bootstrap.jobs.spec import phase_time, utc_now

RESTART_MARKER = b"failed (exitcode: "
_STEP_HINT = b'"step"'
_BEAT_HINT = b'"beat"'
_PHASE_HINT = b'"phase"'


HANG_FACTOR = 5.0  # nvidia-resiliency-ext's FaultToleranceConfig.safety_factor default
MIN_INTERVALS = 3  # step-line intervals seen before the learned timeout replaces the upper bound
RECENT_INTERVALS = 20  # with phase records: the step cadence is learned from this many recent intervals


def _seconds(value: float) -> str:
    return f"{round(value, 1):g}"


class ProgressWatch:
    """Thread-safe: the supervisor's output thread observes, its watchdog thread asks `overdue`."""

    def __init__(self, hang_timeout_s: float, start_timeout_s: float, *, floor_s: float = 0.0,
                 factor: float = HANG_FACTOR, clock: Callable[[], float] = time.monotonic,
                 rejected: Optional[Rejections] = None,
                 step_floor_s: float = float(DEFAULT_JOB_STEP_HANG_FLOOR_SECONDS)) -> None:
        self.hang_timeout_s = hang_timeout_s  # the upper bound
        self.start_timeout_s = start_timeout_s
        self.floor_s = min(floor_s, hang_timeout_s)
        self.step_floor_s = min(step_floor_s, hang_timeout_s)  # with phase records: the step cadence's floor
        # with phase records: the bound before the cadence is learned and of a phase's first run without its own
        self.safety_net_s = self.floor_s or hang_timeout_s
        self.factor = factor
        self._clock = clock
        self._lock = threading.Lock()
        # where a step that fails job_report's schema is counted (the supervisor's, recorded in its status)
        self.rejected = rejected if rejected is not None else Rejections()
        # the step number of the last step line or beat; None when a step line's was no int in range (that line
        # still counts as progress)
        self.last_step: Optional[int] = None
        self.last_step_at: Optional[str] = None  # its UTC time
        # the last record of progress (a step line, a beat, a phase record), UTC to the millisecond: a hung job
        # went quiet then (its goodput counts the silence as failure detection, cluster_jobs/goodput.py)
        self.quiet_since: Optional[str] = None
        self.slowest_interval_s = 0.0  # between two step lines, since the trainer (re)started
        self.intervals = 0
        self._last_step_clock: Optional[float] = None  # None: the next step line is the first after a start
        # with phase records (from the first valid one on): the recent intervals that held no phase, the longest
        # run of each phase, the open phases (name, its timeout, its basis), innermost last
        self.phase_aware = False
        self.recent: deque[float] = deque(maxlen=RECENT_INTERVALS)
        self.longest_phase_s: dict[str, float] = {}
        self._open: list[tuple[str, float, float, str]] = []  # (name, started at, timeout, basis)
        self._interval_held_phase = False
        # the seconds in each phase after the first step (the innermost open one counts), and since when the
        # open phase has counted; `phase_changes` counts the phases ended, so the supervisor records only then
        self.phase_seconds: dict[str, float] = {}
        self.phase_changes = 0
        self._phase_mark = clock()
        self._waiting_for = "the first step"
        self._timeout_s, self._basis = start_timeout_s, "the start timeout, jobStartTimeoutSeconds"
        self._deadline = clock() + start_timeout_s

    def hang_timeout(self) -> tuple[float, str]:
        """The silence after a step line that is a hang now, and why that long."""
        if self.phase_aware:
            return self._step_timeout()
        if self.intervals < MIN_INTERVALS:
            return self.hang_timeout_s, "the upper bound, jobHangTimeoutSeconds: too few steps seen to learn from"
        learned = self.factor * self.slowest_interval_s
        cadence = f"{self.factor:g} x the slowest step interval {self.slowest_interval_s:.3g} s"
        if learned >= self.hang_timeout_s:
            return self.hang_timeout_s, f"the upper bound, jobHangTimeoutSeconds, below {cadence}"
        if learned <= self.floor_s:
            return self.floor_s, f"the floor, jobHangFloorSeconds, above {cadence}"
        return learned, cadence

    def _step_timeout(self) -> tuple[float, str]:
        if len(self.recent) < MIN_INTERVALS:
            return self.safety_net_s, ("the safety net, jobHangFloorSeconds: too few steps outside phases seen to "
                                       "learn from")
        slowest = max(self.recent)
        learned = self.factor * slowest
        cadence = f"{self.factor:g} x the slowest of the recent step intervals {slowest:.3g} s"
        if learned >= self.hang_timeout_s:
            return self.hang_timeout_s, f"the upper bound, jobHangTimeoutSeconds, below {cadence}"
        if learned <= self.step_floor_s:
            return self.step_floor_s, f"the step floor, jobStepHangFloorSeconds, above {cadence}"
        return learned, cadence

    def _phase_timeout(self, name: str, bound_s: Optional[float]) -> tuple[float, str]:
        if bound_s is not None:
            if bound_s >= self.hang_timeout_s:
                return self.hang_timeout_s, (f"the upper bound, jobHangTimeoutSeconds, below the phase's bound "
                                             f"{bound_s:g} s")
            return bound_s, "the phase's own bound"
        longest = self.longest_phase_s.get(name)
        if longest is None:
            return self.safety_net_s, f"the safety net, jobHangFloorSeconds: no bound given and no {name} seen before"
        learned = min(max(self.factor * longest, self.safety_net_s), self.hang_timeout_s)
        return learned, (f"{self.factor:g} x the longest {name} {longest:.3g} s, at least jobHangFloorSeconds, at "
                         "most jobHangTimeoutSeconds")

    def _wait(self, now: float, waiting_for: str, timeout: tuple[float, str], started: bool = True) -> None:
        """Move the deadline to `now` + the timeout; before the first step only ever later (the start timeout)."""
        if not started and now + timeout[0] <= self._deadline:
            return
        self._waiting_for = waiting_for
        (self._timeout_s, self._basis), self._deadline = timeout, now + timeout[0]

    def observe(self, line: bytes) -> None:
        if _STEP_HINT in line or _BEAT_HINT in line:
            event = find_last_event(line.decode("utf-8", "replace"), ("step", BEAT_EVENT))
            if event is not None:
                with self._lock:
                    if event["event"] == BEAT_EVENT:
                        step = beat_report(event, self.rejected)
                        if step is not None:  # else dropped and counted: no progress
                            self._observe_step(step)
                    else:
                        self._observe_step(checked_int(event.get("step"), "lastStepSeen", self.rejected))
                return
        if _PHASE_HINT in line:
            event = find_last_event(line.decode("utf-8", "replace"), (PHASE_EVENT,))
            if event is not None:
                with self._lock:
                    self._observe_phase(event)
                return
        if RESTART_MARKER in line:
            with self._lock:
                self._count_phase(self._clock())
                self._last_step_clock = None  # the wait for the restarted workers' first step is no interval
                self._open.clear()
                self._waiting_for = "the first step after torchrun restarted the workers"
                self._timeout_s, self._basis = self.start_timeout_s, "the start timeout, jobStartTimeoutSeconds"
                self._deadline = self._clock() + self.start_timeout_s

    def _observe_step(self, step: Optional[int]) -> None:
        """A step line or a beat: the trainer finished `step` (None: a step line whose step failed the schema)."""
        now = self._clock()
        self._count_phase(now)
        if self._last_step_clock is not None:
            interval = now - self._last_step_clock
            self.slowest_interval_s = max(self.slowest_interval_s, interval)
            self.intervals += 1
            if not self._interval_held_phase and not self._open:
                self.recent.append(interval)
        self._last_step_clock = now
        self._interval_held_phase = False
        if self._open:  # the trainer went on: a phase whose end record was lost is over
            self.phase_changes += 1
            self._open.clear()
        self.last_step = step
        self.last_step_at = utc_now()
        self.quiet_since = phase_time()
        self._wait(now, "a step", self.hang_timeout())

    def _observe_phase(self, event: dict[str, object]) -> None:
        report = phase_report(event, self.rejected)
        if report is None:
            return  # dropped and counted
        now, started = self._clock(), self._last_step_clock is not None
        self._count_phase(now)
        self.quiet_since = phase_time()
        self.phase_aware = True
        self._interval_held_phase = True
        if report.state == "start":
            timeout, basis = self._phase_timeout(report.phase, report.bound_s)
            self._open.append((report.phase, now, timeout, basis))
            self._wait(now, f"the end of the {report.phase} phase", (timeout, basis), started)
            return
        names = [name for name, _, _, _ in self._open]
        if report.phase not in names:
            return  # an end without its start (its start record was dropped): nothing to end
        index = len(names) - 1 - names[::-1].index(report.phase)
        _, began, _, _ = self._open.pop(index)
        del self._open[index:]  # phases opened inside it and never ended ended with it
        self.phase_changes += 1
        self.longest_phase_s[report.phase] = max(self.longest_phase_s.get(report.phase, 0.0), now - began)
        if self._open:  # back in the outer phase: its bound starts again
            outer, _, timeout, basis = self._open[-1]
            self._wait(now, f"the end of the {outer} phase", (timeout, basis), started)
        elif started:  # the rest of the step: its cadence (before the first step the start timeout still runs)
            self._wait(now, "a step", self.hang_timeout())

    def _count_phase(self, now: float) -> None:
        """The time since the last change to the innermost open phase, once a step was seen since the start."""
        if self._open and self._last_step_clock is not None:
            name = self._open[-1][0]
            self.phase_seconds[name] = self.phase_seconds.get(name, 0.0) + max(0.0, now - self._phase_mark)
        self._phase_mark = now

    def phase_totals(self) -> dict[str, float]:
        """`phase_seconds` with the open phase's time so far, rounded to the millisecond (status "phaseSeconds")."""
        with self._lock:
            self._count_phase(self._clock())
            return {name: round(seconds, 3) for name, seconds in self.phase_seconds.items()}

    def open_phase(self) -> Optional[str]:
        """The innermost phase the trainer is in, by its records; None between phases."""
        with self._lock:
            return self._open[-1][0] if self._open else None

    def poll_interval_s(self) -> float:
        """How often the watchdog asks: a small part of the shortest timeout that can apply."""
        shortest = min(t for t in (self.hang_timeout_s, self.floor_s, self.step_floor_s) if t > 0)
        return min(1.0, max(0.05, shortest / 20))

    def overdue(self) -> Optional[str]:
        """None while on time; past the deadline, one line saying what was awaited, for how long and why that
        long, and the last step seen."""
        with self._lock:
            if self._clock() < self._deadline:
                return None
            last = (f"last step seen: {self.last_step} at {self.last_step_at}" if self.last_step is not None
                    else "no step seen")
            if self._open:
                return (f"the trainer's {self._open[-1][0]} phase did not end in {_seconds(self._timeout_s)} s "
                        f"({self._basis}) ({last})")
            return (f"no trainer step for {_seconds(self._timeout_s)} s ({self._basis}), waiting for "
                    f"{self._waiting_for} ({last})")
