"""The kernel log since boot, and which source it came from.

The journal keeps the whole boot (`journalctl -k -b 0`), while dmesg's ring buffer may have rotated early
Xids out on a busy node, so the journal comes first. But an empty journal is not a clean kernel: journald may
not have the kernel messages (Storage=none, a journal not yet flushed, journalctl without permission prints
"-- No entries --"). Then the ring buffer is read instead, and the check says which source it read.
"""

from __future__ import annotations

from dataclasses import dataclass

from node_bootstrap.runner import CommandResult, Runner

JOURNAL = ("journalctl", "-k", "-b", "0", "--no-pager", "-o", "short-iso")
DMESG = ("dmesg",)


@dataclass(frozen=True)
class KernelLog:
    text: str
    source: str  # what was read, for the check's detail: "journalctl -k -b 0" or "dmesg (...)"
    result: CommandResult  # the last command run, for its error


def read_kernel_log(runner: Runner) -> KernelLog:
    if runner.which("journalctl") is None:
        return _dmesg(runner, "no journalctl")
    journal = runner.run(JOURNAL, mutating=False, check=False)
    if not journal.ok:
        return _dmesg(runner, f"journalctl failed: {journal.describe_failure()}")
    if not _has_messages(journal.stdout):
        return _dmesg(runner, "the journal had no kernel messages for this boot")
    return KernelLog(journal.stdout, "journalctl -k -b 0", journal)


def probe_command(runner: Runner) -> tuple[str, ...]:
    return JOURNAL if runner.which("journalctl") is not None else DMESG


def _dmesg(runner: Runner, why: str) -> KernelLog:
    result = runner.run(DMESG, mutating=False, check=False)
    return KernelLog(result.stdout if result.ok else "", f"dmesg, the kernel ring buffer ({why})", result)


def _has_messages(text: str) -> bool:
    """journalctl prints "-- No entries --" (and "-- Journal begins ... --" headers) around nothing."""
    return any(line.strip() and not line.startswith("-- ") for line in text.splitlines())
