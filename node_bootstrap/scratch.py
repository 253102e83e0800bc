"""Step 1, scratch: one fast scratch directory on the instance-store NVMe devices.

The Deep Learning AMI stripes the instance store itself (dlami-nvme.service: LVM vg.01/lv_ephemeral, ext4, at
/opt/dlami/nvme; see dlami_nvme.py), racing user-data: when the service is still at work, the step waits for
it (bounded), and devices in the AMI's volume group are the AMI's, not foreign. Its mount is then reused: the
scratch mount point becomes a symlink to it (a bind mount in fstab could bind the empty directory at boot,
before the DLAMI's own service has mounted the array, and silently fill the root volume). Otherwise the
devices become one md RAID0 (one device: no RAID) with a stripe-aligned XFS, mounted noatime and persisted in
fstab with nofail (an instance store is empty again after a stop/start, and boot must not hang on it).

Checks before acts, in the amazon-eks-ami setup-local-disks manner: an array, filesystem, mount or fstab entry
that is already right is left alone, so a second run plans nothing. A device that holds anything this step did
not create (a filesystem, a foreign array, partitions, a mount) is refused with an error saying what is on it.
"""

from __future__ import annotations

import os

from node_bootstrap import dlami_nvme
from node_bootstrap.config import NodeConfig
from node_bootstrap.disks import (
    BlockDevice,
    DeviceUsage,
    find_instance_store_devices,
    md_kernel_name,
    probe_signature,
    probe_usage,
    scan_md_arrays,
)
from node_bootstrap.errors import StepError
from node_bootstrap.host import Host
from node_bootstrap.mounts import FstabEntry, find_mount, fstab_has_entry, persist_fstab_entry, read_mounts
from node_bootstrap.plan import StepPlan, execute_plan
from node_bootstrap.runner import Runner

ARRAY_NAME = "cluster-scratch"  # md array name; created with --homehost=any so it keeps its name anywhere
ARRAY_DEVICE = "/dev/md/" + ARRAY_NAME  # udev's link to the array (mdadm(8), "DEVICE NAMES")
FS_LABEL = "cl-scratch"  # XFS labels hold at most 12 characters (mkfs.xfs(8) -L)
CHUNK_KIB = 512  # mdadm's default RAID0 chunk, written explicitly so the XFS stripe unit matches it
MOUNT_OPTIONS = "noatime"
FSTAB_OPTIONS = "defaults,noatime,nofail"
CREATE, ASSEMBLE, READY = "create", "assemble", "ready"  # what the device or array needs


def plan_scratch(config: NodeConfig, host: Host, runner: Runner, *, waited_for_dlami: bool = False) -> StepPlan:
    plan = StepPlan("scratch")
    mount_point = config.scratch.mount_point
    dlami = find_mount(host, config.scratch.dlami_mount_point)
    if dlami is not None:
        _plan_dlami_reuse(plan, config, host, dlami.source)
        return plan
    unit = dlami_nvme.probe_unit(runner)
    if unit is not None and unit.pending and not waited_for_dlami:
        plan.note(f"{unit.describe()}: the AMI is setting up the instance store itself")

        def wait_then_reuse() -> None:
            dlami_nvme.wait_for_unit(runner)
            execute_plan(plan_scratch(config, host, runner, waited_for_dlami=True), runner, dry_run=False)

        plan.add(f"wait for the DLAMI's {dlami_nvme.UNIT} to finish (at most {dlami_nvme.WAIT_TIMEOUT_S:.0f} s), "
                 f"then reuse its mount at {config.scratch.dlami_mount_point}", apply=wait_then_reuse)
        return plan

    devices = find_instance_store_devices(host, runner)
    expected = config.expected.nvme_device_count
    plan.note("instance-store devices: " + (", ".join(_describe(d) for d in devices) or "none"))
    if not devices:
        raise StepError(
            f"no instance-store NVMe devices found (expected {expected} for {config.instance_type}) "
            f"and nothing is mounted at {config.scratch.dlami_mount_point}"
        )
    if len(devices) != expected:
        plan.note(f"WARNING: found {len(devices)} instance-store devices, the catalog says {expected} for "
                  f"{config.instance_type}; using the {len(devices)} found")

    mounts = read_mounts(host)
    usage = {d.name: probe_usage(host, runner, d, mounts) for d in devices}
    lvm = [d for d in devices if usage[d.name].signature.get("TYPE") == dlami_nvme.LVM_MEMBER]
    pv_groups = dlami_nvme.probe_pv_groups(host, runner) if lvm else {}
    amis = [d for d in lvm if dlami_nvme.owned_by_dlami(host, usage[d.name], pv_groups, d)]
    if amis:
        _plan_dlami_volume(plan, config, host, runner, unit, amis, devices)
        return plan
    if len(devices) == 1:
        target = devices[0].path
        state = _plan_single_device(devices[0], usage[devices[0].name])
    else:
        target, state = _plan_array(plan, host, runner, devices, usage)
    if state == ASSEMBLE:
        # The filesystem on an array can only be probed once the array is assembled: finish the plan then.
        def finish() -> None:
            rest = StepPlan("scratch")
            _plan_filesystem_and_mount(rest, host, runner, mount_point, target, False, len(devices))
            execute_plan(rest, runner, dry_run=False)

        plan.add("then probe the filesystem on the assembled array, mount it and persist it", apply=finish)
        return plan
    _plan_filesystem_and_mount(plan, host, runner, mount_point, target, state == CREATE, len(devices))
    return plan


def _plan_dlami_reuse(plan: StepPlan, config: NodeConfig, host: Host, source: str) -> None:
    dlami_mp, mount_point = config.scratch.dlami_mount_point, config.scratch.mount_point
    plan.note(f"the DLAMI already mounted the instance store at {dlami_mp} ({source}): reusing it")
    if mount_point == dlami_mp:
        return
    link = host.path(mount_point)
    if os.path.islink(link):
        if os.readlink(link) == dlami_mp:
            return
        raise StepError(f"{mount_point} is a symlink to {os.readlink(link)}, not to the DLAMI's "
                        f"instance-store mount {dlami_mp}")
    if find_mount(host, mount_point) is not None:
        raise StepError(f"{mount_point} is already a mount point while the DLAMI uses the instance store at "
                        f"{dlami_mp}; unmount it or set scratch.mountPoint to {dlami_mp}")
    if _occupied(link):
        raise StepError(f"{mount_point} exists and is not an empty directory; move it away so it can "
                        f"point to {dlami_mp}")
    plan.add(f"link {mount_point} to the DLAMI's instance-store mount {dlami_mp}",
             apply=lambda: host.symlink(dlami_mp, mount_point))
    plan.verify = lambda: _verify_dlami_link(host, mount_point, dlami_mp)


def _plan_dlami_volume(plan: StepPlan, config: NodeConfig, host: Host, runner: Runner,
                       unit: dlami_nvme.UnitState | None, amis: list[BlockDevice],
                       devices: list[BlockDevice]) -> None:
    """The devices belong to the DLAMI's volume group but nothing is mounted: finish the AMI's mount, or say
    exactly what is wrong. Never wipe the AMI's volume group here."""
    dlami_mp = config.scratch.dlami_mount_point
    state = unit.describe() if unit is not None else f"{dlami_nvme.UNIT} is not installed"
    others = [d for d in devices if d not in amis]
    if others:
        raise StepError(f"{_paths(amis)} are in the DLAMI's volume group {dlami_nvme.VOLUME_GROUP} but "
                        f"{_paths(others)} are not ({state}); the AMI's set-up is incomplete: see "
                        f"`journalctl -u {dlami_nvme.UNIT}`")
    plan.note(f"{_paths(amis)} are in the DLAMI's volume group {dlami_nvme.VOLUME_GROUP}, nothing is mounted at "
              f"{dlami_mp}; {state}")
    signature = probe_signature(runner, host.path(dlami_nvme.MAPPER_DEVICE)) \
        if host.exists(dlami_nvme.MAPPER_DEVICE) else {}
    if signature.get("TYPE") != "ext4":
        raise StepError(
            f"the instance store is in the DLAMI's volume group {dlami_nvme.VOLUME_GROUP}, but "
            f"{dlami_nvme.MAPPER_DEVICE} holds no ext4 filesystem and {state}: the AMI's set-up did not finish "
            f"(see `journalctl -u {dlami_nvme.UNIT}`). To hand the devices to node_bootstrap instead: "
            f"`systemctl disable --now {dlami_nvme.UNIT}; vgremove -y {dlami_nvme.VOLUME_GROUP}; pvremove "
            f"{' '.join(host.node_path(d.path) for d in amis)}`, then run the scratch step again"
        )
    plan.add(f"create the DLAMI's mount point {dlami_mp}", apply=lambda: host.makedirs(dlami_mp))
    plan.add(f"mount the DLAMI's volume {dlami_nvme.MAPPER_DEVICE} at {dlami_mp} as its service would",
             argv=("mount", "-t", "ext4", "-o", dlami_nvme.MOUNT_OPTIONS, host.path(dlami_nvme.MAPPER_DEVICE),
                   host.path(dlami_mp)))
    _plan_dlami_reuse(plan, config, host, dlami_nvme.MAPPER_DEVICE)


def _verify_dlami_link(host: Host, mount_point: str, dlami_mp: str) -> None:
    if not host.exists(mount_point) or os.readlink(host.path(mount_point)) != dlami_mp:
        raise StepError(f"{mount_point} does not point to {dlami_mp} after linking it")


def _plan_single_device(device: BlockDevice, usage: DeviceUsage) -> str:
    """CREATE for a blank device, READY for one holding our filesystem; raises for anything else."""
    if usage.blank:
        return CREATE
    if usage.signature.get("LABEL") == FS_LABEL and not (usage.holders or usage.partitions):
        return READY
    raise _foreign_error({device.path: usage})


def _plan_array(plan: StepPlan, host: Host, runner: Runner, devices: list[BlockDevice],
                usage: dict[str, DeviceUsage]):
    """(array device host path, CREATE | ASSEMBLE | READY)."""
    array_path = host.path(ARRAY_DEVICE)
    assembled = [a for a in scan_md_arrays(runner) if _is_ours(a.name) or a.device == ARRAY_DEVICE]
    md_name = md_kernel_name(host, ARRAY_DEVICE) if assembled else None
    members, blank, foreign = [], [], {}
    for d in devices:
        u = usage[d.name]
        if md_name is not None and u.holders == (md_name,) and not u.partitions:
            members.append(d)
        elif u.signature.get("TYPE") == "linux_raid_member" and _is_ours(u.signature.get("LABEL", "")) \
                and not (u.holders or u.partitions or u.mounted_at):
            members.append(d)
        elif u.blank:
            blank.append(d)
        else:
            foreign[d.path] = u
    if foreign:
        raise _foreign_error(foreign)
    paths = [d.path for d in devices]
    if not members:
        plan.add(
            f"create RAID0 {ARRAY_DEVICE} across {len(devices)} instance-store devices "
            f"(chunk {CHUNK_KIB} KiB)",
            # No --run: should a device hold a signature after all, mdadm asks, reads EOF and aborts.
            argv=("mdadm", "--create", array_path, "--level=0", f"--chunk={CHUNK_KIB}",
                  "--metadata=1.2", "--homehost=any", "--name=" + ARRAY_NAME,
                  f"--raid-devices={len(devices)}", *paths),
        )
        return array_path, CREATE
    if blank:
        raise StepError(
            f"the scratch array is incomplete: {_paths(members)} belong to {ARRAY_NAME} but "
            f"{_paths(blank)} are blank (a replaced device?); RAID0 cannot be repaired: stop the array and "
            "wipe the members (wipefs -a) to rebuild it"
        )
    if md_name is None:
        plan.add(f"assemble the existing scratch array {ARRAY_DEVICE}",
                 argv=("mdadm", "--assemble", array_path, *paths))
        return array_path, ASSEMBLE
    plan.note(f"RAID0 {ARRAY_DEVICE} ({md_name}) is assembled from {len(members)} devices")
    return array_path, READY


def _plan_filesystem_and_mount(plan: StepPlan, host: Host, runner: Runner, mount_point: str, target: str,
                               creating: bool, device_count: int) -> None:
    fstype: str | None = None
    if not creating:
        signature = probe_signature(runner, target)
        if not signature:
            creating = True  # an array we created whose mkfs never ran (an interrupted first boot)
        elif signature.get("LABEL") != FS_LABEL:
            raise _foreign_error({target: DeviceUsage(signature, (), (), ())})
        else:
            fstype = signature.get("TYPE")
            plan.note(f"{target} holds the scratch filesystem ({fstype}, UUID={signature.get('UUID')})")
    if creating:
        fstype, argv = _mkfs_command(runner, target, device_count)
        stripes = f" aligned to {device_count} x {CHUNK_KIB} KiB stripes" if device_count > 1 else ""
        plan.add(f"make a {fstype} filesystem on {target}{stripes}", argv=argv)

    mounted = find_mount(host, mount_point)
    if mounted is not None:
        if os.path.realpath(mounted.source) != os.path.realpath(target):
            raise StepError(f"{mount_point} is already mounted from {mounted.source}, not from the scratch "
                            f"device {target}; unmount it first")
        plan.note(f"{mount_point} is mounted from {mounted.source}")
    else:
        host_mp = host.path(mount_point)
        if os.path.islink(host_mp) or _occupied(host_mp):
            raise StepError(f"{mount_point} exists and is not an empty directory; mounting over it would "
                            "hide its contents")
        plan.add(f"create the mount point {mount_point}", apply=lambda: host.makedirs(mount_point))
        plan.add(f"mount {target} at {mount_point} ({MOUNT_OPTIONS})",
                 argv=("mount", "-t", fstype or "auto", "-o", MOUNT_OPTIONS, target, host_mp))

    def persist() -> None:  # the UUID exists only once mkfs has run
        persist_fstab_entry(host, runner, _fstab_entry(runner, target, mount_point, fstype), "instance-store scratch")

    if creating or not fstab_has_entry(host, _fstab_entry(runner, target, mount_point, fstype)):
        plan.add(f"persist {mount_point} in /etc/fstab by filesystem UUID ({FSTAB_OPTIONS})", apply=persist)
    plan.verify = lambda: _verify_mounted(host, mount_point)


def _mkfs_command(runner: Runner, target: str, device_count: int):
    """(fstype, argv): XFS with stripe unit and width from the RAID geometry; ext4 without mkfs.xfs."""
    if runner.which("mkfs.xfs") is not None:
        argv = ["mkfs.xfs", "-L", FS_LABEL]
        if device_count > 1:
            argv += ["-d", f"su={CHUNK_KIB}k,sw={device_count}"]  # mkfs.xfs(8): stripe unit and width
            # The log stripe unit follows the data stripe unit, but may be at most 256 KiB (mkfs.xfs(8), -l su):
            # with 512 KiB chunks mkfs.xfs warns and falls back to 32 KiB. Ask for 32 KiB (8 blocks) outright,
            # as amazon-eks-ami's setup-local-disks does (`mkfs.xfs -l su=8b`).
            argv += ["-l", "su=8b"]
        return "xfs", tuple(argv + [target])
    if runner.which("mkfs.ext4") is not None:
        stride_blocks = CHUNK_KIB // 4  # ext4 stride is in 4 KiB blocks (mke2fs(8) -E stride, stripe_width)
        argv = ["mkfs.ext4", "-q", "-L", FS_LABEL]
        if device_count > 1:
            argv += ["-E", f"stride={stride_blocks},stripe_width={stride_blocks * device_count}"]
        return "ext4", tuple(argv + [target])
    raise StepError("neither mkfs.xfs nor mkfs.ext4 is installed; install xfsprogs")


def _fstab_entry(runner: Runner, target: str, mount_point: str, fstype: str | None) -> FstabEntry:
    uuid = probe_signature(runner, target).get("UUID")
    if not uuid:
        raise StepError(f"{target} has no filesystem UUID after mkfs; cannot persist {mount_point}")
    return FstabEntry("UUID=" + uuid, mount_point, fstype or "auto", FSTAB_OPTIONS)


def _verify_mounted(host: Host, mount_point: str) -> None:
    if find_mount(host, mount_point) is None:
        raise StepError(f"{mount_point} is not mounted after the scratch step")


def _occupied(path: str) -> bool:
    """True for an existing file, or a directory with entries (a mount or link there would hide them)."""
    return os.path.exists(path) and (not os.path.isdir(path) or bool(os.listdir(path)))


def _paths(devices: list[BlockDevice]) -> str:
    return ", ".join(d.path for d in devices)


def _is_ours(md_name: str) -> bool:
    """md names carry a home host ("any:cluster-scratch", "ip-10-0-0-1:cluster-scratch") or none."""
    return md_name.split(":")[-1] == ARRAY_NAME


def _describe(device: BlockDevice) -> str:
    return "{} ({})".format(device.name, "+".join(device.found_by))


def _foreign_error(foreign: dict[str, DeviceUsage]) -> StepError:
    detail = "; ".join(f"{path} holds {usage.describe()}" for path, usage in sorted(foreign.items()))
    return StepError(
        f"refusing to touch instance-store devices that hold data node_bootstrap did not create: {detail}. "
        "If that data is disposable, wipe the devices deliberately (wipefs -a DEVICE) and run again"
    )
