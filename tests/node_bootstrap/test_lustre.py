"""The lustre step: client module check and install, retried mount, write test, fstab, idempotency."""

from __future__ import annotations

import logging
import os

import pytest

from node_bootstrap.errors import StepError
from node_bootstrap.lustre import mount_with_retries, plan_lustre, write_test
from node_bootstrap.plan import execute_plan

SOURCE = "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com@tcp:/abcdefgh"
FSTAB_LINE = f"{SOURCE} /fsx lustre defaults,relatime,flock,_netdev,x-systemd.automount 0 0"


def run_lustre(node, config, sleeps=None, *, dry_run=False, print_fn=print):
    host = node.host(dry_run=dry_run, print_fn=print_fn)
    node.runner.dry_run = dry_run
    plan = plan_lustre(config, host, node.runner, sleep=(sleeps if sleeps is not None else []).append)
    execute_plan(plan, node.runner, dry_run=dry_run, print_fn=print_fn)
    return plan, host


def test_mounts_persists_and_write_tests(fake_node, config, kit):
    plan, host = run_lustre(fake_node, config)
    assert fake_node.runner.commands(mutating=True) == [
        f"mount -t lustre -o relatime,flock {SOURCE} {fake_node.path('/fsx')}", "systemctl daemon-reload"]
    assert f"modinfo -k {kit.KERNEL} lustre" in fake_node.runner.commands(mutating=False)
    assert fake_node.fstab().splitlines()[-2:] == ["# node_bootstrap: FSx for Lustre", FSTAB_LINE]
    assert f"172.31.5.10@tcp:/abcdefgh {fake_node.path('/fsx')} lustre" in fake_node.mounts_text()
    assert os.listdir(fake_node.path("/fsx")) == []  # the write test cleaned up after itself


def test_second_run_issues_no_mutating_command(fake_node, config):
    run_lustre(fake_node, config)
    fake_node.runner.calls.clear()
    plan, host = run_lustre(fake_node, config)
    assert plan.actions == [] and fake_node.runner.mutating_calls == [] and host.changes == []
    assert any("is mounted from 172.31.5.10@tcp:/abcdefgh" in n for n in plan.notes)


def test_mount_is_retried_with_exponential_backoff(fake_node, config):
    fake_node.lustre_mount_failures = 2
    sleeps = []
    run_lustre(fake_node, config, sleeps)
    mounts = [c for c in fake_node.runner.commands(mutating=True) if c.startswith("mount")]
    assert len(mounts) == 3
    assert sleeps == [5.0, 10.0]


def test_mount_gives_up_after_five_attempts_with_a_useful_error(fake_node, config):
    fake_node.lustre_mount_failures = 99
    sleeps = []
    with pytest.raises(StepError) as err:
        run_lustre(fake_node, config, sleeps)
    assert sleeps == [5.0, 10.0, 20.0, 40.0]
    message = str(err.value)
    assert "failed 5 times" in message and "Input/output error" in message
    assert "TCP 988 and 1018-1023" in message


def test_backoff_is_capped(fake_node):
    fake_node.lustre_mount_failures = 99
    sleeps = []
    with pytest.raises(StepError):
        mount_with_retries(fake_node.runner, ["mount", "-t", "lustre", "-o", "x", "a@tcp:/b", "/fsx"],
                           sleep=sleeps.append, attempts=8)
    assert sleeps == [5.0, 10.0, 20.0, 40.0, 60.0, 60.0, 60.0]


def test_missing_client_module_is_installed_then_checked(fake_node, config, kit):
    fake_node.lustre_module = False
    run_lustre(fake_node, config)
    mutating = fake_node.runner.commands(mutating=True)
    assert mutating[0] == "dnf install -y lustre-client"
    assert mutating[1].startswith("mount -t lustre")
    assert mutating[2] == "systemctl daemon-reload"  # the fstab entry became a systemd automount unit


def test_a_client_without_a_module_for_the_running_kernel_fails_clearly(fake_node, config, kit):
    fake_node.lustre_module = False
    fake_node.lustre_installable = False  # the package targets another kernel
    with pytest.raises(StepError, match=f"no module for the running kernel {kit.KERNEL}"):
        run_lustre(fake_node, config)
    assert not any(c.startswith("mount") for c in fake_node.runner.commands(mutating=True))


UBUNTU_KERNEL = "6.8.0-1021-aws"
UBUNTU_OS_RELEASE = 'NAME="Ubuntu"\nID=ubuntu\nVERSION_CODENAME=jammy\nPRETTY_NAME="Ubuntu 22.04.5 LTS"\n'


def ubuntu(node, kernel=UBUNTU_KERNEL):
    node.write("/etc/os-release", UBUNTU_OS_RELEASE)
    node.write("/proc/sys/kernel/osrelease", kernel + "\n")
    node.lustre_module = False
    node.runner.on_path.discard("dnf")
    installed = []

    def apt_get(argv):
        if argv[1] == "install":
            installed.extend(argv[3:])
            node.lustre_module = True
        return 0, ""

    node.runner.on("apt-get", apt_get)
    node.runner.on("env", lambda argv: apt_get(argv[2:]))
    node.runner.on("curl", lambda argv: (node.write(node.host().node_path(argv[argv.index("-o") + 1]),
                                                    "-----BEGIN PGP PUBLIC KEY BLOCK-----\n"), 0, "")[1:])
    return installed


def test_ubuntu_gets_the_fsx_apt_repository_its_key_and_the_aws_kernel_modules(fake_node, config):
    installed = ubuntu(fake_node)
    run_lustre(fake_node, config)
    key = fake_node.path("/usr/share/keyrings/fsx-ubuntu-public-key.asc")
    assert fake_node.runner.commands(mutating=True)[:3] == [
        f"curl -fsSL --connect-timeout 10 -o {key} "
        "https://fsx-lustre-client-repo-public-keys.s3.amazonaws.com/fsx-ubuntu-public-key.asc",
        "apt-get update",
        f"env DEBIAN_FRONTEND=noninteractive apt-get install -y lustre-client-modules-{UBUNTU_KERNEL} "
        "lustre-client-modules-aws",
    ]
    assert installed == [f"lustre-client-modules-{UBUNTU_KERNEL}", "lustre-client-modules-aws"]
    assert (fake_node.root / "etc/apt/sources.list.d/fsxlustreclientrepo.list").read_text() == (
        "deb [signed-by=/usr/share/keyrings/fsx-ubuntu-public-key.asc] "
        "https://fsx-lustre-client-repo.s3.amazonaws.com/ubuntu jammy main\n")
    assert f"172.31.5.10@tcp:/abcdefgh {fake_node.path('/fsx')} lustre" in fake_node.mounts_text()


def test_ubuntu_without_an_aws_kernel_is_refused_clearly(fake_node, config):
    ubuntu(fake_node, kernel="6.8.0-45-generic")
    with pytest.raises(StepError, match="Ubuntu kernel 6.8.0-45-generic is not an -aws kernel: FSx's apt "
                                        "repository builds Lustre modules for Ubuntu's -aws kernels only"):
        run_lustre(fake_node, config)
    assert fake_node.runner.mutating_calls == []


def test_an_unsupported_os_is_refused_with_its_name(fake_node, config):
    fake_node.write("/etc/os-release", 'ID=sles\nPRETTY_NAME="SUSE Linux Enterprise Server 15 SP6"\n')
    fake_node.lustre_module = False
    fake_node.runner.on_path.discard("dnf")
    with pytest.raises(StepError, match="cannot install it on SUSE Linux Enterprise Server 15 SP6"):
        run_lustre(fake_node, config)


def test_package_installs_are_retried(fake_node, config):
    fake_node.lustre_module = False
    attempts = []

    def flaky_dnf(argv):
        attempts.append(argv)
        if len(attempts) < 3:
            return 1, "", "Curl error (28): Timeout was reached for https://cdn.amazonlinux.com/..."
        return fake_node.dnf(argv)

    fake_node.runner.on("dnf", flaky_dnf)
    sleeps = []
    run_lustre(fake_node, config, sleeps)
    assert len(attempts) == 3 and sleeps[:2] == [5.0, 5.0]


def test_an_efa_enabled_file_system_says_it_is_mounted_over_tcp(fake_node, kit, caplog):
    from node_bootstrap.config import parse_node_config

    caplog.set_level(logging.INFO, logger="node_bootstrap")  # the NIDs line is INFO; do not rely on test order
    config = parse_node_config(kit.node_config_dict(**{"lustre.efaEnabled": True}))
    fake_node.runner.on("lctl", lambda argv: (0, "10.42.1.17@tcp\n"))
    plan, _ = run_lustre(fake_node, config)
    assert any(n.startswith("WARNING: the file system supports EFA but node_bootstrap mounts it over TCP")
               and "efa-file-systems.html" in n for n in plan.notes)
    assert "lustre: /fsx is EFA-enabled but is mounted over tcp, not EFA" in caplog.text
    assert "LNet NIDs: 10.42.1.17@tcp" in caplog.text


def test_another_file_system_at_the_mount_point_is_refused(fake_node, config):
    fake_node.add_mount("10.0.0.5:/export", "/fsx", "nfs4")
    with pytest.raises(StepError, match="/fsx is already mounted from 10.0.0.5:/export \\(nfs4\\)"):
        run_lustre(fake_node, config)


def test_dry_run_prints_the_mount_and_changes_nothing(fake_node, config, capsys):
    run_lustre(fake_node, config, dry_run=True)
    out = capsys.readouterr().out
    assert f"[lustre] would mount {SOURCE} at /fsx (5 attempts with backoff)" in out
    assert "[lustre] would persist /fsx in /etc/fstab with _netdev" in out
    assert "lustre" not in fake_node.mounts_text() and "lustre" not in fake_node.fstab()


def test_write_test_detects_an_unwritable_mount(tmp_path):
    target = tmp_path / "ro"
    target.mkdir()
    target.chmod(0o500)
    try:
        if os.access(target, os.W_OK):  # root ignores permissions: use a missing directory instead
            target = tmp_path / "missing"
        with pytest.raises(StepError, match="write test on .* failed"):
            write_test(str(target))
    finally:
        (tmp_path / "ro").chmod(0o700)
