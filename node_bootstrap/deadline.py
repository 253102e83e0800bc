"""Boot must end: one overall deadline for the whole bootstrap, and a watchdog that enforces it.

Two layers, because a hang can sit where no timeout reaches:
- every command's timeout is cut to the time left (runner.py), and sleeps between retries are too;
- a watchdog thread fires at the deadline even when the main thread is stuck in a system call that never
  returns (a write to an unresponsive Lustre mount, an automount trigger, a read of a dead device: all
  uninterruptible sleep, where no signal or exception reaches the thread). The watchdog marks the node failed
  with the step it was stuck in, then ends the process. Python releases the GIL around blocking system
  calls, so the watchdog thread runs while the main thread is blocked.
The user-data shim adds a third layer: it stops waiting for node_bootstrap a little after the deadline.
"""

from __future__ import annotations

import logging
import threading
import time
from typing import Callable

from node_bootstrap.errors import StepError

LOG = logging.getLogger("node_bootstrap")


class DeadlineExceeded(StepError):
    """The overall bootstrap deadline passed; the message says how long it was and what was running."""


class Deadline:
    """A point in time on the monotonic clock; `clock` is a seam for tests."""

    def __init__(self, seconds: float, *, clock: Callable[[], float] = time.monotonic) -> None:
        self.seconds = seconds
        self._clock = clock
        self._end = clock() + seconds

    def remaining(self) -> float:
        return max(0.0, self._end - self._clock())

    @property
    def expired(self) -> bool:
        return self.remaining() <= 0.0

    def bound(self, timeout_s: float) -> float:
        """`timeout_s`, cut to the time left; raises DeadlineExceeded when none is left."""
        left = self.remaining()
        if left <= 0.0:
            raise DeadlineExceeded(f"the bootstrap deadline of {self.seconds:.0f} s has passed")
        return min(timeout_s, left)


class Watchdog:
    """Calls `on_expire(what)` once, from its own thread, if `stop()` is not called within `seconds`.

    `what()` names what the main thread is doing (the current step), for the failure reason.
    """

    def __init__(self, seconds: float, on_expire: Callable[[str], None], what: Callable[[], str]) -> None:
        self.seconds = seconds
        self._on_expire = on_expire
        self._what = what
        self._stopped = threading.Event()
        self.fired = threading.Event()
        self._thread = threading.Thread(target=self._watch, name="bootstrap-watchdog", daemon=True)

    def start(self) -> Watchdog:
        self._thread.start()
        return self

    def stop(self) -> None:
        self._stopped.set()

    def _watch(self) -> None:
        if self._stopped.wait(self.seconds):
            return
        self.fired.set()
        what = self._what()
        LOG.error("bootstrap deadline of %s s passed while in %s", self.seconds, what)
        try:
            self._on_expire(what)
        except Exception:  # the watchdog must never die silently: log and let on_expire's caller decide
            LOG.exception("the deadline handler failed")
