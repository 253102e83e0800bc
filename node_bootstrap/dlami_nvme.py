"""The Deep Learning AMI's own instance-store set-up, and the race user-data runs into.

The DLAMI ships `dlami-nvme.service` (Type=oneshot, RemainAfterExit, After=network-online.target, WantedBy
multi-user.target) running /opt/aws/dlami/bin/nvme_ephemeral_drives.sh, derived from ParallelCluster's
setup-ephemeral-drives.sh (aws-parallelcluster-cookbook, cookbooks/aws-parallelcluster-environment/files/
setup-ephemeral-drives.sh): it puts every instance-store device into the LVM volume group `vg.01`, creates the
striped logical volume `lv_ephemeral` (`lvcreate -i N -I 64 -l 100%FREE`), formats it ext4 and mounts it
`noatime,nodiratime` at /opt/dlami/nvme. Nothing orders cloud-init's user-data after that service on Amazon
Linux 2023, so the scratch step can find the devices already carrying an LVM label, or held by the device
mapper, while nothing is mounted yet. That is the AMI at work, not foreign data: wait for the service (or
start it: `systemctl start` on a running oneshot unit waits for the running job), bounded, then reuse its
mount. Real foreign data (another volume group, a filesystem) is still refused by scratch.py.
"""

from __future__ import annotations

import logging
import os
from dataclasses import dataclass

from node_bootstrap.disks import BlockDevice, DeviceUsage
from node_bootstrap.host import Host
from node_bootstrap.runner import Runner

LOG = logging.getLogger("node_bootstrap")

UNIT = "dlami-nvme.service"
VOLUME_GROUP = "vg.01"
LOGICAL_VOLUME = "lv_ephemeral"
MAPPER_NAME = f"{VOLUME_GROUP}-{LOGICAL_VOLUME}"  # the device-mapper name LVM gives vg.01/lv_ephemeral
MAPPER_DEVICE = "/dev/mapper/" + MAPPER_NAME
MOUNT_OPTIONS = "noatime,nodiratime"  # the DLAMI script's own options
WAIT_TIMEOUT_S = 600.0  # striping 8 devices and a lazily initialised ext4 take well under a minute
LVM_MEMBER = "LVM2_member"  # blkid's TYPE for an LVM physical volume


@dataclass(frozen=True)
class UnitState:
    """`systemctl show` properties of dlami-nvme.service."""

    load_state: str  # loaded, not-found, masked
    active_state: str  # active, activating, inactive, failed
    sub_state: str  # exited, start, dead, failed
    result: str  # success, exit-code, timeout, ...
    unit_file_state: str  # enabled, disabled, static, masked

    @property
    def installed(self) -> bool:
        return self.load_state == "loaded"

    @property
    def pending(self) -> bool:
        """Running now, or enabled for this boot and not run yet: its devices are about to be used by it."""
        if not self.installed:
            return False
        if self.active_state == "activating":
            return True
        return self.active_state == "inactive" and self.unit_file_state in ("enabled", "enabled-runtime")

    def describe(self) -> str:
        return f"{UNIT} is {self.active_state} ({self.sub_state}, result {self.result}, {self.unit_file_state})"


SHOW_PROPERTIES = ("LoadState", "ActiveState", "SubState", "Result", "UnitFileState")


def probe_unit(runner: Runner) -> UnitState | None:
    """The service's state; None where there is no systemd or no such unit (not a DLAMI)."""
    if runner.which("systemctl") is None:
        return None
    argv = ["systemctl", "show", UNIT, "--no-pager"] + [f"--property={p}" for p in SHOW_PROPERTIES]
    result = runner.run(argv, mutating=False, check=False)
    if not result.ok:
        return None
    values = dict(line.split("=", 1) for line in result.stdout.splitlines() if "=" in line)
    state = UnitState(*(values.get(p, "") for p in SHOW_PROPERTIES))
    return state if state.installed else None


def wait_for_unit(runner: Runner) -> None:
    """Start the unit, or join its running start job, and wait for it (bounded by WAIT_TIMEOUT_S)."""
    result = runner.run(["systemctl", "start", UNIT], mutating=True, check=False, timeout=WAIT_TIMEOUT_S)
    if not result.ok:
        # Its script reports most errors and exits 0; a failure here is worth logging, and the caller
        # re-probes the mount either way.
        LOG.warning("scratch: %s", result.describe_failure())


def owned_by_dlami(host: Host, usage: DeviceUsage, pv_groups: dict[str, str], device: BlockDevice) -> bool:
    """True when the device is an LVM physical volume of the DLAMI's volume group (and nothing else is on it).

    The group comes from `pvs` where it answers, else from the device mapper holding the device
    (/sys/block/dm-N/dm/name is "vg.01-lv_ephemeral").
    """
    if usage.signature.get("TYPE") != LVM_MEMBER or usage.partitions or usage.mounted_at:
        return False
    group = pv_groups.get(os.path.realpath(device.path)) or pv_groups.get(device.path)
    if group is not None:
        return group == VOLUME_GROUP
    names = [host.read_text(f"/sys/block/{h}/dm/name", default="").strip() for h in usage.holders]
    return bool(names) and all(n == MAPPER_NAME for n in names)


def probe_pv_groups(host: Host, runner: Runner) -> dict[str, str]:
    """Physical volume -> volume group, from `pvs`; empty where LVM is not installed or does not answer."""
    if runner.which("pvs") is None:
        return {}
    result = runner.run(["pvs", "--noheadings", "--separator", "|", "-o", "pv_name,vg_name"], mutating=False,
                        check=False)
    groups = {}
    for line in result.stdout.splitlines() if result.ok else []:
        name, sep, group = line.strip().partition("|")
        if sep and name:
            groups[os.path.realpath(host.path(name)) if name.startswith("/") else name] = group.strip()
    return groups
