"""A job starts only while the metadata block holds (issue 42, item 7): `start` runs the monitor's imds-block
check before any path is touched, refuses in one line when the job user could reach the instance metadata
service, and records the finding in the monitor's state, whose next round has the node replaced. Run through
the real CLI on a fake node whose system python answers the probe from a fake firewall (node_fake_firewall)."""

from __future__ import annotations

import json
import os

import pytest
from node_fake_firewall import FakeFirewall, holding_the_block

from node_bootstrap import jobs
from node_bootstrap.host import Host
from node_bootstrap.monitor.state import load_state

JOB = "j-meta-1"
REACHED = ("cluster-job (uid {uid}) can open a connection to the instance metadata service at 169.254.169.254:80, "
           "[fd00:ec2::254]:80: jobs could take the node role's credentials (step imdsblock blocks it)")


@pytest.mark.parametrize("firewall", [
    FakeFirewall(),  # the rules flushed (cluster-imds-block.service failed at this boot, or a saved rule set loaded)
    holding_the_block(os.getuid() + 1),  # a rule, but for another uid than the job user's
], ids=["flushed", "another-uid"])
def test_a_start_without_the_metadata_block_is_refused_in_one_line_and_marks_the_node(node_factory, firewall):
    node = node_factory("until-sigterm")
    firewall.save(node.root)
    done = node.start(JOB, check=False)
    assert done.returncode == jobs.EXIT_FAILED
    detail = REACHED.format(uid=os.getuid())
    assert json.loads(done.stdout)["error"] == (
        f"job {JOB}: refused: the metadata block does not hold (imds-block: {detail}); the node is marked "
        "unhealthy, and the health monitor has it replaced")
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ")
    assert not (node.root / "var/lib/cluster/jobs").exists()  # no path of the job, not even the jobs directory
    assert not (node.root / "var/log/cluster/jobs").exists()
    unhealthy = load_state(Host(str(node.root))).unhealthy
    assert unhealthy is not None and unhealthy.done == []  # the next monitor round does the responses
    assert unhealthy.reason == f"job start: imds-block: {detail}"


def test_a_start_with_the_block_holding_runs_and_leaves_the_monitor_state_alone(node_factory):
    node = node_factory("until-sigterm")
    holding_the_block(os.getuid()).save(node.root)
    out = json.loads(node.start(JOB).stdout)
    assert out["state"] == "running"
    assert load_state(Host(str(node.root))).unhealthy is None
    node.cli("cancel", "--job-id", JOB, "--timeout-seconds", "20")
