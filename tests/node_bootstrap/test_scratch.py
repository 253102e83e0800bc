"""The scratch step on a fake P5 root: RAID0 from blank instance store, DLAMI reuse, refusals, idempotency."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from node_bootstrap.disks import (
    find_instance_store_devices,
    parse_blkid_export,
    parse_mdadm_scan,
    parse_nvme_list_json,
)
from node_bootstrap.errors import StepError
from node_bootstrap.plan import execute_plan
from node_bootstrap.scratch import ARRAY_DEVICE, FS_LABEL, plan_scratch


def run_scratch(node, config, *, dry_run=False, print_fn=print):
    host = node.host(dry_run=dry_run, print_fn=print_fn)
    node.runner.dry_run = dry_run
    plan = plan_scratch(config, host, node.runner)
    execute_plan(plan, node.runner, dry_run=dry_run, print_fn=print_fn)
    return plan, host


def test_finds_the_eight_instance_store_devices_and_never_the_ebs_root(fake_node):
    devices = find_instance_store_devices(fake_node.host(), fake_node.runner)
    assert [d.name for d in devices] == [f"nvme{i}n1" for i in range(1, 9)]
    assert all(d.found_by == ("by-id", "sysfs", "nvme-list") for d in devices)
    assert all(d.path == fake_node.path("/dev/" + d.name) for d in devices)


def test_an_ebs_volume_is_excluded_even_if_another_source_calls_it_instance_store(fake_node):
    # A by-id link that claims instance store for the EBS root: the sysfs model (and nvme list) say EBS.
    os.symlink("../../nvme0n1", fake_node.path("/dev/disk/by-id/nvme-Amazon_EC2_NVMe_Instance_Storage_BOGUS"))
    names = [d.name for d in find_instance_store_devices(fake_node.host(), fake_node.runner)]
    assert "nvme0n1" not in names and len(names) == 8


def test_first_run_builds_raid0_xfs_mount_and_fstab(fake_node, config):
    plan, host = run_scratch(fake_node, config)
    array = fake_node.path(ARRAY_DEVICE)
    devices = " ".join(fake_node.instance_store_paths())
    assert fake_node.runner.commands(mutating=True) == [
        f"mdadm --create {array} --level=0 --chunk=512 --metadata=1.2 --homehost=any --name=cluster-scratch "
        f"--raid-devices=8 {devices}",
        f"mkfs.xfs -L {FS_LABEL} -d su=512k,sw=8 -l su=8b {array}",
        f"mount -t xfs -o noatime {array} {fake_node.path('/scratch')}",
        "systemctl daemon-reload",  # after the fstab edit, so systemd's mount units follow it
    ]
    md127, scratch = fake_node.path("/dev/md127"), fake_node.path("/scratch")
    assert fake_node.mounts_text() == f"{md127} {scratch} xfs rw,noatime 0 0\n"
    uuid = fake_node.signatures[fake_node.path("/dev/md127")]["UUID"]
    fstab = fake_node.fstab().splitlines()
    assert fstab[0].startswith("UUID=8f1c2d3e")  # the root entry is kept
    assert fstab[-2:] == ["# node_bootstrap: instance-store scratch",
                          f"UUID={uuid} /scratch xfs defaults,noatime,nofail 0 0"]
    assert host.changes == ["mkdir /scratch", "write /etc/fstab"]


def test_second_run_issues_no_mutating_command_and_changes_no_file(fake_node, config):
    run_scratch(fake_node, config)
    fstab_before = fake_node.fstab()
    fake_node.runner.calls.clear()
    plan, host = run_scratch(fake_node, config)
    assert plan.actions == []
    assert fake_node.runner.mutating_calls == []
    assert host.changes == []
    assert fake_node.fstab() == fstab_before
    assert any("is assembled from 8 devices" in n for n in plan.notes)


def test_single_device_gets_a_filesystem_without_raid(make_node, config):
    node = make_node(instance_store=1)
    run_scratch(node, config)
    device = node.path("/dev/nvme1n1")
    assert node.runner.commands(mutating=True) == [
        f"mkfs.xfs -L {FS_LABEL} {device}",
        f"mount -t xfs -o noatime {device} {node.path('/scratch')}",
        "systemctl daemon-reload",
    ]
    node.runner.calls.clear()
    plan, _ = run_scratch(node, config)
    assert plan.actions == [] and node.runner.mutating_calls == []


def test_dlami_mount_is_reused_through_a_symlink(make_node, config):
    node = make_node(dlami=True)
    plan, host = run_scratch(node, config)
    assert node.runner.mutating_calls == []
    assert os.readlink(node.path("/scratch")) == "/opt/dlami/nvme"
    assert host.changes == ["symlink /scratch -> /opt/dlami/nvme"]
    assert "mdadm" not in " ".join(node.runner.commands())  # the DLAMI's devices are not even probed
    node.runner.calls.clear()
    plan, host = run_scratch(node, config)
    assert plan.actions == [] and host.changes == []


def test_dlami_reuse_refuses_a_non_empty_scratch_directory(make_node, config):
    node = make_node(dlami=True)
    node.write("/scratch/keep.txt", "data")
    with pytest.raises(StepError, match="/scratch exists and is not an empty directory"):
        run_scratch(node, config)


def test_a_device_with_a_foreign_filesystem_is_refused_and_nothing_runs(fake_node, config, kit):
    fields = dict(line.split("=", 1) for line in kit.fixture_text("blkid-ext4-foreign.txt").splitlines())
    fields.pop("DEVNAME")
    fake_node.signatures[fake_node.path("/dev/nvme3n1")] = fields
    with pytest.raises(StepError) as err:
        run_scratch(fake_node, config)
    message = str(err.value)
    assert f"{fake_node.path('/dev/nvme3n1')} holds ext4 (LABEL=datasets)" in message
    assert "wipefs -a" in message
    assert fake_node.runner.mutating_calls == []


def test_a_member_of_a_foreign_array_is_refused(fake_node, config):
    fake_node.signatures[fake_node.path("/dev/nvme2n1")] = {"LABEL": "ip-10-0-12-34:data",
                                                          "TYPE": "linux_raid_member"}
    Path(fake_node.path("/sys/block/nvme2n1/holders/md0")).touch()
    expected = r"nvme2n1 holds linux_raid_member \(LABEL=ip-10-0-12-34:data\); in use by md0"
    with pytest.raises(StepError, match=expected):
        run_scratch(fake_node, config)
    assert fake_node.runner.mutating_calls == []


def test_a_partitioned_device_is_refused(fake_node, config):
    Path(fake_node.path("/sys/block/nvme5n1/nvme5n1p1")).mkdir()
    with pytest.raises(StepError, match="nvme5n1 holds partitions nvme5n1p1"):
        run_scratch(fake_node, config)


def test_an_incomplete_scratch_array_is_reported_not_rebuilt(fake_node, config):
    run_scratch(fake_node, config)
    # After a stop/start, one member came back blank and the array is not assembled.
    fake_node.arrays.clear()
    for p in fake_node.instance_store_paths():
        for holder in Path(fake_node.path(f"/sys/block/{os.path.basename(p)}/holders")).iterdir():
            holder.unlink()
    fake_node.signatures.pop(fake_node.path("/dev/nvme8n1"))
    fake_node.write("/proc/mounts", "")
    fake_node.runner.calls.clear()
    with pytest.raises(StepError, match="the scratch array is incomplete: .* are blank"):
        run_scratch(fake_node, config)
    assert fake_node.runner.mutating_calls == []


def test_an_unassembled_scratch_array_is_assembled_and_mounted_again(fake_node, config):
    run_scratch(fake_node, config)
    fake_node.arrays.clear()  # a reboot without auto-assembly; members and filesystem are intact
    for p in fake_node.instance_store_paths():
        for holder in Path(fake_node.path(f"/sys/block/{os.path.basename(p)}/holders")).iterdir():
            holder.unlink()
    fake_node.write("/proc/mounts", "")
    fake_node.runner.calls.clear()
    run_scratch(fake_node, config)
    array = fake_node.path(ARRAY_DEVICE)
    assert fake_node.runner.commands(mutating=True) == [
        f"mdadm --assemble {array} {' '.join(fake_node.instance_store_paths())}",
        f"mount -t xfs -o noatime {array} {fake_node.path('/scratch')}",
    ]


def test_something_else_mounted_at_scratch_is_refused(fake_node, config):
    fake_node.add_mount("/dev/nvme0n1p1", "/scratch", "xfs")
    with pytest.raises(StepError, match="/scratch is already mounted from /dev/nvme0n1p1"):
        run_scratch(fake_node, config)


def test_no_instance_store_at_all_is_an_error(make_node, config):
    node = make_node(instance_store=0)
    node.runner.handlers["nvme"] = lambda argv: (0, '{"Devices": []}')
    expected = r"no instance-store NVMe devices found \(expected 8 for p5.48xlarge\)"
    with pytest.raises(StepError, match=expected):
        run_scratch(node, config)


def test_ext4_with_stripe_geometry_where_mkfs_xfs_is_missing(fake_node, config):
    fake_node.runner.on_path.discard("mkfs.xfs")
    fake_node.runner.on("mkfs.ext4", fake_node.mkfs("ext4"))
    run_scratch(fake_node, config)
    mkfs = [c for c in fake_node.runner.commands(mutating=True) if c.startswith("mkfs")]
    array = fake_node.path(ARRAY_DEVICE)
    assert mkfs == [f"mkfs.ext4 -q -L {FS_LABEL} -E stride=128,stripe_width=1024 {array}"]
    assert " /scratch ext4 defaults,noatime,nofail 0 0" in fake_node.fstab()


def test_dry_run_prints_the_plan_and_changes_nothing(fake_node, config, capsys):
    fstab_before, mounts_before = fake_node.fstab(), fake_node.mounts_text()
    run_scratch(fake_node, config, dry_run=True)
    out = capsys.readouterr().out
    assert "[scratch] would create RAID0 /dev/md/cluster-scratch across 8 instance-store devices" in out
    assert "$ mdadm --create" in out and "$ mkfs.xfs -L cl-scratch -d su=512k,sw=8 -l su=8b" in out
    assert "[scratch] would persist /scratch in /etc/fstab" in out
    assert fake_node.arrays == {}
    assert fake_node.fstab() == fstab_before and fake_node.mounts_text() == mounts_before
    assert not os.path.exists(fake_node.path("/scratch"))
    assert [c for c in fake_node.runner.calls if c.mutating] == []  # probes ran, nothing else
    assert any(c.startswith("blkid -p") for c in fake_node.runner.commands(mutating=False))


def test_parsers_read_the_recorded_formats(kit):
    arrays = parse_mdadm_scan(kit.fixture_text("mdadm-detail-scan.txt"))
    assert [(a.device, a.name) for a in arrays] == [
        ("/dev/md/cluster-scratch", "any:cluster-scratch"), ("/dev/md/data", "ip-10-0-12-34:data")]
    assert arrays[0].uuid == "5d2c1f8e:9a3b4c7d:e1f20a3b:4c5d6e7f"
    member = parse_blkid_export(kit.fixture_text("blkid-raid-member.txt"))
    assert (member["TYPE"], member["LABEL"]) == ("linux_raid_member", "any:cluster-scratch")
    assert "DEVNAME" not in member
    pairs = parse_nvme_list_json(kit.fixture_text("nvme-list.p5.json"))
    assert pairs[0] == ("/dev/nvme0n1", "Amazon Elastic Block Store")
    assert sum(model == "Amazon EC2 NVMe Instance Storage" for _, model in pairs) == 8


def test_after_a_stop_start_a_rerun_rebuilds_scratch_and_replaces_the_stale_fstab_entry(fake_node, config):
    run_scratch(fake_node, config)
    old_uuid = fake_node.signatures[fake_node.path("/dev/md127")]["UUID"]
    # Stop/start: the instance store comes back blank, nothing is assembled or mounted; fstab is on EBS.
    fake_node.arrays.clear()
    fake_node.signatures = {k: v for k, v in fake_node.signatures.items() if "nvme0n1" in k}
    for p in fake_node.instance_store_paths():
        for holder in Path(fake_node.path(f"/sys/block/{os.path.basename(p)}/holders")).iterdir():
            holder.unlink()
    fake_node.write("/proc/mounts", "")
    run_scratch(fake_node, config)
    new_uuid = fake_node.signatures[fake_node.path("/dev/md127")]["UUID"]
    scratch_lines = [line for line in fake_node.fstab().splitlines() if " /scratch " in line]
    assert new_uuid != old_uuid
    assert scratch_lines == [f"UUID={new_uuid} /scratch xfs defaults,noatime,nofail 0 0"]
    assert fake_node.fstab().count("# node_bootstrap: instance-store scratch") == 1


# ----- the DLAMI's own instance-store set-up (dlami-nvme.service, LVM vg.01/lv_ephemeral) racing user-data -----


@pytest.mark.parametrize("unit_state", ["activating", "inactive"])  # running now, or enabled and not run yet
def test_the_lvm_race_waits_for_the_dlami_service_and_reuses_its_mount(fake_node, config, unit_state):
    # LVM label on every device, the device mapper holding them, nothing mounted yet: the AMI is at work.
    fake_node.dlami_volume(mounted=False, unit_state=unit_state)
    plan, host = run_scratch(fake_node, config)
    assert [a.summary for a in plan.actions] == [
        "wait for the DLAMI's dlami-nvme.service to finish (at most 600 s), then reuse its mount at /opt/dlami/nvme"]
    assert fake_node.runner.commands(mutating=True) == ["systemctl start dlami-nvme.service"]
    assert os.readlink(fake_node.path("/scratch")) == "/opt/dlami/nvme"
    assert host.changes == ["symlink /scratch -> /opt/dlami/nvme"]
    commands = " ".join(fake_node.runner.commands())
    assert "mdadm" not in commands and "mkfs" not in commands and "wipefs" not in commands
    fake_node.runner.calls.clear()
    plan, host = run_scratch(fake_node, config)
    assert plan.actions == [] and fake_node.runner.mutating_calls == []


def test_the_lvm_race_in_a_dry_run_only_says_it_would_wait(fake_node, config, capsys):
    fake_node.dlami_volume(mounted=False, unit_state="activating")
    run_scratch(fake_node, config, dry_run=True)
    out = capsys.readouterr().out
    assert "would wait for the DLAMI's dlami-nvme.service to finish" in out
    assert fake_node.runner.commands(mutating=True) == []
    assert fake_node.dlami_unit["ActiveState"] == "activating"


def test_a_finished_dlami_service_that_did_not_mount_has_its_volume_mounted_and_reused(fake_node, config):
    fake_node.dlami_volume(mounted=False, unit_state="active")
    plan, host = run_scratch(fake_node, config)
    mapper = fake_node.path("/dev/mapper/vg.01-lv_ephemeral")
    assert fake_node.runner.commands(mutating=True) == [
        f"mount -t ext4 -o noatime,nodiratime {mapper} {fake_node.path('/opt/dlami/nvme')}"]
    assert os.readlink(fake_node.path("/scratch")) == "/opt/dlami/nvme"
    assert "systemctl start" not in " ".join(fake_node.runner.commands())


def test_a_dlami_volume_group_without_its_filesystem_is_explained_not_wiped(fake_node, config):
    fake_node.dlami_volume(mounted=False, unit_state="active")
    del fake_node.signatures[os.path.realpath(fake_node.path("/dev/mapper/vg.01-lv_ephemeral"))]
    with pytest.raises(StepError) as err:
        run_scratch(fake_node, config)
    message = str(err.value)
    assert "in the DLAMI's volume group vg.01" in message
    assert "dlami-nvme.service is active (exited, result success, enabled)" in message
    assert "journalctl -u dlami-nvme.service" in message
    assert "vgremove -y vg.01; pvremove /dev/nvme1n1 /dev/nvme2n1" in message
    assert fake_node.runner.mutating_calls == []


def test_a_service_that_never_mounts_after_the_wait_is_a_clear_failure(fake_node, config):
    fake_node.dlami_volume(mounted=False, unit_state="activating")
    del fake_node.signatures[os.path.realpath(fake_node.path("/dev/mapper/vg.01-lv_ephemeral"))]
    fake_node.dlami_mounts_on_start = False
    with pytest.raises(StepError, match="the AMI's set-up did not finish"):
        run_scratch(fake_node, config)
    assert fake_node.runner.commands(mutating=True) == ["systemctl start dlami-nvme.service"]


def test_another_volume_group_is_still_foreign(fake_node, config):
    fake_node.dlami_volume(mounted=False, unit_state="active")
    fake_node.write("/sys/block/dm-0/dm/name", "datavg-datalv\n")  # not the AMI's: someone's data
    fake_node.dlami_unit = None
    with pytest.raises(StepError, match="refusing to touch instance-store devices that hold data"):
        run_scratch(fake_node, config)
    assert fake_node.runner.mutating_calls == []


def test_pvs_names_the_volume_group_when_lvm_answers(fake_node, config):
    fake_node.dlami_volume(mounted=False, unit_state="active")
    fake_node.write("/sys/block/dm-0/dm/name", "something-else\n")  # pvs is asked first and wins
    lines = "".join(f"  /dev/nvme{i}n1|vg.01\n" for i in range(1, 9))
    fake_node.runner.on("pvs", lambda argv: (0, lines))
    run_scratch(fake_node, config)
    assert os.readlink(fake_node.path("/scratch")) == "/opt/dlami/nvme"
