"""TensorBoard event files of the step metrics, written by rank 0 with the standard library only.

``[metrics] tensorboard`` ("auto": in cluster jobs; "on"; "off") puts them in ``<checkpoint.dir>/tensorboard/``,
which the data repository association exports with the checkpoints, so whoever can read the checkpoint bucket
can look at the run (docs/observability.md, "TensorBoard"). Not torch.utils.tensorboard: it needs the
tensorboard package (protobuf, grpcio, ...) on every node, which the node lock does not carry.

The format (TensorFlow's TFRecord file of ``Event`` protobufs, tensorboard/compat/proto/event.proto and
summary.proto), encoded by hand: each record is ``uint64 length, uint32 masked_crc32c(length), data,
uint32 masked_crc32c(data)``, little-endian. The first event of a file names the format version
("brain.Event:2"); each logged step is one ``Event{wall_time, step, summary{value{tag, simple_value}}}``.
A resumed run starts a new file in the same directory (TensorBoard reads all of them as one run) with a
``SessionLog.START`` at its first step, after which TensorBoard drops what the attempt before wrote past the
checkpoint it resumed from.
"""

from __future__ import annotations

import itertools
import logging
import math
import os
import socket
import struct
import time
from collections.abc import Callable, Mapping
from pathlib import Path
from typing import Any

from training.config.metrics import MetricsConfig
from training.config.sections import JOB_ID_ENV

log = logging.getLogger(__name__)

TENSORBOARD_SUBDIR = "tensorboard"  # under checkpoint.dir
FILE_VERSION = b"brain.Event:2"  # version 2: restarts are marked with SessionLog.START, not guessed from steps
_FLOAT32_MAX = 3.4028234663852886e38
_files_opened = itertools.count()  # the name's last part: two writers of one process never share a file

# tag -> its value in a step record (training.metrics.MetricsLogger); None: not in this step's record
SCALARS: tuple[tuple[str, Callable[[Mapping[str, Any]], float | None]], ...] = (
    ("loss/train", lambda r: r["loss"]),
    ("loss/validation", lambda r: r.get("val_loss")),  # only after the steps that evaluated [validation]
    ("optim/lr", lambda r: r["lr"]),
    ("optim/grad_norm", lambda r: r["grad_norm"]),
    ("throughput/tokens_per_s", lambda r: r["tokens_per_s"]),
    ("throughput/tflops_per_gpu", lambda r: r["tflops"]),
    ("throughput/mfu_pct", lambda r: None if r["mfu"] is None else 100.0 * r["mfu"]),  # None on a CPU
    ("throughput/step_time_s", lambda r: r["step_time_s_max"]),  # the slowest rank's
)


def _crc32c_table() -> tuple[int, ...]:
    table = []
    for byte in range(256):
        crc = byte
        for _ in range(8):
            crc = (crc >> 1) ^ 0x82F63B78 if crc & 1 else crc >> 1  # Castagnoli, reflected
        table.append(crc)
    return tuple(table)


_CRC32C = _crc32c_table()


def crc32c(data: bytes) -> int:
    crc = 0xFFFFFFFF
    for byte in data:
        crc = _CRC32C[(crc ^ byte) & 0xFF] ^ (crc >> 8)
    return crc ^ 0xFFFFFFFF


def _masked_crc(data: bytes) -> int:
    crc = crc32c(data)
    return (((crc >> 15) | (crc << 17)) + 0xA282EAD8) & 0xFFFFFFFF


def tfrecord(data: bytes) -> bytes:
    length = struct.pack("<Q", len(data))
    return length + struct.pack("<I", _masked_crc(length)) + data + struct.pack("<I", _masked_crc(data))


def _varint(value: int) -> bytes:
    out = bytearray()
    while True:
        low, value = value & 0x7F, value >> 7
        out.append(low | (0x80 if value else 0))
        if not value:
            return bytes(out)


def _tag(number: int, wire_type: int) -> bytes:
    return _varint(number << 3 | wire_type)


def _length_delimited(number: int, data: bytes) -> bytes:
    return _tag(number, 2) + _varint(len(data)) + data


def event(*, wall_time_s: float, step: int, what: bytes) -> bytes:
    """An Event: wall_time (1, double), step (2, int64 >= 0), then one field of its ``what`` oneof."""
    return _tag(1, 1) + struct.pack("<d", wall_time_s) + _tag(2, 0) + _varint(step) + what


def scalar_summary(scalars: Mapping[str, float]) -> bytes:
    """Event.summary (5): Summary{value (1): Value{tag (1), simple_value (2, float)}} per scalar."""
    values = b"".join(
        _length_delimited(1, _length_delimited(1, tag.encode()) + _tag(2, 5) + struct.pack("<f", value))
        for tag, value in scalars.items()
    )
    return _length_delimited(5, values)


SESSION_START = _length_delimited(7, _tag(1, 0) + _varint(1))  # Event.session_log: SessionLog{status: START}


def scalars_of(record: Mapping[str, Any]) -> dict[str, float]:
    """The step record's scalars; absent, non-finite and beyond-float32 values are left out (as in EMF)."""
    out = {}
    for tag, get in SCALARS:
        try:
            value = get(record)
        except KeyError:  # the step-0 validation record holds no training step's fields
            continue
        if value is not None and not isinstance(value, bool) and math.isfinite(value) and abs(value) <= _FLOAT32_MAX:
            out[tag] = float(value)
    return out


class EventFileWriter:
    """One new event file in ``directory``. Every write opens, appends and closes it: each logged step reaches
    the file system (and the export to S3) at once, and nothing is left open when the process ends."""

    def __init__(self, directory: str | os.PathLike[str], *, start_step: int = 0,
                 clock: Callable[[], float] = time.time):
        self.clock = clock
        directory = Path(directory)
        directory.mkdir(parents=True, exist_ok=True)
        now = clock()
        # TensorFlow's name; the fixed-width time sorts files in the order TensorBoard must read them
        self.path: Path | None = directory / (
            f"events.out.tfevents.{int(now):010d}.{socket.gethostname()}.{os.getpid()}.{next(_files_opened)}")
        events = [event(wall_time_s=now, step=0, what=_length_delimited(3, FILE_VERSION))]
        if start_step > 0:  # a resume: what an earlier attempt logged after start_step is superseded
            events.append(event(wall_time_s=now, step=start_step + 1, what=SESSION_START))
        with open(self.path, "xb") as f:
            f.write(b"".join(tfrecord(e) for e in events))

    def add_scalars(self, step: int, scalars: Mapping[str, float]) -> None:
        if self.path is None or not scalars:
            return
        try:
            with open(self.path, "ab") as f:
                f.write(tfrecord(event(wall_time_s=self.clock(), step=step, what=scalar_summary(scalars))))
        except OSError as exc:  # the metrics are a view of the run: a full or broken disk must not stop it
            log.warning("TensorBoard: cannot append to %s (%s); not writing event files any more", self.path, exc)
            self.path = None


def tensorboard_enabled(cfg: MetricsConfig, checkpoint_dir: str, environ: Mapping[str, str] | None = None) -> bool:
    """"on": always (config validation requires checkpoint.dir); "auto": in a cluster job with a checkpoint.dir."""
    environ = os.environ if environ is None else environ
    return cfg.tensorboard == "on" or (cfg.tensorboard == "auto" and bool(checkpoint_dir)
                                       and bool(environ.get(JOB_ID_ENV)))


def open_tensorboard(cfg: MetricsConfig, checkpoint_dir: str, *, rank: int, start_step: int,
                     environ: Mapping[str, str] | None = None) -> EventFileWriter | None:
    """Rank 0's writer in ``<checkpoint_dir>/tensorboard/``, or None (other ranks, or not enabled)."""
    if rank != 0 or not tensorboard_enabled(cfg, checkpoint_dir, environ):
        return None
    directory = Path(checkpoint_dir) / TENSORBOARD_SUBDIR
    try:
        return EventFileWriter(directory, start_step=start_step)
    except OSError as exc:  # as for a failed append: the run goes on without event files
        log.warning("TensorBoard: cannot create an event file in %s (%s); not writing event files", directory, exc)
        return None
