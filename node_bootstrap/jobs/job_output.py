"""How much of a job's output the node keeps (issue 42): the supervisor, as root, writes the job's output into
the job's log on the root file system, so the job must not decide how much that is.

- Per line: at most `line_max_bytes` of a line is kept; the rest of it is read in pieces of that size and
  counted, never held whole (300 MiB without a newline once took the supervisor to 325 MiB resident).
- Per job: the log grows to at most `log_max_bytes` (all attempts of the job together: they share the file);
  what comes after is counted and not kept, so a job cannot fill /var/log.
A cut line ends in CUT_NOTE so that a reader sees it was cut; it is no record (job_report never reads a cut
JSON line, whose object is not whole). Standard library only (Python >= 3.9).
"""

import os
from collections.abc import Iterator
from typing import BinaryIO, NamedTuple, Optional

JOB_LOG_MAX_BYTES = 1024**3  # 1 GiB per job log: a P5 trainer logs a few hundred bytes per step line
JOB_LINE_MAX_BYTES = 64 * 1024  # a Python traceback line or NCCL's longest INFO line is far shorter
CUT_NOTE = b" [node_bootstrap.jobs: line cut]\n"


def file_size(f: BinaryIO) -> int:
    """An open file's size now (the supervisor is the only writer of a job's log and metrics file)."""
    try:
        return os.fstat(f.fileno()).st_size
    except (OSError, ValueError):
        return 0


class Piece(NamedTuple):
    data: bytes  # a whole line (with its newline; the last one may lack it), or the kept start of a long one
    whole: bool  # False: the line was longer than the cap, and `data` is its start


class OutputCap:
    """The per-line and per-job limits, and what they dropped. Used by the supervisor's output thread only."""

    def __init__(self, log_max_bytes: int = JOB_LOG_MAX_BYTES, line_max_bytes: int = JOB_LINE_MAX_BYTES) -> None:
        if line_max_bytes < 1 or log_max_bytes < 0:
            raise ValueError(f"log_max_bytes={log_max_bytes}, line_max_bytes={line_max_bytes}: allowed: "
                             "log_max_bytes >= 0, line_max_bytes >= 1")
        self.log_max_bytes = log_max_bytes
        self.line_max_bytes = line_max_bytes
        self.cut_lines = 0  # lines longer than line_max_bytes, kept cut
        self.dropped_lines = 0  # lines not kept at all: the log was full
        self.dropped_bytes = 0  # bytes of the job's output not kept (cut parts and dropped lines)

    def lines(self, stream: BinaryIO) -> Iterator[Piece]:
        """The stream's lines, each read with readline(line_max_bytes): a longer one yields its start, and its
        rest is read in pieces of that size, counted in dropped_bytes and let go."""
        while True:
            data = stream.readline(self.line_max_bytes)
            if not data:
                return
            if data.endswith(b"\n") or len(data) < self.line_max_bytes:
                yield Piece(data, True)
                continue
            yield Piece(data, False)
            while True:  # the rest of a long line: counted, never kept
                rest = stream.readline(self.line_max_bytes)
                self.dropped_bytes += len(rest)
                if not rest or rest.endswith(b"\n"):
                    break

    def admit(self, piece: Piece, log_size: int) -> Optional[bytes]:
        """What to write of `piece` to a log of `log_size` bytes: the line, a cut line with CUT_NOTE, or None
        (the log is full: counted)."""
        data = piece.data if piece.whole else piece.data + CUT_NOTE
        if log_size + len(data) > self.log_max_bytes:
            self.dropped_lines += 1
            self.dropped_bytes += len(piece.data)
            return None
        if not piece.whole:
            self.cut_lines += 1
        return data

    def counts(self) -> dict[str, int]:
        """For the job's status ("output"): what the limits took."""
        return {"cutLines": self.cut_lines, "droppedLines": self.dropped_lines, "droppedBytes": self.dropped_bytes}

    def describe(self) -> str:
        return (f"{self.cut_lines} lines cut at {self.line_max_bytes} bytes, {self.dropped_lines} lines dropped "
                f"past the log's {self.log_max_bytes} bytes, {self.dropped_bytes} bytes not kept")
