"""The seams every step uses: the command runner, root-relative files and the mount tables."""

from __future__ import annotations

import os

import pytest

from node_bootstrap.host import Host
from node_bootstrap.mounts import FstabEntry, build_fstab_text, find_mount, read_mounts
from node_bootstrap.runner import CommandError, Runner


def test_runner_runs_real_commands_and_records_them():
    runner = Runner()
    result = runner.run(["sh", "-c", "echo out; echo err >&2; exit 3"], mutating=False, check=False)
    assert (result.returncode, result.stdout, result.stderr) == (3, "out\n", "err\n")
    with pytest.raises(CommandError, match=r"`sh -c 'exit 4'` exited 4"):
        runner.run(["sh", "-c", "exit 4"], mutating=True)
    assert [(c.argv[0], c.mutating) for c in runner.calls] == [("sh", False), ("sh", True)]


def test_missing_commands_exit_127_and_say_so():
    result = Runner().run(["no-such-tool-xyz"], mutating=False, check=False)
    assert result.returncode == 127 and "no-such-tool-xyz: command not found" in result.stderr


def test_timeouts_exit_124():
    result = Runner().run(["sleep", "5"], mutating=False, check=False, timeout=0.2)
    assert result.returncode == 124 and "timed out" in result.stderr


def test_dry_run_prints_mutating_commands_and_still_runs_probes(tmp_path, capsys):
    marker = tmp_path / "marker"
    runner = Runner(dry_run=True)
    probe = runner.run(["echo", "probe"], mutating=False)
    change = runner.run(["touch", str(marker)], mutating=True)
    assert probe.stdout == "probe\n"
    assert change.dry_run and not marker.exists()
    assert f"would run: touch {marker}" in capsys.readouterr().out
    assert len(runner.mutating_calls) == 1


def test_host_maps_node_paths_under_the_root(tmp_path):
    host = Host(str(tmp_path))
    assert host.path("/etc/fstab") == str(tmp_path / "etc/fstab")
    assert host.node_path(str(tmp_path / "etc/fstab")) == "/etc/fstab"
    assert host.node_path("/dev/loop3") == "/dev/loop3"  # outside the root stays as it is
    assert Host("/").path("/etc/fstab") == "/etc/fstab"
    with pytest.raises(ValueError, match="absolute"):
        host.path("etc/fstab")


def test_host_writes_only_changed_content_and_records_it(tmp_path):
    host = Host(str(tmp_path))
    assert host.write_text("/etc/cluster/a.env", "A=1\n", mode=0o600)
    assert not host.write_text("/etc/cluster/a.env", "A=1\n")
    assert oct(os.stat(tmp_path / "etc/cluster/a.env").st_mode & 0o777) == "0o600"
    assert host.changes == ["write /etc/cluster/a.env"]


def test_host_dry_run_writes_nothing(tmp_path, capsys):
    host = Host(str(tmp_path), dry_run=True)
    assert host.write_text("/etc/x", "1") and host.makedirs("/scratch") and host.symlink("/opt/a", "/b")
    assert list(tmp_path.iterdir()) == []
    assert "would write /etc/x" in capsys.readouterr().out


def test_proc_mounts_are_unescaped_and_the_last_mount_wins(tmp_path):
    host = Host(str(tmp_path))
    mp = host.path("/my scratch")
    (tmp_path / "proc").mkdir()
    (tmp_path / "proc/mounts").write_text(
        f"/dev/md127 {mp.replace(' ', chr(92) + '040')} xfs rw,noatime 0 0\n"
        f"/dev/md126 {mp.replace(' ', chr(92) + '040')} ext4 rw 0 0\n")
    assert read_mounts(host)[0].mount_point == mp
    assert find_mount(host, "/my scratch").source == "/dev/md126"
    assert find_mount(host, "/elsewhere") is None


def test_fstab_entry_is_added_kept_or_replaced():
    entry = FstabEntry("UUID=abc", "/scratch", "xfs", "defaults,noatime,nofail")
    root_line = "UUID=root / xfs defaults 0 0"
    added = build_fstab_text(root_line + "\n", entry, "scratch")
    assert added == (f"{root_line}\n# node_bootstrap: scratch\n"
                     "UUID=abc /scratch xfs defaults,noatime,nofail 0 0\n")
    assert build_fstab_text(added, entry, "scratch") is None
    replaced = build_fstab_text(added, FstabEntry("UUID=new", "/scratch", "xfs", "defaults"), "scratch")
    assert replaced == f"{root_line}\n# node_bootstrap: scratch\nUUID=new /scratch xfs defaults 0 0\n"
    commented = build_fstab_text("# UUID=old /scratch xfs defaults 0 0\n", entry, "scratch")
    assert commented.startswith("# UUID=old /scratch")  # comments are not entries
