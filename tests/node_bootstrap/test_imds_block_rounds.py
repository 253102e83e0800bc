"""The metadata block is checked every monitor round, and its probe tells the block's answer from a network
that is not up (issue 42, item 7): a block gone since the boot, or a failed cluster-imds-block.service, makes
the node unhealthy; "no route" to the IPv4 address is never taken for "blocked"."""

from __future__ import annotations

import json
from pathlib import Path

import pytest
from node_monitor_support import run_json

from node_bootstrap.checks import FAIL, OK
from node_bootstrap.imds_block import SERVICE, MetadataProbe, check_metadata_blocked, connect_outcome, plan_imds_block
from node_bootstrap.job_user import plan_job_user
from node_bootstrap.plan import execute_plan

V4, V6 = "169.254.169.254:80", "[fd00:ec2::254]:80"
REFUSED = "ConnectionRefusedError: [Errno 111] Connection refused"
NET_UNREACHABLE = "OSError: [Errno 101] Network is unreachable"
NO_ROUTE = "OSError: [Errno 113] No route to host"
TIMED_OUT = "TimeoutError: timed out"


def with_job_user(node, config):
    """The fake node after step jobuser: cluster-job is uid 998 (as in test_imds_block.py)."""
    Path(node.path("/scratch")).mkdir(exist_ok=True)
    execute_plan(plan_job_user(config, node.host(), node.runner), node.runner, dry_run=False)
    return node


def run_step(node, config):
    execute_plan(plan_imds_block(config, node.host(), node.runner), node.runner, dry_run=False)


@pytest.mark.parametrize("error, outcome", [
    (REFUSED, "refused"), (NET_UNREACHABLE, "no route"), (NO_ROUTE, "no route"),
    ("OSError: [Errno 99] Cannot assign requested address", "no route"), (TIMED_OUT, "unknown"), (None, "unknown")])
def test_what_a_connect_that_failed_says(error, outcome):
    assert connect_outcome(error) == outcome


@pytest.mark.parametrize("v4, v6, status, says", [
    (REFUSED, REFUSED, OK, "cluster-job (uid 998) cannot connect to 169.254.169.254:80, [fd00:ec2::254]:80"),
    (REFUSED, NET_UNREACHABLE, OK, "cannot connect to"),  # no IPv6 on the instance: nothing to block there
    # the boot-time case of the review: before the network is up, the IPv4 address has no route either
    (NET_UNREACHABLE, NET_UNREACHABLE, FAIL, f"{V4}: no route"),
    (TIMED_OUT, REFUSED, FAIL, f"{V4}: unknown"),
])
def test_only_the_blocks_own_answer_counts_as_blocked(fake_node, config, v4, v6, status, says):
    node = with_job_user(fake_node, config)
    node.runner.on("python3", lambda argv: (0, json.dumps({"uid": 998, "targets": [
        {"target": V4, "connected": False, "error": v4}, {"target": V6, "connected": False, "error": v6}]})),
        on_path=False)
    check = check_metadata_blocked(MetadataProbe.for_node(config, node.host()), node.runner)
    assert check.status == status and says in check.detail, check.detail


def _checks(node) -> dict[str, tuple[str, str]]:
    return {c["name"]: (c["status"], c["detail"]) for c in json.loads(run_json(node))["checks"]}


def test_every_round_checks_the_block_and_a_flushed_rule_makes_the_node_unhealthy(monitored, config):
    node = with_job_user(monitored, config)
    run_step(node, config)
    assert _checks(node)["imds-block"] == ("ok", f"cluster-job (uid 998) cannot connect to {V4}, {V6}")
    node.firewall.chains["iptables"]["OUTPUT"].clear()  # flushed by hand, after the boot
    assert node.round() == 1
    state = json.loads((node.root / "var/lib/cluster/health-monitor/state.json").read_text())
    assert state["unhealthy"]["reason"].startswith("health monitor: imds-block: cluster-job (uid 998) can open a "
                                                   f"connection to the instance metadata service at {V4}")


def test_a_failed_block_service_makes_the_node_unhealthy(monitored, config):
    node = with_job_user(monitored, config)
    run_step(node, config)
    node.units[SERVICE] = "failed"
    checks = _checks(node)
    assert checks["imds-block-service"] == ("fail", f"{SERVICE} failed at this boot: see journalctl -u {SERVICE}")
    assert node.round() == 1
