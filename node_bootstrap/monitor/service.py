"""Step `monitor` of the boot sequence: the monitor's first round, then its systemd timer.

The first round runs report-only (the boot sequence itself tags and marks a failed node): it proves the
monitor works on this node, sets its kernel-log cursor and fails the boot if the node is already unhealthy.
Only after it passes are the units written and the timer enabled, so a monitor that cannot run is never
left firing every minute. A timer and a oneshot service rather than a daemon: each round is a fresh process
whose memory is the state file, and a round stuck on a dead GPU (nvidia-smi in uninterruptible sleep) is
killed by TimeoutStartSec while the next one still starts.

`healthCheckIntervalSeconds=0` (node config monitor.intervalSeconds 0) disables and removes the units.
"""

from __future__ import annotations

from typing import Callable

from node_bootstrap.config import DEFAULT_CONFIG_PATH, NodeConfig
from node_bootstrap.errors import StepError
from node_bootstrap.host import Host
from node_bootstrap.plan import StepPlan
from node_bootstrap.runner import Runner

UNIT_DIR = "/etc/systemd/system"
SERVICE = "cluster-health-monitor.service"
TIMER = "cluster-health-monitor.timer"
SYSTEM_PYTHON = "/usr/bin/python3"  # the AMI's Python 3.9+, the one user-data runs node_bootstrap with
# Each command of a round ends in bounded time (runner.py): nvidia-smi 120 s, fi_info 120 s, journalctl 60 s,
# each aws call 60 s; this bounds the whole round even when all of them time out in turn.
ROUND_TIMEOUT_S = 900


def render_service(config: NodeConfig, config_path: str = DEFAULT_CONFIG_PATH) -> str:
    return f"""\
# Written by node_bootstrap (step monitor); edits are overwritten.
[Unit]
Description=Training cluster node health monitor, one round (docs/operations.md, When a node fails)
After=network-online.target
Wants=network-online.target

[Service]
Type=oneshot
Environment=PYTHONPATH={config.training.bundle_dir}
ExecStart={SYSTEM_PYTHON} -m node_bootstrap monitor --once --config {config_path}
TimeoutStartSec={ROUND_TIMEOUT_S}
"""


def render_timer(config: NodeConfig) -> str:
    interval = config.monitor.interval_seconds
    return f"""\
# Written by node_bootstrap (step monitor); edits are overwritten.
[Unit]
Description=Run the training cluster node health monitor every {interval} s

[Timer]
OnActiveSec={interval}
OnUnitActiveSec={interval}
AccuracySec=1s

[Install]
WantedBy=timers.target
"""


def plan_monitor(config: NodeConfig, host: Host, runner: Runner, first_round: Callable[[], None]) -> StepPlan:
    """`first_round` runs one report-only round and raises StepError when the node is unhealthy."""
    plan = StepPlan("monitor")
    service_path, timer_path = f"{UNIT_DIR}/{SERVICE}", f"{UNIT_DIR}/{TIMER}"
    if not config.monitor.enabled:
        if host.exists(timer_path) or host.exists(service_path):
            plan.add(f"stop and disable {TIMER} (monitor.intervalSeconds is 0)",
                     argv=("systemctl", "disable", "--now", TIMER))
            plan.add(f"remove {service_path} and {timer_path}",
                     apply=lambda: [host.remove(p) for p in (service_path, timer_path) if host.exists(p)])
            plan.add("reload systemd's units", argv=("systemctl", "daemon-reload"))
        else:
            plan.note("the node health monitor is off (monitor.intervalSeconds is 0)")
        return plan

    plan.add("run the monitor's first round (report only): the timer is enabled only if it passes",
             apply=first_round)
    service, timer = render_service(config), render_timer(config)
    changed = host.read_text(service_path, default="") != service or host.read_text(timer_path, default="") != timer
    if changed:
        plan.add(f"write {service_path} and {timer_path} (a round every {config.monitor.interval_seconds} s)",
                 apply=lambda: (host.write_text(service_path, service), host.write_text(timer_path, timer)))
        plan.add("reload systemd's units", argv=("systemctl", "daemon-reload"))
    if changed or not _timer_running(runner):
        plan.add(f"enable and start {TIMER}", argv=("systemctl", "enable", "--now", TIMER))
    else:
        plan.note(f"{TIMER} is enabled and running")
    return plan


def _timer_running(runner: Runner) -> bool:
    enabled = runner.run(("systemctl", "is-enabled", TIMER), mutating=False, check=False)
    active = runner.run(("systemctl", "is-active", TIMER), mutating=False, check=False)
    return enabled.ok and active.ok


def require_healthy(outcome) -> None:
    """For the first round: an unhealthy node fails the boot with the monitor's reason."""
    if outcome.unhealthy is not None:
        raise StepError(outcome.unhealthy.reason)
