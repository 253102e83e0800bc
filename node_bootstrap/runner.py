"""The one seam through which node_bootstrap runs external commands.

Every command is declared read-only (a probe: blkid, nvidia-smi, modinfo) or mutating (mdadm --create, mount,
aws ec2 create-tags). The runner records every call, so tests can assert what ran and that a second run ran
nothing mutating; in dry-run mode it prints mutating commands instead of running them and still runs probes,
so the printed plan is computed from the machine's real state.
"""

from __future__ import annotations

import logging
import os
import shlex
import shutil
import subprocess
from collections.abc import Iterable, Sequence
from dataclasses import dataclass

LOG = logging.getLogger("node_bootstrap")

DEFAULT_TIMEOUT_S = 120.0
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

    def __init__(self, *, dry_run: bool = False, print_fn=print) -> None:
        self.dry_run = dry_run
        self.calls: list[Call] = []
        self._print = print_fn

    def run(
        self,
        argv: Sequence[str],
        *,
        mutating: bool,
        check: bool = True,
        timeout: float = DEFAULT_TIMEOUT_S,
        input_text: str | None = None,
    ) -> CommandResult:
        """Run `argv` (no shell). `mutating` commands are only printed in dry-run mode.

        `check=True` raises CommandError on a non-zero exit; a missing executable gives exit code 127.
        """
        argv_t = tuple(str(a) for a in argv)
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

    def _execute(self, argv: tuple[str, ...], timeout: float, input_text: str | None) -> CommandResult:
        executable = argv[0] if os.path.isabs(argv[0]) else self.which(argv[0])
        if executable is None:
            return CommandResult(argv, 127, "", f"{argv[0]}: command not found")
        try:
            proc = subprocess.run(
                [executable, *argv[1:]],
                input=input_text,
                capture_output=True,
                text=True,
                timeout=timeout,
                check=False,
            )
        except FileNotFoundError:
            return CommandResult(argv, 127, "", f"{argv[0]}: command not found")
        except subprocess.TimeoutExpired:
            return CommandResult(argv, 124, "", f"timed out after {timeout:.0f} s")
        return CommandResult(argv, proc.returncode, proc.stdout, proc.stderr)
