"""The scratch step for real: mkfs and mount on a loop device posing as an instance-store NVMe device.

The fake root's /dev/disk/by-id link points at a real /dev/loopN and its /proc/mounts is the kernel's, so the
real Runner runs the real blkid, mkfs and mount. Skipped, with the reason, where the kernel or user does not
allow loop devices and mounts.
"""

from __future__ import annotations

import os
import shutil
import subprocess

import pytest

from node_bootstrap.config import parse_node_config
from node_bootstrap.host import Host
from node_bootstrap.mounts import find_mount
from node_bootstrap.plan import execute_plan
from node_bootstrap.runner import CommandError, Runner
from node_bootstrap.scratch import FS_LABEL, plan_scratch

IMAGE_SIZE_BYTES = 512 * 1024 * 1024  # sparse; mkfs.xfs needs at least 300 MiB


class LoopOnlyRunner(Runner):
    """The real runner, blind to nvme-cli and mdadm: on an EC2 test box they would see the box's own disks."""

    def which(self, name, extra_dirs=()):
        return None if name in ("nvme", "mdadm") else super().which(name, extra_dirs)


def _skip_unless_possible() -> None:
    if os.geteuid() != 0:
        pytest.skip("needs root: losetup and mount are privileged")
    for tool in ("losetup", "blkid", "mount", "umount"):
        if shutil.which(tool) is None:
            pytest.skip(f"{tool} is not installed")
    if shutil.which("mkfs.xfs") is None and shutil.which("mkfs.ext4") is None:
        pytest.skip("neither mkfs.xfs nor mkfs.ext4 is installed")


@pytest.fixture(scope="module")
def loop_device(tmp_path_factory):
    _skip_unless_possible()
    image = tmp_path_factory.mktemp("loop") / "instance-store.img"
    with open(image, "wb") as f:
        f.truncate(IMAGE_SIZE_BYTES)
    result = subprocess.run(["losetup", "--find", "--show", str(image)], capture_output=True, text=True)
    if result.returncode != 0:
        pytest.skip(f"losetup cannot attach a loop device here: {result.stderr.strip()}")
    device = result.stdout.strip()
    yield device
    subprocess.run(["losetup", "--detach", device], capture_output=True)


@pytest.fixture
def loop_root(tmp_path, loop_device, kit):
    root = tmp_path / "root"
    by_id = root / "dev/disk/by-id"
    by_id.mkdir(parents=True)
    (by_id / "nvme-Amazon_EC2_NVMe_Instance_Storage_AWSLOOPTEST0001").symlink_to(loop_device)
    (root / "proc").mkdir()
    (root / "proc/mounts").symlink_to("/proc/self/mounts")  # the kernel's own mount table
    (root / "etc").mkdir()
    (root / "etc/fstab").write_text("# fake root fstab\n")
    yield root
    target = str(root / "scratch")
    if os.path.ismount(target):
        subprocess.run(["umount", target], capture_output=True)
    subprocess.run(["wipefs", "-a", loop_device], capture_output=True)


def test_real_mkfs_and_mount_on_a_loop_device_then_a_second_run_changes_nothing(loop_root, loop_device, kit):
    config = parse_node_config(kit.node_config_dict(**{"expected": {
        "gpuCount": 8, "gpuMemoryGiB": 80, "efaInterfaceCount": 32, "nvmeDeviceCount": 1,
        "nvswitch": True, "fp8": True}}))
    host, runner = Host(str(loop_root)), LoopOnlyRunner()
    plan = plan_scratch(config, host, runner)
    try:
        execute_plan(plan, runner, dry_run=False)
    except CommandError as e:
        if "permission denied" in str(e).lower() or "not permitted" in str(e).lower():
            pytest.skip(f"the kernel refuses the mount here: {e}")
        raise

    fstype = "xfs" if shutil.which("mkfs.xfs") else "ext4"
    assert [c.argv[0] for c in runner.mutating_calls] == [f"mkfs.{fstype}", "mount"]
    mounted = find_mount(host, "/scratch")
    assert mounted is not None and mounted.fstype == fstype and "noatime" in mounted.options
    assert os.path.realpath(mounted.source) == os.path.realpath(loop_device)
    probe = subprocess.run(["blkid", "-p", "-o", "export", loop_device],
                           capture_output=True, text=True).stdout
    uuid = dict(line.split("=", 1) for line in probe.splitlines())["UUID"]
    assert f"LABEL={FS_LABEL}" in probe
    assert (loop_root / "etc/fstab").read_text().splitlines()[-1] == (
        f"UUID={uuid} /scratch {fstype} defaults,noatime,nofail 0 0")
    with open(loop_root / "scratch/probe", "w") as f:  # the mount is usable
        f.write("ok")

    second_runner = LoopOnlyRunner()
    second_host = Host(str(loop_root))
    execute_plan(plan_scratch(config, second_host, second_runner), second_runner, dry_run=False)
    assert second_runner.mutating_calls == []
    assert second_host.changes == []
