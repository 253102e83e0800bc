"""NUMA discovery on a fake sysfs/procfs tree shaped like a two-socket P5 node."""

import os
import threading

import pytest

from training import numa

GPU0 = "0000:53:00.0"  # on node 0
GPU4 = "0000:9b:00.0"  # on node 1
ORPHAN = "0000:c8:00.0"  # numa_node -1: the platform does not say


def _write(path, text):
    path.parent.mkdir(parents=True, exist_ok=True)
    path.write_text(text)


@pytest.fixture
def sysfs(tmp_path):
    """Two NUMA nodes of 48 cores and their hyperthreads, as `lscpu` shows on p5.48xlarge."""
    root = tmp_path / "sys"
    _write(root / "devices/system/node/node0/cpulist", "0-47,96-143\n")
    _write(root / "devices/system/node/node1/cpulist", "48-95,144-191\n")
    _write(root / "devices/system/node/online", "0-1\n")
    _write(root / f"bus/pci/devices/{GPU0}/numa_node", "0\n")
    _write(root / f"bus/pci/devices/{GPU4}/numa_node", "1\n")
    _write(root / f"bus/pci/devices/{ORPHAN}/numa_node", "-1\n")
    return root


@pytest.fixture
def all_cpus_allowed(monkeypatch):
    monkeypatch.setattr(numa.os, "sched_getaffinity", lambda pid: set(range(192)))


@pytest.mark.parametrize(
    ("given", "sysfs_form"),
    [
        ("00000000:53:00.0", "0000:53:00.0"),  # nvidia-smi / NVML: 8-digit domain
        ("0000:9B:00.0", "0000:9b:00.0"),  # uppercase hex
        ("53:00.0", "0000:53:00.0"),  # no domain
        (" 0001:0a:1f.3 ", "0001:0a:1f.3"),
    ],
)
def test_normalize_pci_bus_id(given, sysfs_form):
    assert numa.normalize_pci_bus_id(given) == sysfs_form


def test_normalize_rejects_garbage():
    with pytest.raises(ValueError, match=r"PCI bus id 'GPU-1234': allowed: \[domain:\]bus:device.function"):
        numa.normalize_pci_bus_id("GPU-1234")


def test_parse_cpulist():
    assert numa.parse_cpulist("0-3,8,10-11\n") == {0, 1, 2, 3, 8, 10, 11}
    assert numa.parse_cpulist("") == set()
    assert numa._format_cpus({0, 1, 2, 5, 7, 8}) == "0-2,5,7-8"


def test_two_nodes_each_gpu_gets_its_own_node_cpus(sysfs, all_cpus_allowed):
    assert numa.numa_node_ids(sysfs_root=sysfs) == [0, 1]
    assert numa.numa_node_of_pci_device("00000000:9B:00.0", sysfs_root=sysfs) == 1
    assert numa.loader_cpus_for_pci_device(GPU0, sysfs_root=sysfs) == set(range(48)) | set(range(96, 144))
    assert numa.loader_cpus_for_pci_device(GPU4, sysfs_root=sysfs) == set(range(48, 96)) | set(
        range(144, 192)
    )


def test_unknown_node_missing_device_or_address_means_no_pinning(sysfs, all_cpus_allowed):
    assert numa.numa_node_of_pci_device(ORPHAN, sysfs_root=sysfs) is None
    assert numa.loader_cpus_for_pci_device(ORPHAN, sysfs_root=sysfs) is None
    assert numa.loader_cpus_for_pci_device("0000:01:00.0", sysfs_root=sysfs) is None  # not in sysfs
    assert numa.loader_cpus_for_pci_device(None, sysfs_root=sysfs) is None


def test_a_single_node_machine_is_not_pinned(tmp_path, all_cpus_allowed):
    root = tmp_path / "sys"
    _write(root / "devices/system/node/node0/cpulist", "0-7\n")
    _write(root / f"bus/pci/devices/{GPU0}/numa_node", "0\n")
    assert numa.loader_cpus_for_pci_device(GPU0, sysfs_root=root) is None


def test_cpus_outside_the_process_affinity_are_dropped(sysfs, monkeypatch):
    monkeypatch.setattr(numa.os, "sched_getaffinity", lambda pid: {0, 1, 2, 50, 51})  # e.g. taskset / cgroup
    assert numa.loader_cpus_for_pci_device(GPU0, sysfs_root=sysfs) == {0, 1, 2}
    monkeypatch.setattr(numa.os, "sched_getaffinity", lambda pid: {50})
    assert numa.loader_cpus_for_pci_device(GPU0, sysfs_root=sysfs) is None  # no overlap: do not pin


def test_gpu_uuid_to_pci_address_from_the_driver_information(tmp_path):
    proc = tmp_path / "proc"
    for address, uuid in [("0000:53:00.0", "aaaaaaaa-1111"), ("0000:9b:00.0", "bbbbbbbb-2222")]:
        # the driver's file uses tabs and spaces between key and value
        _write(
            proc / f"driver/nvidia/gpus/{address}/information",
            f"Model: \t\t NVIDIA H100 80GB HBM3\nIRQ:   \t\t 77\nGPU UUID: \t GPU-{uuid}\n"
            f"Bus Type: \t PCIe\nBus Location: \t {address}\nDevice Minor: \t 0\n",
        )
    # torch prints the UUID without the "GPU-" prefix; nvidia-smi with it
    assert numa.pci_bus_id_for_gpu_uuid("bbbbbbbb-2222", procfs_root=proc) == "0000:9b:00.0"
    assert numa.pci_bus_id_for_gpu_uuid("GPU-AAAAAAAA-1111", procfs_root=proc) == "0000:53:00.0"
    assert numa.pci_bus_id_for_gpu_uuid("cccccccc-3333", procfs_root=proc) is None
    assert numa.pci_bus_id_for_gpu_uuid("aaaaaaaa-1111", procfs_root=tmp_path / "no-driver") is None


def test_a_cpu_device_is_never_pinned():
    assert numa.loader_cpus_for_device("cpu") is None


def test_pinning_applies_to_the_calling_thread_only():
    allowed = os.sched_getaffinity(0)
    target = {min(allowed)}
    seen = {}

    def body():
        seen["pinned"] = numa.maybe_pin_current_thread(target)
        seen["thread"] = os.sched_getaffinity(0)

    thread = threading.Thread(target=body)
    thread.start()
    thread.join()
    assert seen == {"pinned": True, "thread": target}
    assert os.sched_getaffinity(0) == allowed
    assert numa.maybe_pin_current_thread(None) is False


class _Props:
    """What torch.cuda.get_device_properties returns, for the fields numa.py reads."""

    def __init__(self, uuid, **pci):
        self.uuid = uuid
        self.__dict__.update(pci)


def test_a_cuda_device_resolves_through_uuid_to_its_node_cpus(sysfs, tmp_path, monkeypatch, all_cpus_allowed):
    # the CPU-only CI has no CUDA runtime: only torch's device query is replaced, the rest reads the fake tree
    import torch

    proc = tmp_path / "proc"
    _write(
        proc / f"driver/nvidia/gpus/{GPU4}/information",
        f"GPU UUID: \t GPU-bbbbbbbb-2222\nBus Location: \t {GPU4}\n",
    )
    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: _Props("bbbbbbbb-2222"))
    cpus = numa.loader_cpus_for_device("cuda:4", sysfs_root=sysfs, procfs_root=proc)
    assert cpus == set(range(48, 96)) | set(range(144, 192))


def test_pci_fields_of_the_device_properties_win_when_present(monkeypatch):
    import torch

    props = _Props("unused", pci_domain_id=0, pci_bus_id=0x53, pci_device_id=0)
    monkeypatch.setattr(torch.cuda, "get_device_properties", lambda index: props)
    assert numa.cuda_device_pci_bus_id(0, procfs_root="/nonexistent") == "0000:53:00.0"


def test_the_torch_facts_that_keep_our_loader_pinning(monkeypatch):
    """training/numa.py's docstring says why torchrun's --numa-binding does not replace it; these are the torch
    2.13 facts it rests on. A torch that changes them fails here, and the choice should be made again."""
    from torch.numa import binding

    # the whole worker command is wrapped in numactl: every thread of the rank is bound, not a loader thread
    assert binding._assemble_numactl_command_args(
        original_command_args=("python", "-m", "training"), logical_cpu_indices={0, 1, 2, 5}
    ) == ("numactl", "--physcpubind=0-2,5", "python", "-m", "training")
    # numactl is required, and torchrun's --numa-binding does not fall back without it
    monkeypatch.setattr(binding.shutil, "which", lambda name: None)
    with pytest.raises(RuntimeError, match="numactl CLI is required"):
        binding._raise_if_binding_invalid(logical_cpu_indices={0})
    assert binding.NumaOptions(affinity_mode=binding.AffinityMode.NODE).should_fall_back_if_binding_fails is False
