"""What nvidia-smi says about the GPUs, parsed from its CSV query output.

`--format=csv,noheader,nounits` prints one line per GPU with the fields in the order asked for; values the
driver cannot report are printed as "[N/A]" or "[Not Supported]" (nvidia-smi(1), "--query-gpu").
"""

from __future__ import annotations

import re
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


# Clock event ("throttle") reasons the driver reports per GPU as "Active" or "Not Active" (nvidia-smi
# --help-query-gpu, "clocks_event_reasons.*"; drivers before R535 name them "clocks_throttle_reasons.*").
# The power cap (sw_power_cap) is left out: a GPU at full load sits at its power limit by design.
THROTTLE_REASONS = (
    ("clocks_event_reasons.hw_slowdown", "HW slowdown"),  # thermal or power brake asserted by the board
    ("clocks_event_reasons.hw_thermal_slowdown", "HW thermal slowdown"),
    ("clocks_event_reasons.hw_power_brake_slowdown", "HW power brake"),
    ("clocks_event_reasons.sw_thermal_slowdown", "SW thermal slowdown"),
)
THROTTLE_QUERY = ("nvidia-smi", "--query-gpu=index,pci.bus_id," + ",".join(f for f, _ in THROTTLE_REASONS),
                  "--format=csv,noheader")
# Per GPU, per link: "Link 3: 26.562 GB/s", or "Link 3: <inactive>" for a link that is down.
NVLINK_QUERY = ("nvidia-smi", "nvlink", "--status")


@dataclass(frozen=True)
class ThrottleInfo:
    index: int
    pci_bus_id: str
    active: tuple[str, ...]  # the names in THROTTLE_REASONS that are active now


@dataclass(frozen=True)
class NvlinkInfo:
    gpu: int
    name: str  # "NVIDIA H100 80GB HBM3"
    speeds_gbps: dict[int, float]  # link -> current speed, for the active links
    inactive: tuple[int, ...]  # links reported <inactive>


def parse_throttle_query(text: str) -> list[ThrottleInfo]:
    rows = []
    for line in _lines(text):
        fields = _split(line, 2 + len(THROTTLE_REASONS))
        try:
            index = int(fields[0])
        except ValueError:
            raise GpuQueryError(f"unexpected nvidia-smi line {line!r} (the index is not a number)") from None
        active = tuple(name for (_, name), value in zip(THROTTLE_REASONS, fields[2:]) if value.lower() == "active")
        rows.append(ThrottleInfo(index, fields[1], active))
    return rows


_NVLINK_GPU = re.compile(r"^GPU (\d+): (.*?)(?: \(UUID: [^)]*\))?$")
_NVLINK_LINK = re.compile(r"^Link (\d+): (?:([\d.]+) GB/s|<inactive>)$")


def parse_nvlink_status(text: str) -> list[NvlinkInfo]:
    """`nvidia-smi nvlink --status`; GPUs without NVLink are listed with no links."""
    gpus: list[NvlinkInfo] = []
    for line in _lines(text):
        gpu = _NVLINK_GPU.fullmatch(line)
        if gpu:
            gpus.append(NvlinkInfo(int(gpu.group(1)), gpu.group(2), {}, ()))
            continue
        link = _NVLINK_LINK.fullmatch(line)
        if link is None or not gpus:
            continue  # other per-link lines (capabilities, error counters) are not the status
        current = gpus[-1]
        if link.group(2) is None:
            gpus[-1] = NvlinkInfo(current.gpu, current.name, current.speeds_gbps,
                                  current.inactive + (int(link.group(1)),))
        else:
            current.speeds_gbps[int(link.group(1))] = float(link.group(2))
    return gpus
