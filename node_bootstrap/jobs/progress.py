"""Is the trainer still making progress? Read from its own step lines, not from GPU utilization (a GPU
spinning in a hung NCCL kernel reads 100% busy).

The trainer prints `{"event": "step", "step": N, ...}` every `run.log_interval_steps` steps: global rank 0
with the full record, and local rank 0 of every other node a short one (training/metrics.py), so every
node's job log shows progress. The supervisor feeds each line of torchrun's output to a ProgressWatch:
- a step line moves the deadline to now + the hang timeout (training.jobHangTimeoutSeconds);
- the start, and torchrun restarting its workers after a failure, move it to now + the start timeout
  (training.jobStartTimeoutSeconds): the first step after a start or a resume loads a checkpoint and
  compiles. torchrun's agent logs the failure that precedes a restart at ERROR level, which its default
  LOGLEVEL (WARNING) prints: "failed (exitcode: N) local_rank: R (pid: P) of binary: ..."
  (torch/distributed/elastic/multiprocessing/api.py in torch 2.13).
Past the deadline the job is hung on this node. A hang timeout shorter than log_interval_steps x the step
time declares a healthy job hung: the default 30 min is far above either preset's interval.
"""

import threading
import time
from typing import Callable, Optional

from node_bootstrap.jobs.control import find_last_event
from node_bootstrap.jobs.spec import utc_now

RESTART_MARKER = b"failed (exitcode: "
_STEP_HINT = b'"step"'


class ProgressWatch:
    """Thread-safe: the supervisor's output thread observes, its watchdog thread asks `overdue`."""

    def __init__(self, hang_timeout_s: float, start_timeout_s: float, *,
                 clock: Callable[[], float] = time.monotonic) -> None:
        self.hang_timeout_s = hang_timeout_s
        self.start_timeout_s = start_timeout_s
        self._clock = clock
        self._lock = threading.Lock()
        self.last_step: Optional[object] = None  # the step number of the last step line
        self.last_step_at: Optional[str] = None  # its UTC time
        self._waiting_for = "the first step"
        self._deadline = clock() + start_timeout_s

    def observe(self, line: bytes) -> None:
        if _STEP_HINT in line:
            event = find_last_event(line.decode("utf-8", "replace"), ("step",))
            if event is not None:
                with self._lock:
                    self.last_step, self.last_step_at = event.get("step"), utc_now()
                    self._waiting_for = "a step"
                    self._deadline = self._clock() + self.hang_timeout_s
                return
        if RESTART_MARKER in line:
            with self._lock:
                self._waiting_for = "the first step after torchrun restarted the workers"
                self._deadline = self._clock() + self.start_timeout_s

    def overdue(self) -> Optional[str]:
        """None while on time; past the deadline, one line saying what was awaited and the last step seen."""
        with self._lock:
            if self._clock() < self._deadline:
                return None
            waited = self.hang_timeout_s if self._waiting_for == "a step" else self.start_timeout_s
            last = (f"last step seen: {self.last_step} at {self.last_step_at}" if self.last_step is not None
                    else "no step seen")
            return f"no trainer step for {waited:g} s, waiting for {self._waiting_for} ({last})"
