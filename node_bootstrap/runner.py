"""The one seam through which node_bootstrap runs external commands.

Every command is declared read-only (a probe: blkid, nvidia-smi, modinfo) or mutating (mdadm --create, mount,
aws ec2 create-tags). The runner records every call, so tests can assert what ran and that a second run ran
nothing mutating; in dry-run mode it prints mutating commands instead of running them and still runs probes,
so the printed plan is computed from the machine's real state.

Every command ends in bounded time, even one stuck in uninterruptible sleep (nvidia-smi on a GPU that fell off
the bus sits in the kernel and ignores SIGKILL until the driver gives up). subprocess.run cannot promise that:
on a timeout CPython 3.9 kills the child and then waits for it with no limit (Lib/subprocess.py, run(): the
`except TimeoutExpired` branch calls process.wait() with no timeout), and its pipes stay open while anything
still holds them. So the runner starts each command in its own process group, kills the group on timeout,
waits at most KILL_GRACE_S for it and then abandons it, keeping the output read so far. With a Deadline set,
each timeout is also cut to the time the whole bootstrap has left.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import signal
import subprocess
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from typing import Callable

from node_bootstrap.deadline import Deadline

LOG = logging.getLogger("node_bootstrap")

DEFAULT_TIMEOUT_S = 120.0
KILL_GRACE_S = 5.0  # how long to wait for a killed command before abandoning it
TIMED_OUT = 124  # the exit code of a command that ran out of time (as coreutils timeout(1) uses)
# Tools the DLAMI installs outside the default PATH of cloud-init's non-login shell.
EXTRA_TOOL_DIRS = ("/opt/amazon/efa/bin", "/usr/sbin", "/sbin", "/usr/local/bin")


@dataclass(frozen=True)
class CommandResult:
    argv: tuple[str, ...]
    returncode: int
    stdout: str
    stderr: str
    dry_run: bool = False  # True when a mutating command was printed instead of run

    @property
    def ok(self) -> bool:
        return self.returncode == 0

    def describe_failure(self) -> str:
        """The command and the tail of its stderr (or stdout), for error messages."""
        detail = (self.stderr.strip() or self.stdout.strip()).splitlines()[-3:]
        tail = (": " + " | ".join(detail)) if detail else ""
        return f"`{shlex.join(self.argv)}` exited {self.returncode}{tail}"


@dataclass(frozen=True)
class Call:
    """One recorded call, in order."""

    argv: tuple[str, ...]
    mutating: bool


class CommandError(RuntimeError):
    """A command that had to succeed did not; the message names the command and its error output."""

    def __init__(self, result: CommandResult) -> None:
        super().__init__(result.describe_failure())
        self.result = result


class Runner:
    """Runs commands with subprocess. Tests subclass it and override `_execute` (and `which`)."""

    def __init__(self, *, dry_run: bool = False, print_fn=print, deadline: Deadline | None = None,
                 popen: Callable[..., subprocess.Popen] = subprocess.Popen,
                 kill_grace_s: float = KILL_GRACE_S) -> None:
        self.dry_run = dry_run
        self.calls: list[Call] = []
        self._print = print_fn
        self.deadline = deadline  # the overall bootstrap deadline, when one is set
        self._popen = popen  # seam: tests pass a Popen whose child never dies
        self._kill_grace_s = kill_grace_s

    def run(
        self,
        argv: Sequence[str],
        *,
        mutating: bool,
        check: bool = True,
        timeout: float = DEFAULT_TIMEOUT_S,
        input_text: str | None = None,
        past_deadline: bool = False,
    ) -> CommandResult:
        """Run `argv` (no shell). `mutating` commands are only printed in dry-run mode.

        `check=True` raises CommandError on a non-zero exit; a missing executable gives exit code 127 and a
        command that ran out of time 124. The timeout is cut to the deadline's time left (DeadlineExceeded
        when none is left), except for `past_deadline` commands: the ones that report a failure.
        """
        argv_t = tuple(str(a) for a in argv)
        if self.deadline is not None and not past_deadline:
            timeout = self.deadline.bound(timeout)
        self.calls.append(Call(argv_t, mutating))
        if mutating and self.dry_run:
            self._print(f"  would run: {shlex.join(argv_t)}")
            return CommandResult(argv_t, 0, "", "", dry_run=True)
        LOG.debug("run: %s", shlex.join(argv_t))
        result = self._execute(argv_t, timeout, input_text)
        if check and not result.ok:
            raise CommandError(result)
        return result

    def which(self, name: str, extra_dirs: Iterable[str] = EXTRA_TOOL_DIRS) -> str | None:
        """The absolute path of an executable on PATH or in `extra_dirs`, or None."""
        search = os.pathsep.join([os.environ.get("PATH", os.defpath), *extra_dirs])
        return shutil.which(name, path=search)

    @property
    def mutating_calls(self) -> list[Call]:
        return [c for c in self.calls if c.mutating]

    def run_retried(self, argv: Sequence[str], *, attempts: int, delay_s: float, timeout: float,
                    sleep: Callable[[float], None] = time.sleep) -> CommandResult:
        """Run a mutating command until it succeeds, at most `attempts` times, `delay_s` apart (package
        installs: a repository mirror that times out once usually answers the next time). Raises CommandError
        with the last failure."""
        for attempt in range(1, attempts + 1):
            result = self.run(argv, mutating=True, check=False, timeout=timeout)
            if result.ok:
                return result
            if attempt < attempts:
                LOG.warning("attempt %d of %d failed: %s; retrying in %.0f s", attempt, attempts,
                            result.describe_failure(), delay_s)
                self.sleep(delay_s, sleep=sleep)
        raise CommandError(result)

    def sleep(self, seconds: float, sleep: Callable[[float], None] = time.sleep) -> None:
        """Sleep between retries, but never past the deadline (DeadlineExceeded when it has passed)."""
        if self.deadline is not None:
            seconds = self.deadline.bound(seconds)
        sleep(seconds)

    def _execute(self, argv: tuple[str, ...], timeout: float, input_text: str | None) -> CommandResult:
        executable = argv[0] if os.path.isabs(argv[0]) else self.which(argv[0])
        if executable is None:
            return CommandResult(argv, 127, "", f"{argv[0]}: command not found")
        try:
            proc = self._popen(
                [executable, *argv[1:]],
                stdin=subprocess.PIPE if input_text is not None else subprocess.DEVNULL,
                stdout=subprocess.PIPE,
                stderr=subprocess.PIPE,
                text=True,
                start_new_session=True,  # its own process group: a timeout kills the children too
            )
        except FileNotFoundError:
            return CommandResult(argv, 127, "", f"{argv[0]}: command not found")
        try:
            stdout, stderr = proc.communicate(input_text, timeout=timeout)
        except subprocess.TimeoutExpired as expired:
            return self._stop(proc, argv, timeout, expired)
        return CommandResult(argv, proc.returncode, stdout, stderr)

    def _stop(self, proc, argv: tuple[str, ...], timeout: float,
              expired: subprocess.TimeoutExpired) -> CommandResult:
        """Kill a command that ran out of time; wait for it a bounded while, then abandon it."""
        stdout, stderr = _text(expired.stdout), _text(expired.stderr)  # what it printed so far
        try:
            os.killpg(proc.pid, signal.SIGKILL)
        except (ProcessLookupError, PermissionError):
            proc.kill()
        try:
            proc.wait(timeout=self._kill_grace_s)
            note = f"timed out after {_seconds(timeout)} and was killed"
        except subprocess.TimeoutExpired:
            # Uninterruptible sleep: the kill is pending until the kernel call returns, if it ever does.
            note = (f"timed out after {_seconds(timeout)}; still not gone {_seconds(self._kill_grace_s)} after SIGKILL "
                    f"(stuck in the kernel?): abandoned pid {proc.pid}")
        for stream in (proc.stdin, proc.stdout, proc.stderr):
            if stream is not None:
                try:
                    stream.close()
                except OSError:
                    pass
        LOG.warning("`%s` %s", shlex.join(argv), note)
        return CommandResult(argv, TIMED_OUT, stdout, (stderr + "\n" if stderr else "") + note)


def _seconds(value: float) -> str:
    return f"{value:.0f} s" if value >= 10 else f"{value:.1g} s"


def _text(output) -> str:
    if output is None:
        return ""
    return output.decode(errors="replace") if isinstance(output, bytes) else output
