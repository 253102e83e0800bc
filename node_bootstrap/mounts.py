"""The two mount tables: what is mounted now (/proc/mounts) and what mounts at boot (/etc/fstab)."""

from __future__ import annotations

import logging
import os
import re
from dataclasses import dataclass

from node_bootstrap.host import Host
from node_bootstrap.runner import Runner

LOG = logging.getLogger("node_bootstrap")

PROC_MOUNTS = "/proc/mounts"
FSTAB = "/etc/fstab"
FSTAB_MARK = "# node_bootstrap:"  # the comment line above each entry this package writes


@dataclass(frozen=True)
class Mount:
    source: str  # device or remote spec, e.g. /dev/md127 or 172.31.1.2@tcp:/abcdefgh
    mount_point: str  # a host path (the kernel sees the real paths)
    fstype: str
    options: str


@dataclass(frozen=True)
class FstabEntry:
    spec: str  # UUID=..., a device, or dns@tcp:/mountname
    mount_point: str  # a node path: fstab is read at boot
    fstype: str
    options: str
    dump_freq: int = 0
    fsck_pass: int = 0

    def line(self) -> str:
        mount_point = _escape(self.mount_point)
        return f"{self.spec} {mount_point} {self.fstype} {self.options} {self.dump_freq} {self.fsck_pass}"


def read_mounts(host: Host) -> list[Mount]:
    """The current mounts, from /proc/mounts under the root."""
    mounts = []
    for line in host.read_text(PROC_MOUNTS, default="").splitlines():
        fields = line.split()
        if len(fields) >= 4:
            mounts.append(Mount(_unescape(fields[0]), _unescape(fields[1]), fields[2], fields[3]))
    return mounts


def find_mount(host: Host, node_path: str) -> Mount | None:
    """The mount at `node_path` (the last one wins, as with stacked mounts), or None."""
    wanted = os.path.normpath(host.path(node_path))
    found = None
    for mount in read_mounts(host):
        if os.path.normpath(mount.mount_point) == wanted:
            found = mount
    return found


def build_fstab_text(current: str, entry: FstabEntry, purpose: str) -> str | None:
    """The fstab text with `entry` as the only entry for its mount point, or None when nothing changes.

    An existing entry for the same mount point with different fields is replaced (and logged), because this
    package owns the mount points it is configured with.
    """
    lines = current.splitlines()
    wanted = entry.line()
    indexes = [i for i, line in enumerate(lines) if _fstab_mount_point(line) == entry.mount_point]
    if len(indexes) == 1 and lines[indexes[0]].split() == wanted.split():
        return None
    kept = []
    for i, line in enumerate(lines):
        if i in indexes:
            LOG.warning("fstab: replacing %r with %r", line, wanted)
            if kept and kept[-1].startswith(FSTAB_MARK):
                kept.pop()
            continue
        kept.append(line)
    kept.extend([f"{FSTAB_MARK} {purpose}", wanted])
    return "\n".join(kept) + "\n"


def apply_fstab_entry(host: Host, entry: FstabEntry, purpose: str) -> bool:
    """Persist `entry` in /etc/fstab; True when the file changed."""
    text = build_fstab_text(host.read_text(FSTAB, default=""), entry, purpose)
    if text is None:
        return False
    return host.write_text(FSTAB, text)


def persist_fstab_entry(host: Host, runner: Runner, entry: FstabEntry, purpose: str) -> bool:
    """`apply_fstab_entry`, then `systemctl daemon-reload` when fstab changed: systemd turns fstab into mount
    units (systemd-fstab-generator(8)) at boot and on daemon-reload only, so until then the running systemd
    keeps the old units, warns that fstab changed, and an x-systemd.automount entry has no automount unit."""
    changed = apply_fstab_entry(host, entry, purpose)
    # Only where systemd is the init system: sd_booted(3) tests for /run/systemd/system (not in containers).
    if changed and host.exists("/run/systemd/system") and runner.which("systemctl") is not None:
        result = runner.run(["systemctl", "daemon-reload"], mutating=True, check=False)
        if not result.ok:  # the mount itself is in place; the units follow at the next boot
            LOG.warning("fstab: %s", result.describe_failure())
    return changed


def fstab_has_entry(host: Host, entry: FstabEntry) -> bool:
    return build_fstab_text(host.read_text(FSTAB, default=""), entry, "") is None


def _fstab_mount_point(line: str) -> str | None:
    fields = line.split()
    if len(fields) < 2 or fields[0].startswith("#"):
        return None
    return _unescape(fields[1])


_OCTAL = re.compile(r"\\([0-7]{3})")


def _unescape(field: str) -> str:
    """Undo the kernel's octal escapes (a space is \\040 in /proc/mounts and fstab)."""
    return _OCTAL.sub(lambda m: chr(int(m.group(1), 8)), field)


def _escape(path: str) -> str:
    return path.replace("\\", "\\134").replace(" ", "\\040").replace("\t", "\\011")
