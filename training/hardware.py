"""Peak tensor throughput of the GPU a rank runs on, the denominator of MFU.

The numbers come from the instance catalog (instance_catalog/instance_types.py, shipped in the node
bundle next to training/), the project's single source of truth for per-instance facts. The instance type is
taken from CLUSTER_INSTANCE_TYPE when the node environment sets it, else found from the CUDA device name
("NVIDIA H100 80GB HBM3" -> p5.48xlarge). PCIe and NVL boards of a catalog GPU (a benchmark machine outside
AWS) are no catalog instance's GPU and have lower peaks: they come from BOARD_PEAKS below. No GPU, or a GPU
neither knows: None, and MFU is not reported rather than reported against a guessed peak.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass
from typing import Any

import torch

INSTANCE_TYPE_ENV = "CLUSTER_INSTANCE_TYPE"


@dataclass(frozen=True)
class BoardPeak:
    """Dense (no sparsity) tensor-core peaks of one GPU board, TFLOP/s."""

    peak_bf16_tflops_per_gpu: float
    peak_fp8_tflops_per_gpu: float | None


# (GPU model, board marker in the CUDA device name) -> peaks. NVIDIA's datasheets give "with sparsity"
# figures; dense is half, rounded down as the catalog's 989 for the SXM's 1,979. H100 datasheet: H100 PCIe
# BF16 1,513 / FP8 3,026 TFLOPS with sparsity; H100 NVL BF16 1,671 / FP8 3,341 (torchtitan's
# get_peak_flops uses the same 756 and 835). A100 datasheet: the PCIe board's BF16 peak equals the SXM's, 312,
# and it has no FP8. Other PCIe/NVL boards (H200 NVL, ...) are not listed until checked against a datasheet.
BOARD_PEAKS: dict[tuple[str, str], BoardPeak] = {
    ("H100", "PCIE"): BoardPeak(756.0, 1513.0),
    ("H100", "NVL"): BoardPeak(835.0, 1670.0),
    ("A100", "PCIE"): BoardPeak(312.0, None),
}

log = logging.getLogger(__name__)


def peak_bf16_tflops_per_gpu(device: torch.device | str | None = None) -> float | None:
    """Dense BF16 tensor-core peak of one GPU in TFLOP/s, or None on a CPU or an unknown GPU."""
    entry = _catalog_entry(device)
    return None if entry is None else float(entry.peak_bf16_tflops_per_gpu)


def peak_fp8_tflops_per_gpu(device: torch.device | str | None = None) -> float | None:
    """Dense FP8 tensor-core peak of one GPU in TFLOP/s, or None (CPU, unknown GPU, GPU without FP8)."""
    entry = _catalog_entry(device)
    if entry is None or entry.peak_fp8_tflops_per_gpu is None:
        return None
    return float(entry.peak_fp8_tflops_per_gpu)


def device_name(device: torch.device | str | None = None) -> str:
    """The CUDA device name, or "cpu"."""
    device = torch.device(device) if device is not None else _default_device()
    if device.type != "cuda":
        return "cpu"
    return torch.cuda.get_device_name(device)


def _default_device() -> torch.device:
    return (
        torch.device("cuda", torch.cuda.current_device())
        if torch.cuda.is_available()
        else torch.device("cpu")
    )


def _catalog_entry(device: torch.device | str | None) -> Any | None:
    """The peaks for this device: the catalog's entry for the node's instance type or GPU, or a board's."""
    device = torch.device(device) if device is not None else _default_device()
    if device.type != "cuda":
        return None
    name = device_name(device)
    entry = find_peaks(name, os.environ.get(INSTANCE_TYPE_ENV, ""))
    if entry is None:
        log.warning("no peak TFLOP/s known for the GPU %r: MFU is not reported", name)
    return entry


def find_peaks(gpu_name: str, instance_type: str = "") -> Any | None:
    """What has ``peak_bf16_tflops_per_gpu`` / ``peak_fp8_tflops_per_gpu`` for this GPU: the catalog entry
    (find_instance_type), else a PCIe/NVL board's peaks (find_board_peak), else None."""
    entry = find_instance_type(gpu_name, instance_type)
    return entry if entry is not None else find_board_peak(gpu_name)


def find_board_peak(gpu_name: str) -> BoardPeak | None:
    """The peaks of a PCIe or NVL board named in a CUDA device name ("NVIDIA H100 PCIe"), or None."""
    upper = gpu_name.upper()
    for (model, marker), peak in BOARD_PEAKS.items():
        if model in upper and marker in upper:
            return peak
    return None


def find_instance_type(gpu_name: str, instance_type: str = "") -> Any | None:
    """The catalog entry for ``instance_type`` when given and known, else the first one whose GPU model
    appears in ``gpu_name``; None when neither matches or the catalog is not importable."""
    try:
        from instance_catalog import instance_types
    except ImportError:
        log.warning("instance_catalog.instance_types is not importable: MFU is not reported")
        return None
    if instance_type.strip():
        try:
            return instance_types.get_instance_type(instance_type.strip())
        except KeyError as exc:  # UnknownInstanceType: fall back to the device name
            log.warning("%s=%s: %s; using the GPU name instead", INSTANCE_TYPE_ENV, instance_type, exc)
    return instance_types.find_by_gpu_name(gpu_name)
