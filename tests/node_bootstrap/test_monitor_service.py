"""The boot sequence's `monitor` step: the first round, then the systemd timer, and only in that order."""

from __future__ import annotations

import json

from node_bootstrap.cli import main
from node_bootstrap.efa_metrics import UNIT as EFA_METRICS_UNIT
from node_bootstrap.imds_block import SERVICE as IMDS_BLOCK_UNIT
from node_bootstrap.monitor.service import FOLLOWER, SERVICE, TIMER

UNITS = "etc/systemd/system"


def monitor_units(fake_node) -> set:
    """The enabled units that are the monitor's (the logging step enables the EFA collector's too, and the
    imdsblock step its own)."""
    return {unit for unit in fake_node.enabled_units if unit not in (EFA_METRICS_UNIT, IMDS_BLOCK_UNIT)}


def run_main(node, kit, *args):
    def make_runner(dry_run):
        node.runner.dry_run = dry_run
        return node.runner
    return main([args[0], "--root", str(node.root), *args[1:]], make_runner=make_runner, imds=kit.FakeImds(),
                sleep=[].append)


def set_interval(node, seconds):
    config = json.loads((node.root / "etc/cluster/node-config.json").read_text())
    config["monitor"]["intervalSeconds"] = seconds
    node.write("/etc/cluster/node-config.json", json.dumps(config))


def test_the_timer_is_enabled_after_the_first_round_passed(fake_node, kit):
    assert run_main(fake_node, kit, "run") == 0
    commands = fake_node.runner.commands()
    first_round = commands.index("nvidia-smi nvlink --status")  # the monitor's own probe, not the gate's
    enable = commands.index(f"systemctl enable --now {TIMER}")
    reload = len(commands) - 1 - commands[::-1].index("systemctl daemon-reload")  # scratch reloads earlier
    assert first_round < reload < enable < commands.index(f"systemctl restart {FOLLOWER}")
    assert monitor_units(fake_node) == {TIMER, FOLLOWER}
    assert fake_node.units[TIMER] == "active" and fake_node.units[FOLLOWER] == "active"
    follower = (fake_node.root / UNITS / FOLLOWER).read_text()
    assert "ExecStart=/usr/bin/python3 -m node_bootstrap monitor --follow --config /etc/cluster/node-config.json\n" \
        in follower
    assert "Type=simple\n" in follower and "Restart=always\n" in follower and "WantedBy=multi-user.target\n" in follower
    service = (fake_node.root / UNITS / SERVICE).read_text()
    assert "ExecStart=/usr/bin/python3 -m node_bootstrap monitor --once --config /etc/cluster/node-config.json\n" \
        in service
    assert "Environment=PYTHONPATH=/opt/cluster/bundle\n" in service and "Type=oneshot\n" in service
    timer = (fake_node.root / UNITS / TIMER).read_text()
    assert "OnUnitActiveSec=60\n" in timer and "WantedBy=timers.target\n" in timer
    state = json.loads((fake_node.root / "var/lib/cluster/health-monitor/state.json").read_text())
    assert state["unhealthy"] is None and state["kernelLog"]["source"] == "journal"
    assert fake_node.tags["cluster:bootstrap"] == "ready"
    # report-only: the first round published nothing and tagged nothing of its own
    assert not any("put-metric-data --namespace TrainingCluster --metric-data" in c for c in commands)


def test_an_unhealthy_first_round_fails_the_boot_and_enables_nothing(fake_node, kit):
    fake_node.nvlink_txt = "nvidia-smi-nvlink-status.link-down.txt"  # the gate does not look at NVLink
    assert run_main(fake_node, kit, "run") == 3
    assert fake_node.tags["cluster:bootstrap"] == "failed"
    assert fake_node.tags["cluster:bootstrap-reason"] == (
        "monitor: health monitor: nvlink: GPU 5: link 7, 8 inactive")
    assert fake_node.health_status == "Unhealthy"
    assert not (fake_node.root / UNITS / TIMER).exists() and monitor_units(fake_node) == set()
    assert not (fake_node.root / UNITS / FOLLOWER).exists()
    assert not (fake_node.root / "var/lib/cluster/health-monitor/state.json").exists()


def test_a_second_run_changes_nothing(fake_node, kit):
    assert run_main(fake_node, kit, "run", "--only", "monitor") == 0
    fake_node.runner.calls.clear()
    assert run_main(fake_node, kit, "run", "--only", "monitor") == 0
    assert fake_node.runner.mutating_calls == []


def test_a_changed_interval_rewrites_the_timer(fake_node, kit):
    assert run_main(fake_node, kit, "run", "--only", "monitor") == 0
    set_interval(fake_node, 30)
    fake_node.runner.calls.clear()
    assert run_main(fake_node, kit, "run", "--only", "monitor") == 0
    assert "OnUnitActiveSec=30\n" in (fake_node.root / UNITS / TIMER).read_text()
    # the follower's unit did not change: it keeps running
    assert fake_node.runner.commands(mutating=True) == ["systemctl daemon-reload", f"systemctl enable --now {TIMER}"]


def test_interval_zero_turns_the_monitor_off_and_removes_its_units(fake_node, kit):
    assert run_main(fake_node, kit, "run", "--only", "monitor") == 0
    set_interval(fake_node, 0)
    assert run_main(fake_node, kit, "run", "--only", "monitor") == 0
    assert monitor_units(fake_node) == set() and fake_node.units[FOLLOWER] == "inactive"
    assert not [u for u in (TIMER, SERVICE, FOLLOWER) if (fake_node.root / UNITS / u).exists()]
    fake_node.runner.calls.clear()
    assert run_main(fake_node, kit, "run", "--only", "monitor") == 0
    assert fake_node.runner.calls == []  # off, and nothing left to remove


def test_dry_run_prints_the_step(fake_node, kit, capsys):
    assert run_main(fake_node, kit, "run", "--only", "monitor", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "[monitor] would run the monitor's first round (report only)" in out
    assert f"[monitor] would enable and start {TIMER}" in out and f"[monitor] would (re)start {FOLLOWER}" in out
    assert not (fake_node.root / UNITS / TIMER).exists()


def test_the_monitor_interval_is_validated_in_the_node_config(fake_node, kit, capsys):
    set_interval(fake_node, 5)
    assert run_main(fake_node, kit, "monitor", "--once") == 2
    assert ("monitor.intervalSeconds=5 is out of range; allowed: 0 (off) or an integer from 10 to 3600"
            in capsys.readouterr().err)


def test_a_stopped_follower_is_started_again(fake_node, kit):
    assert run_main(fake_node, kit, "run", "--only", "monitor") == 0
    fake_node.units[FOLLOWER] = "failed"
    fake_node.runner.calls.clear()
    assert run_main(fake_node, kit, "run", "--only", "monitor") == 0
    assert fake_node.runner.commands(mutating=True) == [f"systemctl enable --now {FOLLOWER}"]
