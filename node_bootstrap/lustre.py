"""Step 2, lustre: the FSx for Lustre file system at /fsx, mounted, write-tested and persisted.

Mount command and fstab options follow the FSx for Lustre User Guide ("Mounting from an Amazon EC2 instance",
"Mounting your file system automatically"): `mount -t lustre -o relatime,flock dns@tcp:/mountname /fsx`, and
in fstab `defaults,relatime,flock,_netdev,x-systemd.automount`. The guide's example also has
`x-systemd.requires=network.service`, which is left out: Amazon Linux 2023 has no network.service (it uses
systemd-networkd), and _netdev already orders the mount after network-online.target (systemd.mount(5)).

The client kernel module must be built for the running kernel (FSx User Guide, "Installing the Lustre
client"); a module for another kernel is as good as none, so the check is `modinfo -k $(uname -r) lustre`.
lustre_client.py installs it per OS.

EFA: a file system created with EFA support (fsxEfaEnabled) is mounted here over TCP, like any other. Using
EFA needs the client configured for it first (FSx User Guide, "Using EFA-enabled file systems": the EFA driver,
a Lustre client with the EFA network driver, and LNet configured on the EFA interfaces before the mount;
https://docs.aws.amazon.com/fsx/latest/LustreGuide/efa-file-systems.html), which node_bootstrap does not do.
So the step says so in the log, and after the mount it reads the node's LNet NIDs (`lctl list_nids`) and logs
which network the mount really uses.
"""

from __future__ import annotations

import logging
import os
import uuid
from typing import Callable

from node_bootstrap.config import LustreConfig, NodeConfig
from node_bootstrap.errors import StepError
from node_bootstrap.host import Host
from node_bootstrap.lustre_client import plan_client_install
from node_bootstrap.mounts import FstabEntry, Mount, find_mount, fstab_has_entry, persist_fstab_entry
from node_bootstrap.plan import StepPlan
from node_bootstrap.runner import Runner

LOG = logging.getLogger("node_bootstrap")

MOUNT_OPTIONS = "relatime,flock"
FSTAB_OPTIONS = "defaults,relatime,flock,_netdev,x-systemd.automount"
MOUNT_ATTEMPTS = 5
BACKOFF_FIRST_S = 5.0  # then doubled per attempt: 5, 10, 20, 40 s (about 75 s of waiting in all)
BACKOFF_MAX_S = 60.0
MOUNT_TIMEOUT_S = 180.0
EFA_CLIENT_DOC = "https://docs.aws.amazon.com/fsx/latest/LustreGuide/efa-file-systems.html"


def plan_lustre(config: NodeConfig, host: Host, runner: Runner, *,
                sleep: Callable[[float], None]) -> StepPlan:
    lustre = config.lustre
    plan = StepPlan("lustre")
    kernel = host.read_text("/proc/sys/kernel/osrelease", default="").strip()
    if not kernel:
        raise StepError("cannot read the running kernel release from /proc/sys/kernel/osrelease")
    if lustre.efa_enabled:
        plan.note("WARNING: the file system supports EFA but node_bootstrap mounts it over TCP: the EFA Lustre "
                  f"client set-up (EFA driver, Lustre's EFA network driver, LNet on the EFA interfaces; "
                  f"{EFA_CLIENT_DOC}) is not automated here")

    if _module_available(runner, kernel):
        plan.note(f"Lustre client module present for kernel {kernel}")
    else:
        plan_client_install(plan, host, runner, kernel, sleep)
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
                 apply=lambda: persist_fstab_entry(host, runner, entry, "FSx for Lustre"))
    plan.verify = lambda: _verify(host, lustre, runner)
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
            runner.sleep(delay_s, sleep=sleep)
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


def _require_our_mount(mounted: Mount, lustre: LustreConfig) -> None:
    # /proc/mounts names the server by IP (172.31.1.2@tcp:/mountname), so compare the mount name only.
    if mounted.fstype != "lustre" or not mounted.source.endswith(":/" + lustre.mount_name):
        raise StepError(f"{lustre.mount_point} is already mounted from {mounted.source} ({mounted.fstype}), "
                        f"not from the FSx file system {lustre.source}")


def _verify(host: Host, lustre: LustreConfig, runner: Runner) -> None:
    mounted = find_mount(host, lustre.mount_point)
    if mounted is None:
        raise StepError(f"{lustre.mount_point} is not mounted after the lustre step")
    _require_our_mount(mounted, lustre)
    write_test(host.path(lustre.mount_point))
    _log_network(runner, lustre)


def _log_network(runner: Runner, lustre: LustreConfig) -> None:
    """Say which LNet network the client uses: `lctl list_nids` prints one NID per line, e.g. 10.0.1.5@tcp
    (an EFA-configured client adds ...@efa NIDs)."""
    if runner.which("lctl") is None:
        return
    result = runner.run(["lctl", "list_nids"], mutating=False, check=False)
    nids = result.stdout.split() if result.ok else []
    networks = sorted({n.rsplit("@", 1)[-1] for n in nids if "@" in n})
    if not networks:
        return
    LOG.info("lustre: this client's LNet NIDs: %s", ", ".join(nids))
    if lustre.efa_enabled and not any(n.startswith("efa") for n in networks):
        LOG.warning("lustre: %s is EFA-enabled but is mounted over %s, not EFA (%s)", lustre.mount_point,
                    "/".join(networks), EFA_CLIENT_DOC)


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
