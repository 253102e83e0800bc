"""The kernel log lines that are new since the monitor's last round, and where to start reading next time.

Two sources, in this order:
- journald (the DLAMI's AL2023 and Ubuntu both run it): `journalctl -k --show-cursor` prints, after the
  entries, a last line `-- cursor: s=...;i=...` that `--after-cursor=` resumes from (journalctl(1),
  --after-cursor, --show-cursor). Without a cursor the round reads the whole current boot (`-b 0`): events
  between the boot gate and the monitor's first round are not lost.
- /dev/kmsg, where journald is missing: one record per read, `PRIORITY,SEQUENCE,TIMESTAMP,FLAGS;MESSAGE`
  with the kernel's 64-bit sequence number, and continuation lines (` KEY=value`) after it; a reader that
  fell behind the ring buffer gets EPIPE once and then the oldest record still there (kernel
  Documentation/ABI/testing/dev-kmsg). The sequence number is the cursor.

The first read of a boot that finds no kernel messages in the journal at all (journald not storing them),
or a journalctl that fails, switches to /dev/kmsg for the rest of the boot (node_bootstrap/kernel_log.py's
gate falls back to the ring buffer for the same reason).

Both cursors carry the boot id (/proc/sys/kernel/random/boot_id): after a reboot the old cursor means
nothing (a kmsg sequence starts again at 0; a journal cursor would return the end of the previous boot, whose
GPU errors a reboot has cleared), so the round reads the new boot from its start.
"""

from __future__ import annotations

import errno
import os
from dataclasses import dataclass

from node_bootstrap.host import Host
from node_bootstrap.runner import Runner

JOURNAL = "journal"
KMSG = "kmsg"
BOOT_ID_PATH = "/proc/sys/kernel/random/boot_id"
KMSG_PATH = "/dev/kmsg"
JOURNAL_TIMEOUT_S = 60.0
_CURSOR_PREFIX = "-- cursor: "
_KMSG_READ_BYTES = 16384  # larger than the kernel's longest record (PRINTK_MESSAGE_MAX)


@dataclass(frozen=True)
class KernelLogRead:
    text: str  # the new lines (journal: short-iso lines; kmsg: the messages), "" when there are none
    cursor: dict  # where the next round starts: {"source", "bootId", "cursor" | "seq"}
    error: str | None = None  # the log could not be read; `cursor` is then the previous one

    @property
    def ok(self) -> bool:
        return self.error is None


def journal_command(cursor: str | None) -> tuple[str, ...]:
    start = ("--after-cursor=" + cursor,) if cursor else ("-b", "0")
    return ("journalctl", "-k", "--no-pager", "-o", "short-iso", "--show-cursor") + start


def read_new_kernel_log(host: Host, runner: Runner, previous: dict | None) -> KernelLogRead:
    """The kernel log since `previous` (a cursor from the last round, or None for a first round)."""
    boot_id = host.read_text(BOOT_ID_PATH, default="").strip()
    if previous is not None and previous.get("bootId") != boot_id:
        previous = None  # a new boot: start at its beginning
    on_journal = previous is None or previous.get("source") == JOURNAL
    if not on_journal or runner.which("journalctl") is None:
        return _read_kmsg(host, boot_id, previous)
    read = _read_journal(runner, boot_id, previous)
    if read.ok and (previous is not None or read.text):
        return read
    # journald without the kernel's messages (Storage=none, not yet flushed: the first read of a boot finds
    # none at all), or a journalctl that fails: /dev/kmsg for the rest of this boot (the cursor says which).
    why = read.error or "the journal has no kernel messages for this boot"
    kmsg = _read_kmsg(host, boot_id, None)
    if kmsg.ok:
        return kmsg
    return KernelLogRead("", previous or {}, error=f"{why}; and {kmsg.error}")


def _read_journal(runner: Runner, boot_id: str, previous: dict | None) -> KernelLogRead:
    cursor = previous.get("cursor") if previous and previous.get("source") == JOURNAL else None
    result = runner.run(journal_command(cursor), mutating=False, check=False, timeout=JOURNAL_TIMEOUT_S)
    if not result.ok and cursor:
        # A cursor journalctl rejects ("Failed to seek to cursor"): read the boot again rather than nothing,
        # forever. (A cursor whose entry was vacuumed is not an error: journalctl seeks to the next entry.)
        cursor = None
        result = runner.run(journal_command(None), mutating=False, check=False, timeout=JOURNAL_TIMEOUT_S)
    if not result.ok:
        return KernelLogRead("", previous or {}, error="kernel log not readable: " + result.describe_failure())
    lines, new_cursor = [], cursor
    for line in result.stdout.splitlines():
        if line.startswith(_CURSOR_PREFIX):
            new_cursor = line[len(_CURSOR_PREFIX):].strip()
        elif not line.startswith("-- "):  # "-- No entries --", "-- Boot ... --"
            lines.append(line)
    text = "\n".join(lines) + ("\n" if lines else "")
    return KernelLogRead(text, {"source": JOURNAL, "bootId": boot_id, "cursor": new_cursor})


def _read_kmsg(host: Host, boot_id: str, previous: dict | None) -> KernelLogRead:
    last_seq = previous.get("seq", -1) if previous and previous.get("source") == KMSG else -1
    try:
        raw = _read_all_records(host.path(KMSG_PATH))
    except OSError as e:
        return KernelLogRead("", previous or {}, error=f"kernel log not readable: {KMSG_PATH}: {e.strerror or e}")
    messages, seq = [], last_seq
    for record_seq, message in parse_kmsg_records(raw.decode("utf-8", "replace")):
        if record_seq > last_seq:
            messages.append(message)
            seq = max(seq, record_seq)
    text = "\n".join(messages) + ("\n" if messages else "")
    return KernelLogRead(text, {"source": KMSG, "bootId": boot_id, "seq": seq})


def parse_kmsg_records(text: str) -> list[tuple[int, str]]:
    """(sequence number, message) of each /dev/kmsg record in `text` (whole lines)."""
    records = []
    for record in text.splitlines():
        if record.startswith(" ") or ";" not in record:
            continue  # a continuation line (" SUBSYSTEM=pci") or noise
        prefix, message = record.split(";", 1)
        fields = prefix.split(",")
        try:
            records.append((int(fields[1]), message))
        except (IndexError, ValueError):
            continue
    return records


def _read_all_records(path: str) -> bytes:
    """Every record /dev/kmsg still holds (a plain file in tests: its whole content)."""
    chunks = []
    fd = os.open(path, os.O_RDONLY | os.O_NONBLOCK)
    try:
        while True:
            try:
                chunk = os.read(fd, _KMSG_READ_BYTES)
            except OSError as e:
                if e.errno == errno.EAGAIN:
                    break  # no more records
                if e.errno == errno.EPIPE:
                    continue  # records were overwritten before we read them; the next read goes on
                raise
            if not chunk:
                break
            chunks.append(chunk)  # a kmsg record ends in a newline
    finally:
        os.close(fd)
    return b"".join(chunks)
