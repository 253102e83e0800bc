"""Which CPUs a GPU's data-loading thread should run on: the cores of the GPU's NUMA node.

On a two-socket P5 node each H100 hangs off one socket's PCIe root complex. A loader thread that runs on the
other socket pays cross-socket memory traffic for every pinned batch it fills, so it is kept on the cores
local to its GPU. The kernel publishes the facts in sysfs (Documentation/ABI/testing/sysfs-bus-pci,
sysfs-devices-system-node):

    /sys/bus/pci/devices/<domain:bus:device.function>/numa_node   e.g. "1"; "-1" when the platform gives none
    /sys/devices/system/node/node<N>/cpulist                      e.g. "48-95,144-191"

The GPU's PCI address comes from torch's device properties when this torch exposes them, else from the
NVIDIA driver's /proc/driver/nvidia/gpus/<address>/information (matched by GPU UUID). Both roots are
parameters so tests run on a fake tree. Anything unknown means "do not pin": pinning is an optimization,
never a reason to fail.

Why not torchrun's ``--numa-binding`` (torch >= 2.9; read in torch 2.13's torch/numa/binding.py and
torch/distributed/elastic/multiprocessing/subprocess_handler/subprocess_handler.py). It is not the same thing:

- It binds the whole worker process, every thread of it (for ``torchrun -m training`` the agent prepends
  ``numactl --physcpubind=<cpus>`` to the worker's command), where this module pins only the loader thread
  and leaves the training thread, NCCL's proxy threads and DCP's async-save threads where the scheduler puts
  them. Whether binding all of them helps or hurts on P5 has not been measured here.
- It needs the ``numactl`` executable: without it (``_raise_if_binding_invalid``: "numactl CLI is required
  for NUMA binding") torchrun's command line does not fall back (``NumaOptions.
  should_fall_back_if_binding_fails`` is False), so the worker is not started and the job fails. Whether the
  DLAMI ships numactl is not verified here; this module needs nothing beyond sysfs.
- It takes GPU ``local_rank`` to be ``cuda:<local_rank>``, and asks torch.cuda for its PCI address in the
  torchrun agent process; this module asks for the device the rank actually uses, in the rank itself.
- It exists only under torchrun; ``python -m training`` as one process on a GPU still pins here.
So ours stays (tests/training/test_numa.py pins the torch facts above, so a torch that changes them shows).
If a P5 measurement shows that binding whole ranks wins, the launcher can add ``--numa-binding=node`` (after
checking for numactl) and set ``data.numa_affinity = false``.
"""

from __future__ import annotations

import logging
import os
import re
from pathlib import Path

log = logging.getLogger(__name__)

# domain (4 or 8 hex digits, as nvidia-smi prints it), bus, device, function
_PCI_ADDRESS = re.compile(r"^(?:([0-9a-f]{1,8}):)?([0-9a-f]{1,2}):([0-9a-f]{1,2})\.([0-7])$")


def normalize_pci_bus_id(bus_id: str) -> str:
    """The sysfs form of a PCI address: lowercase with a 4-digit domain.

    nvidia-smi and NVML print ``00000000:53:00.0`` (8-digit domain); sysfs names ``0000:53:00.0``.
    """
    match = _PCI_ADDRESS.fullmatch(bus_id.strip().lower())
    if not match:
        raise ValueError(f"PCI bus id {bus_id!r}: allowed: [domain:]bus:device.function, e.g. 0000:53:00.0")
    domain, bus, device, function = match.groups()
    domain_value = int(domain or "0", 16)
    if domain_value > 0xFFFF:
        raise ValueError(f"PCI bus id {bus_id!r}: the domain {domain} does not fit sysfs' 4 hex digits")
    return f"{domain_value:04x}:{int(bus, 16):02x}:{int(device, 16):02x}.{function}"


def parse_cpulist(text: str) -> set[int]:
    """Parse the kernel's cpulist format (``0-3,8,10-11``) into a set of CPU ids; empty text is no CPUs."""
    cpus: set[int] = set()
    for part in text.strip().split(","):
        part = part.strip()
        if not part:
            continue
        first, sep, last = part.partition("-")
        if sep:
            cpus.update(range(int(first), int(last) + 1))
        else:
            cpus.add(int(first))
    return cpus


def numa_node_of_pci_device(pci_bus_id: str, *, sysfs_root: str | Path = "/sys") -> int | None:
    """The NUMA node a PCI device is attached to, or None when sysfs does not say (missing, or -1)."""
    path = Path(sysfs_root) / "bus/pci/devices" / normalize_pci_bus_id(pci_bus_id) / "numa_node"
    try:
        node = int(path.read_text().strip())
    except (OSError, ValueError):
        return None
    return node if node >= 0 else None


def numa_node_ids(*, sysfs_root: str | Path = "/sys") -> list[int]:
    """The NUMA nodes the kernel knows, from the ``node<N>`` directories."""
    node_dir = Path(sysfs_root) / "devices/system/node"
    if not node_dir.is_dir():
        return []
    return sorted(int(p.name[4:]) for p in node_dir.iterdir() if re.fullmatch(r"node\d+", p.name))


def cpus_of_numa_node(node: int, *, sysfs_root: str | Path = "/sys") -> set[int]:
    """The CPUs of NUMA node ``node`` (empty when sysfs has no cpulist for it)."""
    try:
        return parse_cpulist((Path(sysfs_root) / f"devices/system/node/node{node}/cpulist").read_text())
    except OSError:
        return set()


def pci_bus_id_for_gpu_uuid(uuid: str, *, procfs_root: str | Path = "/proc") -> str | None:
    """The PCI address of the NVIDIA GPU with ``uuid``, from the driver's per-GPU information files.

    Each ``/proc/driver/nvidia/gpus/<address>/information`` holds lines such as
    ``GPU UUID:  GPU-eaf23aa1-...`` and ``Bus Location:  0000:01:00.0``.
    """
    wanted = _bare_uuid(uuid)
    gpus_dir = Path(procfs_root) / "driver/nvidia/gpus"
    if not wanted or not gpus_dir.is_dir():
        return None
    for info_file in sorted(gpus_dir.glob("*/information")):
        try:
            fields = dict(_split_field(line) for line in info_file.read_text().splitlines() if ":" in line)
        except OSError:
            continue
        if _bare_uuid(fields.get("GPU UUID", "")) == wanted:
            return normalize_pci_bus_id(fields.get("Bus Location") or info_file.parent.name)
    return None


def cuda_device_pci_bus_id(device_index: int, *, procfs_root: str | Path = "/proc") -> str | None:
    """The PCI address of CUDA device ``device_index`` (after CUDA_VISIBLE_DEVICES), or None if unknown."""
    import torch  # the CUDA runtime is only touched when there is a CUDA device to ask about

    props = torch.cuda.get_device_properties(device_index)
    bus = getattr(props, "pci_bus_id", None)
    device = getattr(props, "pci_device_id", None)
    if isinstance(bus, int) and isinstance(device, int):
        domain = getattr(props, "pci_domain_id", 0) or 0
        return f"{domain:04x}:{bus:02x}:{device:02x}.0"  # a GPU is PCI function 0
    uuid = getattr(props, "uuid", None)
    return pci_bus_id_for_gpu_uuid(str(uuid), procfs_root=procfs_root) if uuid is not None else None


def loader_cpus_for_pci_device(pci_bus_id: str | None, *, sysfs_root: str | Path = "/sys") -> set[int] | None:
    """CPUs a loader thread for the GPU at ``pci_bus_id`` should run on, or None for "do not pin".

    None when: the address is unknown; the node has one NUMA node (nothing to gain); the device's node is
    unknown (-1); or the node's CPUs do not overlap the CPUs this process may use (a cgroup or taskset
    limit, which wins over locality).
    """
    if pci_bus_id is None or len(numa_node_ids(sysfs_root=sysfs_root)) < 2:
        return None
    node = numa_node_of_pci_device(pci_bus_id, sysfs_root=sysfs_root)
    if node is None:
        return None
    cpus = cpus_of_numa_node(node, sysfs_root=sysfs_root) & os.sched_getaffinity(0)
    return cpus or None


def loader_cpus_for_device(
    device: object, *, sysfs_root: str | Path = "/sys", procfs_root: str | Path = "/proc"
) -> set[int] | None:
    """CPUs for the loader thread of torch device ``device``; None (do not pin) for a CPU device."""
    import torch

    device = torch.device(device)
    if device.type != "cuda" or not torch.cuda.is_available():
        return None
    index = device.index if device.index is not None else torch.cuda.current_device()
    try:
        pci_bus_id = cuda_device_pci_bus_id(index, procfs_root=procfs_root)
    except (RuntimeError, ValueError) as exc:  # an odd driver answer must not stop training
        log.warning(
            "NUMA: cannot find the PCI address of cuda:%d (%s); the loader thread is not pinned", index, exc
        )
        return None
    cpus = loader_cpus_for_pci_device(pci_bus_id, sysfs_root=sysfs_root)
    log.info(
        "NUMA: cuda:%d at %s -> loader CPUs %s", index, pci_bus_id, _format_cpus(cpus) if cpus else "any"
    )
    return cpus


def maybe_pin_current_thread(cpus: set[int] | None) -> bool:
    """Restrict the calling thread to ``cpus``; does nothing for None. Returns whether it pinned.

    On Linux, sched_setaffinity with pid 0 applies to the calling thread only (sched_setaffinity(2)), so the
    training thread keeps its own affinity.
    """
    if not cpus:
        return False
    os.sched_setaffinity(0, cpus)
    return True


def _bare_uuid(uuid: str) -> str:
    uuid = uuid.strip().lower()
    return uuid[4:] if uuid.startswith("gpu-") else uuid


def _split_field(line: str) -> tuple[str, str]:
    key, _, value = line.partition(":")
    return key.strip(), value.strip()


def _format_cpus(cpus: set[int]) -> str:
    """The inverse of parse_cpulist, for log lines: {0, 1, 2, 5} -> '0-2,5'."""
    ranges: list[str] = []
    for cpu in sorted(cpus):
        if ranges and cpu == int(ranges[-1].split("-")[-1]) + 1:
            ranges[-1] = f"{ranges[-1].split('-')[0]}-{cpu}"
        else:
            ranges.append(str(cpu))
    return ",".join(ranges)
