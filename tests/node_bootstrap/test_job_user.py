"""The jobuser step on a fake P5 node: the unprivileged user jobs run as, its device groups, and /scratch and
its home kept root's."""

from __future__ import annotations

import os
from pathlib import Path

import pytest

from node_bootstrap.accounts import JOB_USER, read_account
from node_bootstrap.errors import StepError
from node_bootstrap.job_user import plan_job_user
from node_bootstrap.plan import execute_plan


def run_step(node, config, *, dry_run=False, printed=None):
    host = node.host(dry_run=dry_run, print_fn=(printed.append if printed is not None else print))
    node.runner.dry_run = dry_run
    plan = plan_job_user(config, host, node.runner)
    execute_plan(plan, node.runner, dry_run=dry_run,
                 print_fn=(printed.append if printed is not None else print))
    return plan


def with_scratch(node):
    Path(node.path("/scratch")).mkdir(exist_ok=True)
    return node


def test_creates_the_user_and_keeps_its_home_and_scratch_roots_then_does_nothing(fake_node, config):
    node = with_scratch(fake_node)
    run_step(node, config)
    assert node.runner.commands(mutating=True) == [
        "useradd --system --user-group --create-home --home-dir /var/lib/cluster-job --shell /usr/sbin/nologin "
        f"--comment 'training jobs (node_bootstrap)' {JOB_USER}",
        f"chown root:root {node.path('/var/lib/cluster-job')}",  # a job's HOME is its own scratch directory
    ]
    account = read_account(str(node.root), JOB_USER)
    assert (account.uid, account.gid, account.home, account.groups) == (998, 998, "/var/lib/cluster-job", ())
    assert node.stat_of("/scratch") == (0o755, 0, 0)  # root's: jobs get their own directories in it
    assert node.stat_of("/var/lib/cluster-job") == (0o750, 0, 0)
    # the devices are 0666 (the NVIDIA driver's default, and the fake EFA nodes): no group is needed

    node.runner.calls.clear()
    second = run_step(node, config)
    assert second.actions == [] and node.runner.mutating_calls == []


def test_takes_back_a_scratch_and_home_the_job_user_could_change(fake_node, config):
    """A node bootstrapped before issue 31 gave the job user /scratch; a group- or world-writable one is no
    better: the user could rename what root acts on in it."""
    node = with_scratch(fake_node)
    run_step(node, config)
    node.stats["/scratch"] = (0o755, 998, 998)
    node.stats["/var/lib/cluster-job"] = (0o777, 0, 0)
    node.runner.calls.clear()
    run_step(node, config)
    assert node.runner.commands(mutating=True) == [
        f"chown root:root {node.path('/scratch')}",
        f"chmod go-w {node.path('/var/lib/cluster-job')}",
    ]
    assert (node.stat_of("/scratch"), node.stat_of("/var/lib/cluster-job")) == ((0o755, 0, 0), (0o755, 0, 0))


def test_joins_the_groups_that_own_the_devices(fake_node, config):
    node = with_scratch(fake_node)
    for i in range(32):
        node.stats[f"/dev/infiniband/uverbs{i}"] = (0o660, 0, 997)  # rdma
    node.stats["/dev/nvidia-uvm"] = (0o660, 0, 44)  # video
    run_step(node, config)
    assert f"usermod --append --groups video,rdma {JOB_USER}" in node.runner.commands(mutating=True)
    assert read_account(str(node.root), JOB_USER).groups == (44, 997)
    node.runner.calls.clear()
    assert run_step(node, config).actions == []


def test_a_device_only_root_may_open_fails_the_step(fake_node, config):
    node = with_scratch(fake_node)
    node.stats["/dev/nvidia3"] = (0o600, 0, 0)
    with pytest.raises(StepError, match=r"^/dev/nvidia3 \(mode 0600, group 0\): the job user cluster-job could "
                                        r"not open it"):
        run_step(node, config)
    assert node.runner.mutating_calls == []  # refused while planning: nothing was changed


def test_dry_run_prints_the_plan_and_creates_nothing(fake_node, config):
    printed = []
    run_step(fake_node, config, dry_run=True, printed=printed)  # no /scratch yet: its chown is planned
    assert any(line.startswith("[jobuser] would create the system user cluster-job") for line in printed)
    assert any("would give /scratch to root" in line for line in printed)
    assert any("would give /var/lib/cluster-job to root" in line for line in printed)
    assert read_account(str(fake_node.root), JOB_USER) is None
    assert not os.path.exists(fake_node.path("/var/lib/cluster-job"))
