"""Step 2, lustre: the FSx for Lustre file system at /fsx, mounted, write-tested and persisted.

Mount command and fstab options follow the FSx for Lustre User Guide ("Mounting from an Amazon EC2 instance",
"Mounting your file system automatically"): `mount -t lustre -o relatime,flock dns@tcp:/mountname /fsx`, and
in fstab `defaults,relatime,flock,_netdev,x-systemd.automount`. The guide's example also has
`x-systemd.requires=network.service`, which is left out: Amazon Linux 2023 has no network.service (it uses
systemd-networkd), and _netdev already orders the mount after network-online.target (systemd.mount(5)).

The client kernel module must be built for the running kernel (FSx User Guide, "Installing the Lustre
client"); a module for another kernel is as good as none, so the check is `modinfo -k $(uname -r) lustre`.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Callable

from node_bootstrap.config import LustreConfig, NodeConfig
from node_bootstrap.host import Host
from node_bootstrap.mounts import FstabEntry, Mount, apply_fstab_entry, find_mount, fstab_has_entry
from node_bootstrap.plan import StepError, StepPlan
from node_bootstrap.runner import Runner

LOG = logging.getLogger("node_bootstrap")

MOUNT_OPTIONS = "relatime,flock"
FSTAB_OPTIONS = "defaults,relatime,flock,_netdev,x-systemd.automount"
MOUNT_ATTEMPTS = 5
BACKOFF_FIRST_S = 5.0  # then doubled per attempt: 5, 10, 20, 40 s (about 75 s of waiting in all)
BACKOFF_MAX_S = 60.0
MOUNT_TIMEOUT_S = 180.0


def plan_lustre(config: NodeConfig, host: Host, runner: Runner, *,
                sleep: Callable[[float], None]) -> StepPlan:
    lustre = config.lustre
    plan = StepPlan("lustre")
    kernel = host.read_text("/proc/sys/kernel/osrelease", default="").strip()
    if not kernel:
        raise StepError("cannot read the running kernel release from /proc/sys/kernel/osrelease")
    if lustre.efa_enabled:
        plan.note("the file system supports EFA; node_bootstrap mounts it over TCP "
                  "(EFA client setup for Lustre is not configured here)")

    if _module_available(runner, kernel):
        plan.note(f"Lustre client module present for kernel {kernel}")
    else:
        install = _install_command(runner, kernel)
        plan.add(f"install the Lustre client for kernel {kernel} (module missing)", argv=install)
        plan.add(f"check the installed Lustre module matches kernel {kernel}",
                 apply=lambda: _require_module(runner, kernel))

    mounted = find_mount(host, lustre.mount_point)
    if mounted is not None and mounted.fstype == "autofs":
        plan.add(f"trigger the systemd automount of {lustre.mount_point}",
                 apply=lambda: os.listdir(host.path(lustre.mount_point)))
    elif mounted is not None:
        _require_our_mount(mounted, lustre)
        plan.note(f"{lustre.mount_point} is mounted from {mounted.source}")
    else:
        argv = ("mount", "-t", "lustre", "-o", MOUNT_OPTIONS, lustre.source, host.path(lustre.mount_point))
        plan.add(f"create the mount point {lustre.mount_point}",
                 apply=lambda: host.makedirs(lustre.mount_point))
        plan.add(f"mount {lustre.source} at {lustre.mount_point} ({MOUNT_ATTEMPTS} attempts with backoff)",
                 apply=lambda: mount_with_retries(runner, argv, sleep=sleep))

    entry = FstabEntry(lustre.source, lustre.mount_point, "lustre", FSTAB_OPTIONS)
    if not fstab_has_entry(host, entry):
        plan.add(f"persist {lustre.mount_point} in /etc/fstab with _netdev",
                 apply=lambda: apply_fstab_entry(host, entry, "FSx for Lustre"))
    plan.verify = lambda: _verify(host, lustre)
    return plan


def mount_with_retries(runner: Runner, argv, *, sleep: Callable[[float], None],
                       attempts: int = MOUNT_ATTEMPTS) -> None:
    """Run the mount until it succeeds; FSx can refuse mounts for a while after it (or the node) comes up."""
    last = None
    for attempt in range(1, attempts + 1):
        result = runner.run(argv, mutating=True, check=False, timeout=MOUNT_TIMEOUT_S)
        if result.ok:
            if attempt > 1:
                LOG.info("lustre: mounted on attempt %d of %d", attempt, attempts)
            return
        last = result
        if attempt < attempts:
            delay_s = min(BACKOFF_FIRST_S * 2 ** (attempt - 1), BACKOFF_MAX_S)
            LOG.warning("lustre: mount attempt %d of %d failed (%s); retrying in %.0f s",
                        attempt, attempts, result.describe_failure(), delay_s)
            sleep(delay_s)
    raise StepError(
        f"mounting FSx for Lustre failed {attempts} times; last: "
        f"{last.describe_failure() if last else 'no attempt'}. Check that the file system is AVAILABLE, that "
        "its DNS name resolves, and that the security groups allow TCP 988 and 1018-1023 between this node "
        "and the file servers"
    )


def _module_available(runner: Runner, kernel: str) -> bool:
    return runner.run(["modinfo", "-k", kernel, "lustre"], mutating=False, check=False).ok


def _require_module(runner: Runner, kernel: str) -> None:
    if not _module_available(runner, kernel):
        raise StepError(
            f"the Lustre client is installed but has no module for the running kernel {kernel}; the package "
            "targets another kernel: update the kernel (dnf update kernel) and reboot, or use a DLAMI "
            "release whose kernel the lustre-client package supports"
        )


def _install_command(runner: Runner, kernel: str):
    # FSx User Guide, "Installing the Lustre client": Amazon Linux 2023 ships lustre-client in its repository;
    # Ubuntu needs the kernel-specific modules package from the FSx apt repository.
    if runner.which("dnf") is not None:
        return ("dnf", "install", "-y", "lustre-client")
    if runner.which("apt-get") is not None:
        return ("apt-get", "install", "-y", "lustre-client-modules-" + kernel)
    raise StepError(f"the Lustre client module for kernel {kernel} is missing and neither dnf nor apt-get "
                    "is available to install it")


def _require_our_mount(mounted: Mount, lustre: LustreConfig) -> None:
    # /proc/mounts names the server by IP (172.31.1.2@tcp:/mountname), so compare the mount name only.
    if mounted.fstype != "lustre" or not mounted.source.endswith(":/" + lustre.mount_name):
        raise StepError(f"{lustre.mount_point} is already mounted from {mounted.source} ({mounted.fstype}), "
                        f"not from the FSx file system {lustre.source}")


def _verify(host: Host, lustre: LustreConfig) -> None:
    mounted = find_mount(host, lustre.mount_point)
    if mounted is None:
        raise StepError(f"{lustre.mount_point} is not mounted after the lustre step")
    _require_our_mount(mounted, lustre)
    write_test(host.path(lustre.mount_point))


def write_test(directory: str, payload: bytes | None = None) -> None:
    """Write, read back and delete a file under `directory`: a mount that lists but cannot write is broken."""
    payload = payload or os.urandom(4096)
    path = os.path.join(directory, f".node-bootstrap-write-test-{uuid.uuid4().hex}")
    try:
        with open(path, "wb") as f:
            f.write(payload)
            f.flush()
            os.fsync(f.fileno())
        with open(path, "rb") as f:
            read_back = f.read()
        os.remove(path)
    except OSError as e:
        raise StepError(f"write test on {directory} failed: {e}") from None
    if read_back != payload:
        raise StepError(f"write test on {directory} read back {len(read_back)} bytes that differ from the "
                        f"{len(payload)} written")
