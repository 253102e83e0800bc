"""The instance catalog: the single source of truth for per-instance-type facts.

The launch template (EFA interfaces), node_bootstrap's expected counts (rendered into the node config at
synth), training's MFU (peak TFLOP/s) and clusterctl's cost estimates all read this table. It is plain
Python with no CDK import, so the training package and clusterctl can use it on machines without aws-cdk-lib,
and it stays Python 3.9 compatible because it is shipped to the nodes inside the bootstrap bundle.

Sources (checked 2026-11):
- Hardware: AWS EC2 User Guide, "Accelerated computing instances" specifications (GPUs, GPU memory, vCPUs,
  network cards, instance store) and "Maximize network bandwidth on instances with multiple network cards"
  (EFA layout: one EFA-only interface per network card; p5/p5e 32, p5en 16, p4d/p4de 4, p6-b200 8).
- NVSwitch: every type here is an HGX baseboard whose 8 GPUs are joined by NVSwitches (A100, H100, H200,
  B200 HGX); on those, NVIDIA's Fabric Manager must configure the switches before a CUDA context can be made
  (NVIDIA Fabric Manager User Guide: "CUDA initialization fails with cudaErrorSystemNotReady" while it is
  not running).
- Peak dense (no sparsity) tensor throughput per GPU: NVIDIA datasheets. A100 SXM: 312 BF16, no FP8.
  H100 SXM and H200 SXM: 989 BF16, 1979 FP8. B200 (HGX B200): 2250 BF16, 4500 FP8.
- On-demand price: Linux, us-east-1, USD per instance-hour, after the June 2025 P4/P5 price reduction. Only
  p5en.48xlarge's figure was checked against a public listing (63.296, August 2026); the others are the
  post-reduction list prices as published in June 2025 and were not re-checked against the AWS Price List API
  (`aws pricing get-products`). Prices differ by region and change; clusterctl labels its cost figures as
  estimates from this table.
- FSx for Lustre EFA clients: FSx for Lustre User Guide, "Configuring EFA clients": EFA to an EFA-enabled file
  system is supported on Nitro v4 or later instance types that support EFA (not trn2); its interface table
  lists p5, p5e, p5en and p6-b200. p4d and p4de are Nitro v3 (EC2 instance types guide, "Nitro System").
"""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class InstanceType:
    """Facts about one accelerated EC2 instance type that the cluster depends on."""

    name: str  # EC2 instance type, e.g. "p5.48xlarge"
    gpu_model: str  # short NVIDIA model name, matched against the CUDA device name ("H100")
    gpu_count: int  # GPUs per instance
    gpu_memory_gib: int  # memory per GPU, GiB
    vcpus: int
    memory_gib: int  # host memory
    network_cards: int  # network cards; the recommended EFA layout uses one EFA-only interface per card
    efa_interfaces: int  # EFA devices that `fi_info -p efa` lists on a correctly wired instance
    nvme_devices: int  # instance-store NVMe SSDs
    nvme_device_gb: int  # size of each instance-store device, GB
    nvswitch: bool  # GPUs joined by NVSwitches (HGX baseboards): CUDA needs NVIDIA Fabric Manager running
    peak_bf16_tflops_per_gpu: float  # dense BF16 tensor-core peak, TFLOP/s
    peak_fp8_tflops_per_gpu: float | None  # dense FP8 peak, None where the GPU has no FP8 tensor cores
    on_demand_usd_per_hour: float  # us-east-1 Linux on-demand price per instance
    fsx_efa_client: bool  # FSx for Lustre supports it as an EFA client (Nitro v4+ with EFA)

    @property
    def supports_fp8(self) -> bool:
        return self.peak_fp8_tflops_per_gpu is not None

    @property
    def peak_bf16_tflops_per_instance(self) -> float:
        return self.peak_bf16_tflops_per_gpu * self.gpu_count

    @property
    def vcpus_per_gpu(self) -> int:
        return self.vcpus // self.gpu_count


_CATALOG: tuple[InstanceType, ...] = (
    InstanceType(
        name="p4d.24xlarge",
        gpu_model="A100",
        gpu_count=8,
        gpu_memory_gib=40,
        vcpus=96,
        memory_gib=1152,
        network_cards=4,
        efa_interfaces=4,
        nvme_devices=8,
        nvme_device_gb=1000,
        nvswitch=True,
        peak_bf16_tflops_per_gpu=312.0,
        peak_fp8_tflops_per_gpu=None,
        on_demand_usd_per_hour=21.96,
        fsx_efa_client=False,
    ),
    InstanceType(
        name="p4de.24xlarge",
        gpu_model="A100",
        gpu_count=8,
        gpu_memory_gib=80,
        vcpus=96,
        memory_gib=1152,
        network_cards=4,
        efa_interfaces=4,
        nvme_devices=8,
        nvme_device_gb=1000,
        nvswitch=True,
        peak_bf16_tflops_per_gpu=312.0,
        peak_fp8_tflops_per_gpu=None,
        on_demand_usd_per_hour=27.45,
        fsx_efa_client=False,
    ),
    InstanceType(
        name="p5.48xlarge",
        gpu_model="H100",
        gpu_count=8,
        gpu_memory_gib=80,
        vcpus=192,
        memory_gib=2048,
        network_cards=32,
        efa_interfaces=32,
        nvme_devices=8,
        nvme_device_gb=3840,
        nvswitch=True,
        peak_bf16_tflops_per_gpu=989.0,
        peak_fp8_tflops_per_gpu=1979.0,
        on_demand_usd_per_hour=55.04,
        fsx_efa_client=True,
    ),
    InstanceType(
        name="p5e.48xlarge",
        gpu_model="H200",
        gpu_count=8,
        gpu_memory_gib=141,
        vcpus=192,
        memory_gib=2048,
        network_cards=32,
        efa_interfaces=32,
        nvme_devices=8,
        nvme_device_gb=3840,
        nvswitch=True,
        peak_bf16_tflops_per_gpu=989.0,
        peak_fp8_tflops_per_gpu=1979.0,
        on_demand_usd_per_hour=62.12,
        fsx_efa_client=True,
    ),
    InstanceType(
        name="p5en.48xlarge",
        gpu_model="H200",
        gpu_count=8,
        gpu_memory_gib=141,
        vcpus=192,
        memory_gib=2048,
        network_cards=16,
        efa_interfaces=16,
        nvme_devices=8,
        nvme_device_gb=3840,
        nvswitch=True,
        peak_bf16_tflops_per_gpu=989.0,
        peak_fp8_tflops_per_gpu=1979.0,
        on_demand_usd_per_hour=63.30,
        fsx_efa_client=True,
    ),
    InstanceType(
        name="p6-b200.48xlarge",
        gpu_model="B200",
        gpu_count=8,
        gpu_memory_gib=179,
        vcpus=192,
        memory_gib=2048,
        network_cards=8,
        efa_interfaces=8,
        nvme_devices=8,
        nvme_device_gb=3840,
        nvswitch=True,
        peak_bf16_tflops_per_gpu=2250.0,
        peak_fp8_tflops_per_gpu=4500.0,
        on_demand_usd_per_hour=113.93,
        fsx_efa_client=True,
    ),
)

INSTANCE_TYPES: dict[str, InstanceType] = {t.name: t for t in _CATALOG}


class UnknownInstanceType(KeyError):
    """Raised for an instance type that is not in the catalog; the message lists the known ones."""

    def __str__(self) -> str:  # KeyError would print the repr with quotes
        return str(self.args[0])


def get_instance_type(name: str) -> InstanceType:
    """The catalog entry for `name`, or UnknownInstanceType naming the allowed values."""
    try:
        return INSTANCE_TYPES[name]
    except KeyError:
        allowed = ", ".join(sorted(INSTANCE_TYPES))
        raise UnknownInstanceType(f"unknown instance type {name!r}; allowed: {allowed}") from None


# CUDA device names of PCIe and NVL boards carry these words ("NVIDIA H100 PCIe", "NVIDIA H100 NVL"). No
# instance type here has such a board, and their peaks are lower than the SXM parts': a name with one of
# them matches no entry.
NON_SXM_BOARD_MARKERS = ("PCIE", "NVL")


def find_by_gpu_name(device_name: str) -> InstanceType | None:
    """The first catalog entry whose GPU model appears in a CUDA device name, e.g.
    "NVIDIA H100 80GB HBM3" -> p5.48xlarge; None for a PCIe or NVL board of that model ("NVIDIA H100 PCIe"),
    which no catalog instance carries. Used by training to find its MFU peak when it is not told the
    instance type."""
    upper = device_name.upper()
    if any(marker in upper for marker in NON_SXM_BOARD_MARKERS):
        return None
    for entry in _CATALOG:
        if entry.gpu_model in upper:
            return entry
    return None
