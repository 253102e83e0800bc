"""Phase records: the trainer tells its node's job supervisor when a phase longer than a step starts and ends.

A save, a validation pass or a compile pauses the step lines on purpose; without being told, the supervisor's
hang watch must wait minutes before it calls any silence a hang (node_bootstrap/jobs/progress.py). With these
records it holds each phase to its own bound and the steps between phases to their cadence, so a hang is
found in seconds (issue 45). One JSON line per record on stdout, from local rank 0 of every node, as the step
lines (training/metrics.py), so every node's supervisor sees them:

    {"event": "phase", "phase": "validation", "state": "start", "bound_s": 300}
    {"event": "phase", "phase": "validation", "state": "end"}

``bound_s`` (seconds) only where the trainer knows one. The names are node_bootstrap/job_contract.py's
PHASE_NAMES (the trainer cannot import the node's package: tests/test_architecture.py); the node checks every
record against them (node_bootstrap/jobs/job_report.py phase_report).

A wait that is short as a rule and long only when something stalls (the loader's wait for the next batch, the
wait for an async save's staging copy) is a phase only once it has lasted SLOW_WAIT_S (``after``): a timer
thread prints its start then, the end comes when the wait is over, and a wait shorter than that prints
nothing. So a read stuck on FSx is held to DATA_WAIT_BOUND_S, not to the step cadence, and a slow one is no
false alarm.

Between phases, after every step that printed no step line, a beat (job_contract.BEAT_EVENT), so the
supervisor learns the cadence of single steps, not of ``run.log_interval_steps`` of them:

    {"event": "beat", "step": 123}

The step number is the host's: no GPU sync for it. The host runs ahead of the GPU only until CUDA's queue of
pending launches is full (about a thousand kernels; a step of a decoder is thousands), and every step ends in
the stop flag's all_reduce (training/faults.py), so the beats stop within a step of a stopped GPU or rank.

torch.compile's own compiles (a recompile mid-run, a backward compiled lazily at its first call) are reported
through Dynamo's compile callbacks (torch._dynamo.callback), which fire once around the outermost compile.
"""

from __future__ import annotations

import json
import logging
import sys
import threading
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager
from typing import TextIO

log = logging.getLogger(__name__)

COMPILE = "compile"
CHECKPOINT_LOAD = "checkpoint_load"
CHECKPOINT_SAVE = "checkpoint_save"
VALIDATION = "validation"
EXPORT = "export"
DATA_WAIT = "data_wait"
PHASES = (COMPILE, CHECKPOINT_LOAD, CHECKPOINT_SAVE, VALIDATION, EXPORT, DATA_WAIT)  # = job_contract.PHASE_NAMES
BEAT = "beat"  # = job_contract.BEAT_EVENT
# A wait past this is a phase (``after``): far below the supervisor's step floor (jobStepHangFloorSeconds, 20 s),
# so the start record comes before the step cadence's deadline; far above a batch the prefetcher has ready.
SLOW_WAIT_S = 1.0
# A data wait's bound: a first read of a shard file that FSx imports lazily from S3 waits for the whole file
# (tens of seconds for GiB at a small file system's throughput); a read stuck past this is a hang.
DATA_WAIT_BOUND_S = 300.0


class PhaseReporter:
    """Prints phase records when ``enabled`` (local rank 0 with ``metrics.json_lines``); does nothing otherwise."""

    def __init__(self, enabled: bool, stdout: TextIO | None = None):
        self.enabled = enabled
        self.stdout = stdout or sys.stdout
        self._lock = threading.Lock()  # ``after``'s timer thread prints too

    def record(self, phase: str, state: str, bound_s: float | None = None) -> None:
        if not self.enabled:
            return
        assert phase in PHASES, phase
        line: dict[str, object] = {"event": "phase", "phase": phase, "state": state}
        if bound_s is not None:
            line["bound_s"] = bound_s
        self._write(line)

    def beat(self, step: int) -> None:
        """This node finished ``step`` (one that printed no step line)."""
        if self.enabled:
            self._write({"event": BEAT, "step": step})

    def _write(self, line: dict[str, object]) -> None:
        with self._lock:
            self.stdout.write(json.dumps(line) + "\n")
            self.stdout.flush()

    @contextmanager
    def phase(self, phase: str, bound_s: float | None = None) -> Iterator[None]:
        """Records ``phase``'s start and, however it ends, its end."""
        self.record(phase, "start", bound_s)
        try:
            yield
        finally:
            self.record(phase, "end")

    @contextmanager
    def after(self, phase: str, after_s: float = SLOW_WAIT_S, bound_s: float | None = None) -> Iterator[None]:
        """While inside: ``phase`` once the wait has lasted ``after_s`` (its start printed then, by a timer thread,
        and its end on leaving); a shorter wait prints nothing."""
        if not self.enabled:
            yield
            return
        started, over = [False], [False]
        guard = threading.Lock()  # the timer's start and the end on leaving: one wins, the start never follows

        def start() -> None:
            with guard:
                if not over[0]:
                    self.record(phase, "start", bound_s)
                    started[0] = True

        timer = threading.Timer(after_s, start)
        timer.daemon = True
        timer.start()
        try:
            yield
        finally:
            timer.cancel()
            timer.join()  # no thread outlives the wait (a process's exit finds none of them)
            with guard:
                over[0] = True
                if started[0]:
                    self.record(phase, "end")

    def data_wait(self) -> AbstractContextManager[None]:
        """The loader's wait for the next step's batches: a phase past SLOW_WAIT_S, bound DATA_WAIT_BOUND_S."""
        return self.after(DATA_WAIT, SLOW_WAIT_S, DATA_WAIT_BOUND_S)

    def staging_wait(self) -> AbstractContextManager[None]:
        """The wait for an async save's staging copy: a checkpoint_save phase past SLOW_WAIT_S (its bound learned:
        a save's first run gets the supervisor's safety net, jobHangFloorSeconds)."""
        return self.after(CHECKPOINT_SAVE, SLOW_WAIT_S)

    @contextmanager
    def compiles(self) -> Iterator[None]:
        """While inside: every compile of torch.compile (a recompile, a lazy backward) is a compile phase."""
        handler = _compile_callbacks() if self.enabled else None
        if handler is None:
            yield
            return
        start = handler.register_start_callback(lambda _args: self.record(COMPILE, "start"))
        end = handler.register_end_callback(lambda _args: self.record(COMPILE, "end"))
        try:
            yield
        finally:
            handler.remove_start_callback(start)
            handler.remove_end_callback(end)


def _compile_callbacks():  # -> torch._dynamo.callback.CompilationCallbackHandler | None
    try:
        from torch._dynamo.callback import callback_handler
    except ImportError:  # a torch without Dynamo's callbacks: recompiles go unreported (the safety net holds)
        log.info("torch._dynamo.callback unavailable: compiles are not reported as phases")
        return None
    return callback_handler
