"""What nvidia-smi says about the GPUs, parsed from its CSV query output.

`--format=csv,noheader,nounits` prints one line per GPU with the fields in the order asked for; values the
driver cannot report are printed as "[N/A]" or "[Not Supported]" (nvidia-smi(1), "--query-gpu").
"""

from __future__ import annotations

from dataclasses import dataclass

GPU_FIELDS = ("index", "name", "pci.bus_id", "memory.total", "ecc.errors.uncorrected.volatile.total")
GPU_QUERY = ("nvidia-smi", "--query-gpu=" + ",".join(GPU_FIELDS), "--format=csv,noheader,nounits")
# Row remapping (A100 and later): a pending remap needs a GPU reset; a failure means no spare rows are left.
REMAP_FIELDS = ("gpu_bus_id", "remapped_rows.pending", "remapped_rows.failure")
REMAP_QUERY = ("nvidia-smi", "--query-remapped-rows=" + ",".join(REMAP_FIELDS), "--format=csv,noheader")


@dataclass(frozen=True)
class GpuInfo:
    index: int
    name: str  # e.g. "NVIDIA H100 80GB HBM3"
    pci_bus_id: str  # e.g. "00000000:53:00.0"
    memory_total_mib: int | None
    ecc_uncorrected_volatile: int | None  # None when ECC counters are not available


@dataclass(frozen=True)
class RowRemapInfo:
    pci_bus_id: str
    pending: bool | None
    failure: bool | None


class GpuQueryError(ValueError):
    """nvidia-smi printed something this parser does not understand."""


def parse_gpu_query(text: str) -> list[GpuInfo]:
    gpus = []
    for line in _lines(text):
        fields = _split(line, len(GPU_FIELDS))
        try:
            index = int(fields[0])
        except ValueError:
            raise GpuQueryError(f"unexpected nvidia-smi line {line!r} (the index is not a number)") from None
        gpus.append(GpuInfo(index, fields[1], fields[2], _optional_int(fields[3]), _optional_int(fields[4])))
    return gpus


def parse_remapped_rows(text: str) -> list[RowRemapInfo]:
    rows = []
    for line in _lines(text):
        bus, pending, failure = _split(line, len(REMAP_FIELDS))
        rows.append(RowRemapInfo(bus, _optional_flag(pending), _optional_flag(failure)))
    return rows


def _lines(text: str) -> list[str]:
    return [line.strip() for line in text.splitlines() if line.strip()]


def _split(line: str, count: int) -> tuple[str, ...]:
    fields = tuple(f.strip() for f in line.split(","))
    if len(fields) != count:
        raise GpuQueryError(f"unexpected nvidia-smi line {line!r}: {len(fields)} fields, expected {count}")
    return fields


def _optional_int(value: str) -> int | None:
    if value.startswith("[") or value in ("N/A", ""):
        return None
    try:
        return int(float(value))
    except ValueError:
        raise GpuQueryError(f"unexpected nvidia-smi value {value!r} (expected a number or [N/A])") from None


def _optional_flag(value: str) -> bool | None:
    lowered = value.lower()
    if lowered in ("yes", "1", "true"):
        return True
    if lowered in ("no", "0", "false"):
        return False
    return None
