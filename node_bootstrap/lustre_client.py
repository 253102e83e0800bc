"""Installing the Lustre client whose kernel module matches the running kernel, per OS.

- Amazon Linux 2023: `lustre-client` from the distribution's own repository (FSx for Lustre User Guide,
  "Installing the Lustre client"; aws-parallelcluster-cookbook resources/lustre/lustre_alinux2023.rb).
- Ubuntu: the modules come from FSx's apt repository, built for Ubuntu's `-aws` kernels only. The steps follow
  aws-parallelcluster-cookbook's Debian recipe (resources/lustre/partial/_install_lustre_debian.rb): the
  repository https://fsx-lustre-client-repo.s3.amazonaws.com/ubuntu (component main) signed with
  https://fsx-lustre-client-repo-public-keys.s3.amazonaws.com/fsx-ubuntu-public-key.asc, `apt update`, then
  `lustre-client-modules-$(uname -r)` and `lustre-client-modules-aws` (which follows future -aws kernels), each
  with 3 tries 5 s apart. The key is kept ASCII-armoured with an .asc name, which apt accepts for signed-by
  (sources.list(5)), so no gpg is needed. A kernel that is not an -aws flavour has no module package: refused
  with what to do. Both repositories are on the internet: with natGateway=false the AMI must already carry
  the client (the DLAMIs do on Amazon Linux 2023).
- Anything else is refused with a message naming the OS.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Callable

from node_bootstrap.errors import StepError
from node_bootstrap.host import Host
from node_bootstrap.plan import StepPlan
from node_bootstrap.runner import Runner

INSTALL_ATTEMPTS = 3
RETRY_DELAY_S = 5.0  # the cookbook's retry_delay
INSTALL_TIMEOUT_S = 600.0  # a first dnf/apt run refreshes repository metadata: minutes, not seconds
FSX_APT_REPO = "https://fsx-lustre-client-repo.s3.amazonaws.com/ubuntu"
FSX_APT_KEY_URL = "https://fsx-lustre-client-repo-public-keys.s3.amazonaws.com/fsx-ubuntu-public-key.asc"
FSX_APT_KEY = "/usr/share/keyrings/fsx-ubuntu-public-key.asc"
FSX_APT_LIST = "/etc/apt/sources.list.d/fsxlustreclientrepo.list"


@dataclass(frozen=True)
class OsRelease:
    id: str  # amzn, ubuntu, rhel, ...
    version_codename: str  # jammy, noble; empty on Amazon Linux
    pretty_name: str


def read_os_release(host: Host) -> OsRelease:
    """/etc/os-release (os-release(5)): KEY=value lines, values optionally quoted."""
    values = {}
    for line in host.read_text("/etc/os-release", default="").splitlines():
        key, sep, value = line.partition("=")
        if sep:
            values[key.strip()] = value.strip().strip('"').strip("'")
    return OsRelease(values.get("ID", ""), values.get("VERSION_CODENAME", ""),
                     values.get("PRETTY_NAME", values.get("ID", "an unknown OS")))


def plan_client_install(plan: StepPlan, host: Host, runner: Runner, kernel: str,
                        sleep: Callable[[float], None]) -> None:
    """Add the actions that install the client for `kernel`; raises StepError where that cannot work."""
    release = read_os_release(host)

    def retried(*argv: str) -> Callable[[], None]:
        return lambda: runner.run_retried(argv, attempts=INSTALL_ATTEMPTS, delay_s=RETRY_DELAY_S,
                                          timeout=INSTALL_TIMEOUT_S, sleep=sleep)

    if release.id == "ubuntu":
        _plan_ubuntu(plan, host, runner, kernel, release, retried)
    elif runner.which("dnf") is not None:
        plan.add(f"install the Lustre client for kernel {kernel} (module missing; {INSTALL_ATTEMPTS} tries)",
                 apply=retried("dnf", "install", "-y", "lustre-client"))
    else:
        raise StepError(f"the Lustre client module for kernel {kernel} is missing and node_bootstrap cannot "
                        f"install it on {release.pretty_name}: supported are Amazon Linux 2023 (dnf) and Ubuntu "
                        "with an -aws kernel (FSx's apt repository)")


def _plan_ubuntu(plan: StepPlan, host: Host, runner: Runner, kernel: str, release: OsRelease, retried) -> None:
    if not kernel.endswith("-aws"):
        raise StepError(f"Ubuntu kernel {kernel} is not an -aws kernel: FSx's apt repository builds Lustre "
                        "modules for Ubuntu's -aws kernels only; use an AMI that boots linux-aws (the Deep "
                        "Learning AMIs do), or install linux-aws and reboot")
    if not release.version_codename:
        raise StepError("/etc/os-release has no VERSION_CODENAME: cannot name the FSx apt repository's suite")
    if runner.which("apt-get") is None or runner.which("curl") is None:
        raise StepError("installing the Lustre client on Ubuntu needs apt-get and curl")
    if not host.exists(FSX_APT_KEY):
        plan.add(f"download FSx's apt signing key to {FSX_APT_KEY}",
                 apply=retried("curl", "-fsSL", "--connect-timeout", "10", "-o", host.path(FSX_APT_KEY),
                               FSX_APT_KEY_URL))
    line = f"deb [signed-by={FSX_APT_KEY}] {FSX_APT_REPO} {release.version_codename} main\n"
    if host.read_text(FSX_APT_LIST, default="") != line:
        plan.add(f"add FSx's apt repository ({release.version_codename}) in {FSX_APT_LIST}",
                 apply=lambda: host.write_text(FSX_APT_LIST, line))
    plan.add("refresh the apt package lists", apply=retried("apt-get", "update"))
    plan.add(f"install lustre-client-modules-{kernel} and lustre-client-modules-aws",
             apply=retried("env", "DEBIAN_FRONTEND=noninteractive", "apt-get", "install", "-y",
                           f"lustre-client-modules-{kernel}", "lustre-client-modules-aws"))
