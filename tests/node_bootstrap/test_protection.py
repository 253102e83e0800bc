"""Protected mode: failing nodes stop being replaced after N failures in a row for the same reason; a clean
boot ends the streak; the deadline and non-fatal steps behave as the boot contract says."""

from __future__ import annotations

import dataclasses
import threading
import time

from node_bootstrap import protection
from node_bootstrap.bootstrap import EXIT_FAILED_SIGNALLED, EXIT_OK, STEPS, Node, run_bootstrap
from node_bootstrap.cli import main
from node_bootstrap.config import parse_node_config
from node_bootstrap.imds import InstanceIdentity
from node_bootstrap.plan import StepPlan


class Imds:
    def __init__(self, instance_id: str) -> None:
        self.instance_id = instance_id

    def identity(self) -> InstanceIdentity:
        return InstanceIdentity(self.instance_id, "us-east-1")


def boot(node, instance_id: str) -> int:
    def make_runner(dry_run):
        node.runner.dry_run = dry_run
        return node.runner
    return main(["run", "--root", str(node.root)], make_runner=make_runner, imds=Imds(instance_id),
                sleep=lambda s: None)


def break_lustre(node) -> None:
    """A systematic deploy mistake: an AMI whose kernel the Lustre client package does not support."""
    node.lustre_module = False
    node.lustre_installable = False


def test_three_failures_in_a_row_enter_protected_mode_and_no_fourth_node_is_launched(kit, tmp_path):
    group = protection_group = None
    launches = []
    # The Auto Scaling group, as far as replacements go: a node marked Unhealthy is replaced unless the
    # group's ReplaceUnhealthy process is suspended. Bounded, so a bug cannot loop forever.
    while len(launches) < 10:
        node = kit.build_fake_node(tmp_path / f"node-{len(launches)}")  # each launch is a fresh machine
        if group is None:
            group = node.group
        node.group = group
        break_lustre(node)
        instance_id = f"i-{len(launches) + 1:017x}"
        launches.append(instance_id)
        assert boot(node, instance_id) == EXIT_FAILED_SIGNALLED
        assert node.health_status == "Unhealthy"
        if "ReplaceUnhealthy" in group.suspended:
            protection_group = group
            break
    assert len(launches) == 3  # three launches, no fourth
    assert protection_group.suspended == ["ReplaceUnhealthy"]
    assert protection_group.metrics == [("BootstrapProtectedMode", 1)]
    protected = protection_group.tags[protection.PROTECTED_TAG]
    assert " 3 bootstrap failures in a row (lustre): lustre: the Lustre client is installed but has no module" in \
        protected
    failures = sorted(k for k in protection_group.tags if k.startswith(protection.FAILURE_TAG_PREFIX))
    assert failures == [protection.FAILURE_TAG_PREFIX + i for i in launches]


def _identity(n: int) -> InstanceIdentity:
    return InstanceIdentity(f"i-{n:017x}", "us-east-1")


def test_different_reasons_do_not_add_up_and_a_success_ends_the_streak(fake_node, config):
    runner, group, now = fake_node.runner, fake_node.group, [1_000_000.0]
    clock = lambda: now[0]  # noqa: E731
    record = protection.record_failure
    assert record(_identity(1), runner, config.bootstrap, "lustre", "x", clock=clock).streak == 1
    assert record(_identity(2), runner, config.bootstrap, "health:efa", "y", clock=clock).streak == 1
    assert record(_identity(3), runner, config.bootstrap, "lustre", "x", clock=clock).streak == 2
    now[0] += 10
    protection.record_success(_identity(4), runner, config.bootstrap, clock=clock)
    assert group.metrics == [("BootstrapProtectedMode", 0)]
    now[0] += 10
    outcome = record(_identity(5), runner, config.bootstrap, "lustre", "x", clock=clock)
    assert outcome == protection.Outcome(1, False, False)
    # The records from before the success were pruned.
    assert sorted(k for k in group.tags if k.startswith(protection.FAILURE_TAG_PREFIX)) == [
        protection.FAILURE_TAG_PREFIX + _identity(5).instance_id]
    assert group.suspended == []


def test_failures_outside_the_window_do_not_count(fake_node, config):
    runner, now = fake_node.runner, [1_000_000.0]
    clock = lambda: now[0]  # noqa: E731
    for n in (1, 2):
        protection.record_failure(_identity(n), runner, config.bootstrap, "lustre", "x", clock=clock)
    now[0] += config.bootstrap.protected_mode_window_seconds + 1
    outcome = protection.record_failure(_identity(3), runner, config.bootstrap, "lustre", "x", clock=clock)
    assert outcome.streak == 1 and not outcome.protected


def test_an_already_protected_group_is_not_suspended_again(fake_node, config):
    fake_node.group.tags[protection.PROTECTED_TAG] = "1 3 bootstrap failures in a row (lustre): ..."
    outcome = protection.record_failure(_identity(1), fake_node.runner, config.bootstrap, "lustre", "x")
    assert outcome.protected and not outcome.entered
    assert fake_node.group.suspended == []


def test_failed_bookkeeping_still_marks_the_node_unhealthy(fake_node, kit):
    break_lustre(fake_node)
    fake_node.group.fail_calls.add("autoscaling describe-tags")
    assert boot(fake_node, "i-0000000000000000a") == EXIT_FAILED_SIGNALLED
    assert fake_node.health_status == "Unhealthy"
    log = (fake_node.root / "var/log/cluster/bootstrap.log").read_text()
    assert "protected mode bookkeeping failed" in log and "AccessDenied" in log


def test_group_tags_parse_and_skip_malformed_values():
    state = protection.parse_group_tags([
        {"Key": protection.FAILURE_TAG_PREFIX + "i-1", "Value": "100 lustre mount failed: a, b"},
        {"Key": protection.FAILURE_TAG_PREFIX + "i-2", "Value": "garbage"},
        {"Key": protection.LAST_SUCCESS_TAG, "Value": "90 i-0"},
        {"Key": "project", "Value": "p5"},
    ])
    assert state == protection.GroupState(
        (protection.FailureRecord("i-1", 100, "lustre", "mount failed: a, b"),), 90, None)


def test_a_clean_boot_records_its_success_once(fake_node, kit):
    assert boot(fake_node, "i-0000000000000000b") == EXIT_OK
    assert fake_node.group.tags[protection.LAST_SUCCESS_TAG].endswith(" i-0000000000000000b")
    assert fake_node.group.metrics == [("BootstrapProtectedMode", 0)]
    assert boot(fake_node, "i-0000000000000000b") == EXIT_OK
    assert fake_node.group.metrics == [("BootstrapProtectedMode", 0)]  # a rerun records nothing new


def test_a_cloudwatch_agent_failure_leaves_a_ready_node_with_the_warning(fake_node, kit):
    (fake_node.root / "opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl").unlink()
    fake_node.runner.on("dnf", lambda argv: (1, "", "Error: Failed to download metadata for repo 'amazonlinux'"))
    assert boot(fake_node, "i-0000000000000000c") == EXIT_OK
    assert fake_node.tags["cluster:bootstrap"] == "ready"
    assert fake_node.health_status == "Healthy"
    assert fake_node.tags["cluster:bootstrap-reason"].startswith(
        "ready with warnings: logging: `dnf install -y amazon-cloudwatch-agent` exited 1")


def test_the_overall_deadline_fails_a_node_stuck_in_a_step(fake_node, kit):
    config = parse_node_config(kit.node_config_dict())
    config = dataclasses.replace(config, bootstrap=dataclasses.replace(config.bootstrap, deadline_seconds=0.3))
    stuck, exits = threading.Event(), []

    def exit_fn(code):
        exits.append(code)
        stuck.set()  # in production os._exit ends the process here; the test lets the step return

    node = Node(config=config, host=fake_node.host(), runner=fake_node.runner, imds=Imds("i-0000000000000000d"),
                sleep=lambda s: None, exit_fn=exit_fn)
    blocked = StepPlan("lustre")
    blocked.add("write to a hung mount", apply=lambda: stuck.wait(10))
    import node_bootstrap.bootstrap as bootstrap

    original = bootstrap._planners
    bootstrap._planners = lambda n, w: {**original(n, w), "lustre": lambda: blocked}
    try:
        started = time.monotonic()
        code = run_bootstrap(node, ["lustre", "health", "signal"])
    finally:
        bootstrap._planners = original
    assert time.monotonic() - started < 5
    assert exits == [EXIT_FAILED_SIGNALLED] and code == EXIT_FAILED_SIGNALLED
    assert fake_node.tags["cluster:bootstrap"] == "failed"
    assert fake_node.tags["cluster:bootstrap-reason"] == (
        "deadline: the bootstrap did not finish within 0.3 s (stuck in step lustre)")
    assert fake_node.health_status == "Unhealthy"
    assert fake_node.group.tags[protection.FAILURE_TAG_PREFIX + "i-0000000000000000d"].split()[1] == \
        "deadline:lustre"
    assert STEPS  # the real step list is untouched
