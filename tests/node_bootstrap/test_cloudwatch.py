"""The logging step: CloudWatch agent config for the bootstrap log, started once, appended configs kept."""

from __future__ import annotations

import json

from node_bootstrap.cloudwatch import AGENT_CONFIG, AGENT_CTL, build_agent_config, plan_logging
from node_bootstrap.plan import execute_plan


def run_logging(node, config):
    host = node.host()
    plan = plan_logging(config, host, node.runner)
    execute_plan(plan, node.runner, dry_run=False)
    return plan, host


def test_agent_config_ships_the_bootstrap_and_health_monitor_logs():
    config = json.loads(build_agent_config("/training-cluster/TrainingClusterStack"))
    assert config["logs"]["logs_collected"]["files"]["collect_list"] == [{
        "file_path": "/var/log/cluster/bootstrap.log",
        "log_group_name": "/training-cluster/TrainingClusterStack",
        "log_stream_name": "{instance_id}/bootstrap",
        "timezone": "UTC",
    }, {
        "file_path": "/var/log/cluster/health-monitor.log",
        "log_group_name": "/training-cluster/TrainingClusterStack",
        "log_stream_name": "{instance_id}/health",
        "timezone": "UTC",
    }]


def test_first_run_writes_config_and_fetches_it(fake_node, config):
    plan, host = run_logging(fake_node, config)
    ctl = fake_node.path(AGENT_CTL)
    assert fake_node.runner.commands(mutating=True) == [
        f"{ctl} -a fetch-config -m ec2 -c file:{fake_node.path(AGENT_CONFIG)} -s"]
    assert host.changes == [f"write {AGENT_CONFIG}"]
    assert json.loads((fake_node.root / AGENT_CONFIG.lstrip("/")).read_text())["logs"]
    assert fake_node.agent_running


def test_second_run_keeps_the_running_agent_and_its_appended_configs(fake_node, config):
    run_logging(fake_node, config)
    fake_node.runner.calls.clear()
    plan, host = run_logging(fake_node, config)
    assert fake_node.runner.mutating_calls == [] and host.changes == []
    assert fake_node.agent_config_loads == 1  # a second fetch-config would drop jobs' appended configs


def test_a_stopped_agent_is_started_not_refetched(fake_node, config):
    run_logging(fake_node, config)
    fake_node.agent_running = False
    fake_node.runner.calls.clear()
    run_logging(fake_node, config)
    assert fake_node.runner.commands(mutating=True) == [f"{fake_node.path(AGENT_CTL)} -a start -m ec2"]
    assert fake_node.agent_config_loads == 1


def test_missing_agent_is_installed_with_dnf(fake_node, config):
    (fake_node.root / AGENT_CTL.lstrip("/")).unlink()
    run_logging(fake_node, config)
    assert fake_node.runner.commands(mutating=True)[0] == "dnf install -y amazon-cloudwatch-agent"
    assert fake_node.agent_running


def test_without_agent_or_dnf_it_warns_and_does_nothing(fake_node, config):
    (fake_node.root / AGENT_CTL.lstrip("/")).unlink()
    fake_node.runner.on_path.discard("dnf")
    plan, host = run_logging(fake_node, config)
    assert plan.actions == [] and host.changes == []
    assert plan.notes[0].startswith("WARNING: the CloudWatch agent is not installed and dnf is not available")
