"""Step 0, logging: ship the bootstrap log to the stack's CloudWatch log group with the CloudWatch agent.

The base agent config holds the bootstrap log only: node_bootstrap.jobs adds each job's log file with
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

from node_bootstrap.config import NodeConfig
from node_bootstrap.host import Host
from node_bootstrap.logs import LOG_FILE
from node_bootstrap.plan import StepPlan
from node_bootstrap.runner import Runner

LOG = logging.getLogger("node_bootstrap")

AGENT_CTL = "/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl"
AGENT_CONFIG = "/etc/cluster/cloudwatch-agent.json"
STREAM_NAME = "{instance_id}/bootstrap"


def build_agent_config(log_group_name: str) -> str:
    config = {
        "logs": {
            "logs_collected": {
                "files": {
                    "collect_list": [
                        {
                            "file_path": LOG_FILE,
                            "log_group_name": log_group_name,
                            "log_stream_name": STREAM_NAME,
                            "timezone": "UTC",
                        }
                    ]
                }
            }
        }
    }
    return json.dumps(config, indent=2, sort_keys=True) + "\n"


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

    text = build_agent_config(config.logging.log_group_name)
    if host.read_text(AGENT_CONFIG, default="") != text:
        plan.add(f"write {AGENT_CONFIG} (bootstrap log -> {config.logging.log_group_name}, "
                 f"stream {STREAM_NAME})",
                 apply=lambda: host.write_text(AGENT_CONFIG, text))
        plan.add("load that config into the CloudWatch agent and start it",
                 argv=(ctl, "-a", "fetch-config", "-m", "ec2", "-c", "file:" + host.path(AGENT_CONFIG), "-s"))
    elif not _agent_running(runner, ctl):
        plan.add("start the stopped CloudWatch agent with its current configs",
                 argv=(ctl, "-a", "start", "-m", "ec2"))
    else:
        plan.note("the CloudWatch agent runs with the bootstrap log config")
    return plan


def _agent_running(runner: Runner, ctl: str) -> bool:
    """`-a status` prints JSON such as {"status": "running", "starttime": ..., "version": ...}."""
    result = runner.run((ctl, "-a", "status", "-m", "ec2"), mutating=False, check=False)
    if not result.ok:
        return False
    try:
        return json.loads(result.stdout).get("status") == "running"
    except (ValueError, AttributeError):
        return False
