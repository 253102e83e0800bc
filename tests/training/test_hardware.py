"""MFU peaks from the instance catalog."""

from __future__ import annotations

import logging

import pytest
import torch

from training.hardware import find_instance_type, find_peaks, peak_bf16_tflops_per_gpu, peak_fp8_tflops_per_gpu


def test_cpu_has_no_peak_even_when_the_node_says_p5(monkeypatch):
    monkeypatch.setenv("CLUSTER_INSTANCE_TYPE", "p5.48xlarge")
    assert peak_bf16_tflops_per_gpu(torch.device("cpu")) is None
    assert peak_fp8_tflops_per_gpu("cpu") is None


@pytest.mark.parametrize(
    ("gpu_name", "instance_type", "expected"),
    [
        ("NVIDIA H100 80GB HBM3", "", "p5.48xlarge"),  # the CUDA device name on a p5
        ("NVIDIA A100-SXM4-40GB", "", "p4d.24xlarge"),
        ("NVIDIA H100 80GB HBM3", "p5en.48xlarge", "p5en.48xlarge"),  # the node environment wins
    ],
)
def test_instance_type_from_the_environment_or_the_gpu_name(gpu_name, instance_type, expected):
    assert find_instance_type(gpu_name, instance_type).name == expected


def test_h100_peaks_are_the_datasheet_dense_numbers():
    entry = find_instance_type("NVIDIA H100 80GB HBM3")
    assert (entry.peak_bf16_tflops_per_gpu, entry.peak_fp8_tflops_per_gpu) == (989.0, 1979.0)


def test_unknown_gpu_gives_none_and_an_unknown_instance_type_falls_back_with_a_warning(caplog):
    assert find_instance_type("Tesla T4") is None
    with caplog.at_level(logging.WARNING, logger="training.hardware"):
        assert find_instance_type("NVIDIA H100 80GB HBM3", "p9.huge").name == "p5.48xlarge"
    assert "p9.huge" in caplog.text and "using the GPU name instead" in caplog.text


@pytest.mark.parametrize(
    ("gpu_name", "bf16", "fp8"),
    [
        ("NVIDIA H100 80GB HBM3", 989.0, 1979.0),  # the SXM board of p5.48xlarge
        ("NVIDIA H100 PCIe", 756.0, 1513.0),  # datasheet: 1,513 / 3,026 with sparsity
        ("NVIDIA H100 NVL", 835.0, 1670.0),  # datasheet: 1,671 / 3,341 with sparsity
        ("NVIDIA A100-PCIE-40GB", 312.0, None),
    ],
)
def test_pcie_and_nvl_boards_get_their_own_peaks_not_the_sxm_ones(gpu_name, bf16, fp8):
    peaks = find_peaks(gpu_name)
    assert (peaks.peak_bf16_tflops_per_gpu, peaks.peak_fp8_tflops_per_gpu) == (bf16, fp8)


def test_a_board_with_no_checked_peak_gets_none_not_the_sxm_peak():
    assert find_peaks("NVIDIA H200 NVL") is None  # MFU not reported rather than against 989
