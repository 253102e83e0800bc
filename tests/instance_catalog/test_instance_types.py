"""The instance catalog: the facts every other part reads."""

import pytest

from instance_catalog.instance_types import INSTANCE_TYPES, UnknownInstanceType, find_by_gpu_name, get_instance_type


def test_catalog_covers_the_supported_types():
    assert sorted(INSTANCE_TYPES) == [
        "p4d.24xlarge",
        "p4de.24xlarge",
        "p5.48xlarge",
        "p5e.48xlarge",
        "p5en.48xlarge",
        "p6-b200.48xlarge",
    ]


@pytest.mark.parametrize(
    ("name", "gpus", "gpu_gib", "efa", "bf16"),
    [
        ("p5.48xlarge", 8, 80, 32, 989.0),
        ("p5e.48xlarge", 8, 141, 32, 989.0),
        ("p5en.48xlarge", 8, 141, 16, 989.0),
        ("p4d.24xlarge", 8, 40, 4, 312.0),
        ("p4de.24xlarge", 8, 80, 4, 312.0),
        ("p6-b200.48xlarge", 8, 179, 8, 2250.0),
    ],
)
def test_facts(name, gpus, gpu_gib, efa, bf16):
    entry = get_instance_type(name)
    assert (entry.gpu_count, entry.gpu_memory_gib, entry.efa_interfaces, entry.peak_bf16_tflops_per_gpu) == (
        gpus,
        gpu_gib,
        efa,
        bf16,
    )
    assert entry.efa_interfaces == entry.network_cards  # one EFA-only interface per card
    assert entry.nvme_devices == 8 and entry.on_demand_usd_per_hour > 0
    assert entry.peak_bf16_tflops_per_instance == bf16 * gpus


def test_fp8_only_from_hopper_on():
    assert not get_instance_type("p4d.24xlarge").supports_fp8
    assert get_instance_type("p5.48xlarge").peak_fp8_tflops_per_gpu == 1979.0


def test_unknown_type_lists_the_allowed_ones():
    with pytest.raises(
        UnknownInstanceType, match=r"unknown instance type 'p5\.4xlarge'; allowed: p4d\.24xlarge"
    ):
        get_instance_type("p5.4xlarge")


def test_find_by_cuda_device_name():
    assert find_by_gpu_name("NVIDIA H100 80GB HBM3").name == "p5.48xlarge"
    assert find_by_gpu_name("NVIDIA A100-SXM4-40GB").gpu_model == "A100"
    assert find_by_gpu_name("NVIDIA B200").name == "p6-b200.48xlarge"
    assert find_by_gpu_name("cpu") is None


@pytest.mark.parametrize("name", ["NVIDIA H100 PCIe", "NVIDIA H100 NVL", "NVIDIA H200 NVL", "NVIDIA A100-PCIE-40GB"])
def test_pcie_and_nvl_boards_match_no_instance_type(name):
    # same GPU model as a catalog entry, a lower peak (H100 PCIe: 756 dense BF16 TFLOP/s, not the SXM's 989)
    assert find_by_gpu_name(name) is None
