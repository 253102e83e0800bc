"""Finding the instance-store NVMe devices and what is on them.

EBS volumes are NVMe devices too on Nitro instances, so a device is instance store only when the NVMe
controller says so: its model is "Amazon EC2 NVMe Instance Storage" (udev turns that into the
/dev/disk/by-id/nvme-Amazon_EC2_NVMe_Instance_Storage_<serial> names), while EBS volumes report
"Amazon Elastic Block Store" (AWS EC2 User Guide, "Amazon EBS and NVMe" and "Instance store volumes").
Three sources are read and merged (by-id links, sysfs model, `nvme list -o json`); a device any source calls
EBS is never used.
"""

from __future__ import annotations

import json
import logging
import os
import re
from dataclasses import dataclass

from node_bootstrap.errors import StepError
from node_bootstrap.host import Host
from node_bootstrap.mounts import Mount
from node_bootstrap.runner import Runner

LOG = logging.getLogger("node_bootstrap")

INSTANCE_STORE_MODEL = "Amazon EC2 NVMe Instance Storage"
EBS_MODEL = "Amazon Elastic Block Store"
BY_ID_DIR = "/dev/disk/by-id"
_PARTITION_LINK = re.compile(r"-part\d+$")


@dataclass(frozen=True)
class BlockDevice:
    name: str  # kernel name, e.g. nvme1n1
    path: str  # host path of the device node, used in commands
    found_by: tuple[str, ...]  # which sources named it instance store: by-id, sysfs, nvme-list


@dataclass(frozen=True)
class DeviceUsage:
    """What is on a device, from blkid's low-level probe, sysfs and the mount table."""

    signature: dict[str, str]  # `blkid -p -o export` fields (TYPE, LABEL, UUID); empty when blank
    holders: tuple[str, ...]  # kernel names of devices stacked on it (md127, dm-0)
    partitions: tuple[str, ...]
    mounted_at: tuple[str, ...]

    @property
    def blank(self) -> bool:
        return not (self.signature or self.holders or self.partitions or self.mounted_at)

    def describe(self) -> str:
        parts = []
        if self.signature:
            sig = self.signature.get("TYPE", "unknown signature")
            label = self.signature.get("LABEL")
            parts.append("{}{}".format(sig, f" (LABEL={label})" if label else ""))
        if self.holders:
            parts.append("in use by {}".format(", ".join(self.holders)))
        if self.partitions:
            parts.append("partitions {}".format(", ".join(self.partitions)))
        if self.mounted_at:
            parts.append("mounted at {}".format(", ".join(self.mounted_at)))
        return "; ".join(parts) or "blank"


def find_instance_store_devices(host: Host, runner: Runner) -> list[BlockDevice]:
    """The instance-store NVMe devices, sorted by kernel name; EBS volumes are excluded, whatever says so."""
    found: dict[str, tuple[str, list[str]]] = {}  # name -> (path, sources)
    ebs: set = set()

    def add(name: str, path: str, source: str) -> None:
        entry = found.setdefault(name, (path, []))
        if source not in entry[1]:
            entry[1].append(source)

    by_id = host.path(BY_ID_DIR)
    for link in sorted(os.listdir(by_id)) if os.path.isdir(by_id) else []:
        if _PARTITION_LINK.search(link):
            continue
        target = os.path.realpath(os.path.join(by_id, link))
        if "Instance_Storage" in link:
            add(os.path.basename(target), target, "by-id")
        elif "Elastic_Block_Store" in link:
            ebs.add(os.path.basename(target))

    sys_block = host.path("/sys/block")
    for name in sorted(os.listdir(sys_block)) if os.path.isdir(sys_block) else []:
        model = host.read_text(f"/sys/block/{name}/device/model", default="").strip()
        if model == INSTANCE_STORE_MODEL:
            add(name, host.path("/dev/" + name), "sysfs")
        elif model == EBS_MODEL:
            ebs.add(name)

    for device_path, model in _nvme_list(runner):
        name = os.path.basename(device_path)
        if model == INSTANCE_STORE_MODEL:
            add(name, host.path(device_path), "nvme-list")
        elif model == EBS_MODEL:
            ebs.add(name)

    devices = []
    for name in sorted(found, key=_natural_key):
        path, sources = found[name]
        if name in ebs:
            LOG.warning("scratch: %s is named instance store by %s but is an EBS volume: never touched",
                        name, "/".join(sources))
            continue
        if not os.path.exists(path):
            LOG.warning("scratch: %s (named by %s) has no device node at %s; skipped",
                        name, "/".join(sources), path)
            continue
        devices.append(BlockDevice(name, path, tuple(sources)))
    return devices


def parse_nvme_list_json(text: str) -> list[tuple[str, str]]:
    """(DevicePath, ModelNumber) pairs from `nvme list -o json` (nvme-cli 1.x and 2.x share these keys)."""
    try:
        data = json.loads(text)
    except json.JSONDecodeError:
        LOG.warning("scratch: `nvme list -o json` printed something that is not JSON; ignoring it")
        return []
    pairs = []
    for device in data.get("Devices", []) if isinstance(data, dict) else []:
        path, model = device.get("DevicePath"), device.get("ModelNumber", "")
        if isinstance(path, str) and isinstance(model, str):
            pairs.append((path, model.strip()))
    return pairs


def parse_blkid_export(text: str) -> dict[str, str]:
    """KEY=value lines of `blkid -o export` into a dict (DEVNAME is dropped)."""
    fields = {}
    for line in text.splitlines():
        key, sep, value = line.partition("=")
        if sep and key != "DEVNAME":
            fields[key.strip()] = value.strip()
    return fields


def probe_signature(runner: Runner, device_path: str) -> dict[str, str]:
    """The filesystem/RAID signature on a device, from blkid's low-level probe (not its cache).

    blkid exits 0 when it found a signature, 2 when there is none (blkid(8), RETURN CODE).
    """
    result = runner.run(["blkid", "-p", "-o", "export", device_path], mutating=False, check=False)
    if result.returncode == 0:
        return parse_blkid_export(result.stdout)
    if result.returncode == 2:
        return {}
    if result.returncode == 8:  # ambivalent: several signatures, i.e. certainly not blank
        return {"TYPE": "ambivalent (several signatures)"}
    raise StepError(f"cannot probe {device_path}: {result.describe_failure()}")


def probe_usage(host: Host, runner: Runner, device: BlockDevice, mounts: list[Mount]) -> DeviceUsage:
    sys_dir = f"/sys/block/{device.name}"
    holders = _list_dir(host, sys_dir + "/holders")
    partitions = tuple(p for p in _list_dir(host, sys_dir) if p.startswith(device.name) and p != device.name)
    real = os.path.realpath(device.path)
    mounted_at = tuple(m.mount_point for m in mounts if os.path.realpath(m.source) == real)
    return DeviceUsage(probe_signature(runner, device.path), holders, partitions, mounted_at)


@dataclass(frozen=True)
class MdArray:
    device: str  # as mdadm prints it, e.g. /dev/md/cluster-scratch
    name: str  # name=host:name field, '' when absent
    uuid: str


def parse_mdadm_scan(text: str) -> list[MdArray]:
    """ARRAY lines of `mdadm --detail --scan` (mdadm(8): the mdadm.conf format)."""
    arrays = []
    for line in text.splitlines():
        fields = line.split()
        if len(fields) < 2 or fields[0] != "ARRAY":
            continue
        attrs = dict(f.split("=", 1) for f in fields[2:] if "=" in f)
        arrays.append(MdArray(fields[1], attrs.get("name", ""), attrs.get("UUID", "")))
    return arrays


def scan_md_arrays(runner: Runner) -> list[MdArray]:
    """The assembled md arrays; none when mdadm is not installed (then none can be assembled either)."""
    if runner.which("mdadm") is None:
        return []
    return parse_mdadm_scan(runner.run(["mdadm", "--detail", "--scan"], mutating=False).stdout)


def _nvme_list(runner: Runner) -> list[tuple[str, str]]:
    if runner.which("nvme") is None:
        return []
    result = runner.run(["nvme", "list", "-o", "json"], mutating=False, check=False)
    if not result.ok:
        LOG.warning("scratch: %s; relying on by-id and sysfs", result.describe_failure())
        return []
    return parse_nvme_list_json(result.stdout)


def _list_dir(host: Host, node_path: str) -> tuple[str, ...]:
    path = host.path(node_path)
    return tuple(sorted(os.listdir(path))) if os.path.isdir(path) else ()


def _natural_key(name: str) -> tuple:
    return tuple(int(p) if p.isdigit() else p for p in re.split(r"(\d+)", name))


def md_kernel_name(host: Host, md_device: str) -> str | None:
    """md127 for /dev/md/cluster-scratch (udev's link), or None when the link does not exist."""
    path = host.path(md_device) if md_device.startswith("/dev/") else md_device
    if not os.path.exists(path):
        return None
    return os.path.basename(os.path.realpath(path))
