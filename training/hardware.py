"""Peak tensor throughput of the GPU a rank runs on, the denominator of MFU.

The numbers come from the instance catalog (cluster_constructs/instance_types.py, shipped in the node
bundle next to training/), the project's single source of truth for per-instance facts. The instance type is
taken from CLUSTER_INSTANCE_TYPE when the node environment sets it, else found from the CUDA device name
("NVIDIA H100 80GB HBM3" -> p5.48xlarge). No GPU, or a GPU the catalog does not know: None, and MFU is not
reported rather than reported against a guessed peak.
"""

from __future__ import annotations

import logging
import os
from typing import Any

import torch

INSTANCE_TYPE_ENV = "CLUSTER_INSTANCE_TYPE"

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
    device = torch.device(device) if device is not None else _default_device()
    if device.type != "cuda":
        return None
    return find_instance_type(device_name(device), os.environ.get(INSTANCE_TYPE_ENV, ""))


def find_instance_type(gpu_name: str, instance_type: str = "") -> Any | None:
    """The catalog entry for ``instance_type`` when given and known, else the first one whose GPU model
    appears in ``gpu_name``; None when neither matches or the catalog is not importable."""
    try:
        from cluster_constructs import instance_types
    except ImportError:
        log.warning("cluster_constructs.instance_types is not importable: MFU is not reported")
        return None
    if instance_type.strip():
        try:
            return instance_types.get_instance_type(instance_type.strip())
        except KeyError as exc:  # UnknownInstanceType: fall back to the device name
            log.warning("%s=%s: %s; using the GPU name instead", INSTANCE_TYPE_ENV, instance_type, exc)
    return instance_types.find_by_gpu_name(gpu_name)
