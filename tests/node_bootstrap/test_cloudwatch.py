"""The logging step: the stack-rendered CloudWatch agent config, loaded once (appended job configs kept), and the
EFA metrics collector as a systemd service."""

from __future__ import annotations

import json

from node_bootstrap.cloudwatch import AGENT_CONFIG, AGENT_CTL, build_efa_metrics_unit, plan_logging
from node_bootstrap.config import parse_node_config
from node_bootstrap.efa_metrics import UNIT
from node_bootstrap.plan import execute_plan

UNIT_PATH = "/etc/systemd/system/" + UNIT


def run_logging(node, config):
    host = node.host()
    plan = plan_logging(config, host, node.runner)
    execute_plan(plan, node.runner, dry_run=False)
    return plan, host


def test_the_agent_gets_the_config_the_stack_rendered(fake_node, config):
    run_logging(fake_node, config)
    written = json.loads((fake_node.root / AGENT_CONFIG.lstrip("/")).read_text())
    assert written == config.cloudwatch_agent
    collect = written["logs"]["logs_collected"]["files"]["collect_list"]
    assert {c["file_path"] for c in collect} == {"/var/log/cluster/bootstrap.log",
                                                 "/var/log/cluster/health-monitor.log",
                                                 "/var/log/cluster/metrics/efa-*.log"}
    assert set(written["metrics"]["metrics_collected"]) == {"nvidia_gpu", "cpu", "mem", "disk"}


def test_first_run_writes_config_fetches_it_and_starts_the_efa_collector(fake_node, config):
    plan, host = run_logging(fake_node, config)
    ctl = fake_node.path(AGENT_CTL)
    assert fake_node.runner.commands(mutating=True) == [
        f"{ctl} -a fetch-config -m ec2 -c file:{fake_node.path(AGENT_CONFIG)} -s",
        "/usr/bin/systemctl daemon-reload",
        f"/usr/bin/systemctl enable --now {UNIT}",
    ]
    assert host.changes == [f"write {AGENT_CONFIG}", f"write {UNIT_PATH}"]
    assert fake_node.agent_running and fake_node.units[UNIT] == "active"
    unit = (fake_node.root / UNIT_PATH.lstrip("/")).read_text()
    assert ("ExecStart=/usr/bin/python3 -m node_bootstrap.efa_metrics --config /etc/cluster/node-config.json"
            in unit)
    assert "Environment=PYTHONPATH=/opt/cluster/bundle" in unit and "Restart=always" in unit


def test_second_run_keeps_the_running_agent_and_its_appended_configs(fake_node, config):
    run_logging(fake_node, config)
    fake_node.runner.calls.clear()
    plan, host = run_logging(fake_node, config)
    assert fake_node.runner.mutating_calls == [] and host.changes == []
    assert fake_node.agent_config_loads == 1  # a second fetch-config would drop jobs' appended configs
    assert f"{UNIT} runs" in plan.notes


def test_a_stopped_agent_and_collector_are_started_not_rewritten(fake_node, config):
    run_logging(fake_node, config)
    fake_node.agent_running = False
    fake_node.units[UNIT] = "failed"
    fake_node.runner.calls.clear()
    run_logging(fake_node, config)
    assert fake_node.runner.commands(mutating=True) == [
        f"{fake_node.path(AGENT_CTL)} -a start -m ec2", f"/usr/bin/systemctl enable --now {UNIT}"]
    assert fake_node.agent_config_loads == 1


def test_a_changed_interval_reloads_the_agent_and_restarts_nothing_else(fake_node, kit):
    first = parse_node_config(kit.node_config_dict())
    run_logging(fake_node, first)
    data = kit.node_config_dict()
    data["cloudwatchAgent"]["agent"]["metrics_collection_interval"] = 30
    fake_node.runner.calls.clear()
    run_logging(fake_node, parse_node_config(data))
    assert [c.split()[1:3] for c in fake_node.runner.commands(mutating=True)] == [["-a", "fetch-config"]]


def test_a_changed_unit_restarts_the_running_collector(fake_node, kit, config):
    run_logging(fake_node, config)
    moved = parse_node_config(kit.node_config_dict(**{"training.bundleDir": "/opt/cluster/bundle-2"}))
    fake_node.write("/opt/cluster/bundle-2/training/__init__.py", "")
    fake_node.runner.calls.clear()
    run_logging(fake_node, moved)
    assert fake_node.runner.commands(mutating=True) == [
        "/usr/bin/systemctl daemon-reload", f"/usr/bin/systemctl restart {UNIT}"]
    assert "PYTHONPATH=/opt/cluster/bundle-2" in build_efa_metrics_unit(moved)


def test_instance_types_without_efa_get_no_collector(fake_node, kit):
    config = parse_node_config(kit.node_config_dict(**{"expected.efaInterfaceCount": 0}))
    plan, host = run_logging(fake_node, config)
    assert not any("systemctl" in c for c in fake_node.runner.commands())
    assert any("no EFA metrics collector" in n for n in plan.notes)


def test_without_systemd_the_collector_is_only_noted(fake_node, config):
    fake_node.runner.on_path.discard("systemctl")
    plan, host = run_logging(fake_node, config)
    assert host.changes == [f"write {AGENT_CONFIG}"]
    assert any(n.startswith("WARNING: systemctl not found") for n in plan.notes)


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
