"""Boot must end: per-command deadlines that hold with a child the kernel will not let die, the overall
deadline, and the watchdog that fires while the main thread is stuck."""

from __future__ import annotations

import subprocess
import threading
import time

import pytest

from node_bootstrap.deadline import Deadline, DeadlineExceeded, Watchdog
from node_bootstrap.runner import TIMED_OUT, Runner

pytestmark = pytest.mark.waits  # mostly sleeps on real timeouts: run beside the slow files (conftest.py)


class UnkillablePopen:
    """A child in uninterruptible sleep: it never finishes, and SIGKILL does not end it either.

    CPython 3.9's subprocess.run would call wait() with no timeout here and hang forever; the runner must not.
    """

    instances: list = []

    def __init__(self, argv, **kwargs):
        self.argv = argv
        self.pid = 999999  # no such process: killpg fails with ProcessLookupError, kill() is recorded
        self.kwargs = kwargs
        self.killed = False
        self.stdin = self.stdout = self.stderr = None
        self.returncode = None
        self.waits: list = []
        UnkillablePopen.instances.append(self)

    def communicate(self, input=None, timeout=None):
        time.sleep(timeout)
        raise subprocess.TimeoutExpired(self.argv, timeout, output=b"GPU 0: ", stderr=b"")

    def kill(self):
        self.killed = True

    def wait(self, timeout=None):
        assert timeout is not None, "waiting for a killed child with no limit hangs the boot"
        self.waits.append(timeout)
        time.sleep(timeout)
        raise subprocess.TimeoutExpired(self.argv, timeout)


def test_a_stuck_child_past_its_deadline_is_abandoned_in_bounded_time():
    runner = Runner(popen=UnkillablePopen, kill_grace_s=0.2)
    started = time.monotonic()
    result = runner.run(["/usr/bin/nvidia-smi", "-q"], mutating=False, check=False, timeout=0.3)
    elapsed = time.monotonic() - started
    child = UnkillablePopen.instances[-1]
    assert elapsed < 5  # 0.3 s timeout + 0.2 s grace, not forever
    assert child.killed and child.waits == [0.2]
    assert child.kwargs["start_new_session"] is True
    assert result.returncode == TIMED_OUT
    assert result.stdout == "GPU 0: "  # what it printed before it got stuck is kept
    assert result.stderr == ("timed out after 0.3 s; still not gone 0.2 s after SIGKILL (stuck in the kernel?): "
                             "abandoned pid 999999")


def test_a_real_timeout_kills_the_whole_process_group():
    # The grandchild keeps stdout open: without a group kill, reading the pipe would block until it exits.
    runner = Runner(kill_grace_s=2)
    started = time.monotonic()
    result = runner.run(["sh", "-c", "echo started; sleep 30 & sleep 30"], mutating=False, check=False,
                        timeout=0.5)
    assert time.monotonic() - started < 10
    assert result.returncode == TIMED_OUT
    assert result.stdout == "started\n"
    assert result.stderr == "timed out after 0.5 s and was killed"


def test_a_grandchild_in_its_own_session_cannot_hold_the_runner():
    runner = Runner(kill_grace_s=1)
    started = time.monotonic()
    result = runner.run(["sh", "-c", "setsid sleep 20 & sleep 20"], mutating=False, check=False, timeout=0.5)
    assert time.monotonic() - started < 10
    assert result.returncode == TIMED_OUT


class FakeClock:
    def __init__(self) -> None:
        self.now = 1000.0

    def __call__(self) -> float:
        return self.now


def test_the_overall_deadline_cuts_timeouts_and_sleeps_and_then_refuses():
    clock = FakeClock()
    deadline = Deadline(100, clock=clock)
    assert deadline.bound(600) == 100 and deadline.bound(30) == 30
    clock.now += 90
    runner = Runner(deadline=deadline, popen=UnkillablePopen, kill_grace_s=0.01)
    slept = []
    runner.sleep(60, sleep=slept.append)
    assert slept == [10]
    clock.now += 10
    with pytest.raises(DeadlineExceeded, match="the bootstrap deadline of 100 s has passed"):
        runner.run(["dnf", "install", "-y", "lustre-client"], mutating=True, timeout=600)
    with pytest.raises(DeadlineExceeded):
        runner.sleep(5, sleep=slept.append)
    # Reporting the failure still works after the deadline.
    result = runner.run(["true"], mutating=False, check=False, timeout=0.05, past_deadline=True)
    assert result.returncode == TIMED_OUT


def test_the_watchdog_fires_while_the_main_thread_is_blocked():
    stuck = threading.Event()
    fired = []
    watchdog = Watchdog(0.2, on_expire=fired.append, what=lambda: "step lustre").start()
    stuck.wait(1.0)  # the main thread "blocks" (as in a write to a hung mount)
    assert fired == ["step lustre"] and watchdog.fired.is_set()


def test_a_stopped_watchdog_never_fires():
    fired = []
    watchdog = Watchdog(0.2, on_expire=fired.append, what=lambda: "x").start()
    watchdog.stop()
    time.sleep(0.4)
    assert fired == [] and not watchdog.fired.is_set()
