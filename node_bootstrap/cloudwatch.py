"""Step 0, logging: the CloudWatch agent ships the bootstrap and health monitor logs and the node's metrics;
the EFA collector runs.

The base agent config is rendered by the stack into the node config (`cloudwatchAgent`,
cluster_constructs/cloudwatch_agent.py): the bootstrap log (stream `{instance_id}/bootstrap`), the node
health monitor's log (`{instance_id}/health`), the EFA collector's EMF files, and the GPU
(nvidia_gpu), CPU, memory and disk metrics every `metrics.intervalSeconds`. node_bootstrap.jobs adds each
job's log file with
`amazon-cloudwatch-agent-ctl -a append-config`, and `-a fetch-config` would drop those, so the config is only
(re)fetched when this file changes; an agent that is merely stopped is started with `-a start`, which keeps
every appended config. `{instance_id}` in log_stream_name is expanded by the agent (CloudWatch agent
configuration file reference, "logs" section).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Callable

from node_bootstrap.config import DEFAULT_CONFIG_PATH, NodeConfig
from node_bootstrap.efa_metrics import UNIT as EFA_METRICS_UNIT
from node_bootstrap.host import Host
from node_bootstrap.logs import LOG_FILE
from node_bootstrap.plan import StepPlan
from node_bootstrap.runner import Runner

LOG = logging.getLogger("node_bootstrap")

AGENT_CTL = "/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl"
AGENT_CONFIG = "/etc/cluster/cloudwatch-agent.json"
SYSTEMD_UNIT_DIR = "/etc/systemd/system"
SYSTEM_PYTHON = "/usr/bin/python3"  # the AMI's Python (3.9 on Amazon Linux 2023), as user-data runs us


def build_agent_config(config: NodeConfig) -> str:
    """The agent's config file: the node config's `cloudwatchAgent`, as the stack rendered it."""
    return json.dumps(config.cloudwatch_agent, indent=2, sort_keys=True) + "\n"


def build_efa_metrics_unit(config: NodeConfig) -> str:
    """The systemd unit of the EFA collector (node_bootstrap/efa_metrics.py)."""
    return "\n".join([
        "# Written by node_bootstrap (logging step); edits are overwritten.",
        "[Unit]",
        "Description=EFA hardware counters as CloudWatch EMF lines for the CloudWatch agent",
        "After=network-online.target",
        "",
        "[Service]",
        "Type=simple",
        f"Environment=PYTHONPATH={config.training.bundle_dir}",
        f"ExecStart={SYSTEM_PYTHON} -m node_bootstrap.efa_metrics --config {DEFAULT_CONFIG_PATH}",
        "Restart=always",
        "RestartSec=10",
        "Nice=10",
        "",
        "[Install]",
        "WantedBy=multi-user.target",
        "",
    ])


INSTALL_ATTEMPTS = 3
INSTALL_TIMEOUT_S = 600.0  # a first dnf run refreshes repository metadata


def plan_logging(config: NodeConfig, host: Host, runner: Runner, *,
                 sleep: Callable[[float], None] = time.sleep) -> StepPlan:
    plan = StepPlan("logging")
    ctl = host.path(AGENT_CTL)
    if not host.exists(AGENT_CTL):
        if runner.which("dnf") is None:
            plan.note("WARNING: the CloudWatch agent is not installed and dnf is not available to install "
                      f"it; the bootstrap log stays on the node only ({LOG_FILE})")
            return plan
        plan.add(f"install the CloudWatch agent ({INSTALL_ATTEMPTS} tries)",
                 apply=lambda: runner.run_retried(("dnf", "install", "-y", "amazon-cloudwatch-agent"),
                                                  attempts=INSTALL_ATTEMPTS, delay_s=5.0,
                                                  timeout=INSTALL_TIMEOUT_S, sleep=sleep))

    text = build_agent_config(config)
    if host.read_text(AGENT_CONFIG, default="") != text:
        plan.add(f"write {AGENT_CONFIG} (bootstrap and health logs, EFA metrics -> {config.logging.log_group_name}; "
                 f"GPU, CPU, memory and disk metrics every {config.metrics.interval_seconds} s)",
                 apply=lambda: host.write_text(AGENT_CONFIG, text))
        plan.add("load that config into the CloudWatch agent and start it",
                 argv=(ctl, "-a", "fetch-config", "-m", "ec2", "-c", "file:" + host.path(AGENT_CONFIG), "-s"))
    elif not _agent_running(runner, ctl):
        plan.add("start the stopped CloudWatch agent with its current configs",
                 argv=(ctl, "-a", "start", "-m", "ec2"))
    else:
        plan.note("the CloudWatch agent runs with the node's config")
    _plan_efa_collector(plan, config, host, runner)
    return plan


def _plan_efa_collector(plan: StepPlan, config: NodeConfig, host: Host, runner: Runner) -> None:
    """Install and start cluster-efa-metrics.service on EFA instance types; restart it when its unit
    changed. Without systemd (containers, tests) it is only noted."""
    if config.expected.efa_interface_count == 0:
        plan.note(f"{config.instance_type} has no EFA devices: no EFA metrics collector")
        return
    systemctl = runner.which("systemctl")
    if systemctl is None:
        plan.note(f"WARNING: systemctl not found: {EFA_METRICS_UNIT} (EFA metrics) is not installed")
        return
    unit_path = f"{SYSTEMD_UNIT_DIR}/{EFA_METRICS_UNIT}"
    unit = build_efa_metrics_unit(config)
    active = runner.run((systemctl, "is-active", EFA_METRICS_UNIT), mutating=False, check=False)
    running = active.stdout.strip() == "active"
    if host.read_text(unit_path, default="") != unit:
        plan.add(f"write {unit_path} (EFA counters -> EMF lines in {config.metrics.efa_metrics_dir})",
                 apply=lambda: host.write_text(unit_path, unit))
        plan.add("reload systemd's units", argv=(systemctl, "daemon-reload"))
        if running:
            plan.add(f"restart {EFA_METRICS_UNIT} with its new unit", argv=(systemctl, "restart", EFA_METRICS_UNIT))
            return
    elif running:
        plan.note(f"{EFA_METRICS_UNIT} runs")
        return
    plan.add(f"enable and start {EFA_METRICS_UNIT}", argv=(systemctl, "enable", "--now", EFA_METRICS_UNIT))


def _agent_running(runner: Runner, ctl: str) -> bool:
    """`-a status` prints JSON such as {"status": "running", "starttime": ..., "version": ...}."""
    result = runner.run((ctl, "-a", "status", "-m", "ec2"), mutating=False, check=False)
    if not result.ok:
        return False
    try:
        return json.loads(result.stdout).get("status") == "running"
    except (ValueError, AttributeError):
        return False
