"""Step `monitor` of the boot sequence: the monitor's first round, then its systemd timer.

The first round runs report-only (the boot sequence itself tags and marks a failed node): it proves the
monitor works on this node, sets its kernel-log cursor and fails the boot if the node is already unhealthy.
Only after it passes are the units written and the timer enabled, so a monitor that cannot run is never
left firing every minute. A timer and a oneshot service rather than a daemon: each round is a fresh process
whose memory is the state file, and a round stuck on a dead GPU (nvidia-smi in uninterruptible sleep) is
killed by TimeoutStartSec while the next one still starts.

Beside the timer, a long-running service follows the kernel log and answers a fatal Xid at once (follow.py):
a daemon because it waits on the kernel, not on a clock; `Restart=always`, and the round remains the safety
net for whatever it misses between restarts. Both are enabled together, after the first round passed.

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
FOLLOWER = "cluster-health-xid-follower.service"
UNITS = (TIMER, FOLLOWER)  # what is enabled and started
FOLLOWER_RESTART_S = 5
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


def render_follower(config: NodeConfig, config_path: str = DEFAULT_CONFIG_PATH) -> str:
    return f"""\
# Written by node_bootstrap (step monitor); edits are overwritten.
[Unit]
Description=Training cluster node health monitor: follows the kernel log, answers a fatal Xid at once
After=network-online.target
Wants=network-online.target

[Service]
Type=simple
Environment=PYTHONPATH={config.training.bundle_dir}
ExecStart={SYSTEM_PYTHON} -m node_bootstrap monitor --follow --config {config_path}
Restart=always
RestartSec={FOLLOWER_RESTART_S}

[Install]
WantedBy=multi-user.target
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
    service_path, timer_path, follower_path = (f"{UNIT_DIR}/{u}" for u in (SERVICE, TIMER, FOLLOWER))
    paths = (service_path, timer_path, follower_path)
    if not config.monitor.enabled:
        if any(host.exists(p) for p in paths):
            for unit in UNITS:
                plan.add(f"stop and disable {unit} (monitor.intervalSeconds is 0)",
                         argv=("systemctl", "disable", "--now", unit))
            plan.add(f"remove {', '.join(paths)}",
                     apply=lambda: [host.remove(p) for p in paths if host.exists(p)])
            plan.add("reload systemd's units", argv=("systemctl", "daemon-reload"))
        else:
            plan.note("the node health monitor is off (monitor.intervalSeconds is 0)")
        return plan

    plan.add("run the monitor's first round (report only): the timer is enabled only if it passes",
             apply=first_round)
    first = len(plan.actions)
    wanted = {service_path: render_service(config), timer_path: render_timer(config),
              follower_path: render_follower(config)}
    changed = [path for path, text in wanted.items() if host.read_text(path, default="") != text]
    if changed:
        plan.add(f"write {', '.join(changed)} (a round every {config.monitor.interval_seconds} s, and the "
                 "kernel-log follower)", apply=lambda: [host.write_text(path, wanted[path]) for path in changed])
        plan.add("reload systemd's units", argv=("systemctl", "daemon-reload"))
    if service_path in changed or timer_path in changed or not _unit_running(runner, TIMER):
        plan.add(f"enable and start {TIMER}", argv=("systemctl", "enable", "--now", TIMER))
    if follower_path in changed:
        plan.add(f"enable {FOLLOWER}", argv=("systemctl", "enable", FOLLOWER))
        # restart, not start: a follower already running would keep its old unit
        plan.add(f"(re)start {FOLLOWER}", argv=("systemctl", "restart", FOLLOWER))
    elif not _unit_running(runner, FOLLOWER):
        plan.add(f"enable and start {FOLLOWER}", argv=("systemctl", "enable", "--now", FOLLOWER))
    if len(plan.actions) == first:
        plan.note(f"{' and '.join(UNITS)} are enabled and running")
    return plan


def _unit_running(runner: Runner, unit: str) -> bool:
    enabled = runner.run(("systemctl", "is-enabled", unit), mutating=False, check=False)
    active = runner.run(("systemctl", "is-active", unit), mutating=False, check=False)
    return enabled.ok and active.ok


def require_healthy(outcome) -> None:
    """For the first round: an unhealthy node fails the boot with the monitor's reason."""
    if outcome.unhealthy is not None:
        raise StepError(outcome.unhealthy.reason)
