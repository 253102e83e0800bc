"""What the health monitor does about an unhealthy node, end to end (node_monitor_support: a fake P5, aws on
moto): stop the job (directly or through its systemd unit), tag, log, mark the node Unhealthy, in that order;
once, with a failed response retried the next round; in dry-run only printed."""

from __future__ import annotations

import json
import os
import signal

from node_monitor_support import (
    XID_79,
    group_health,
    health_log_events,
    instance_tags,
    published,
    start_job_stand_in,
)

from node_bootstrap.monitor.actions import RESPONSES
from node_bootstrap.monitor.state import STATE_PATH


def test_xid_79_after_boot_stops_the_job_tags_logs_and_marks_the_node_unhealthy(monitored, capsys):
    node = monitored
    assert node.round() == 0  # the boot's kernel log: clean
    assert instance_tags(node.instance_id) == {} and group_health(node.instance_id) == "Healthy"
    assert published(node, "NodeUnhealthy") == [0] and published(node, "NodeHealthWarnings") == [0]
    proc, marker, job_dir = start_job_stand_in(node)
    try:
        node.journal.append(XID_79)
        assert node.round() == 1
        assert proc.wait(timeout=10) == 0 and marker.read_text() == "SIGTERM"
    finally:
        proc.kill()
        proc.wait()
    reason = ("health monitor: xid: new: Xid 79 on 0000:b9:00: GPU has fallen off the bus (no longer reachable "
              "over PCIe) (NVIDIA: RESTART_BM)")
    assert instance_tags(node.instance_id) == {"cluster:health": "unhealthy", "cluster:health-reason": reason}
    assert group_health(node.instance_id) == "Unhealthy"
    set_health = [p for s, o, p in node.aws_calls.calls if o == "set-instance-health"]
    assert set_health == [{"InstanceId": node.instance_id, "HealthStatus": "Unhealthy",
                           "ShouldRespectGracePeriod": False}]
    events = health_log_events(node.instance_id)
    assert [(e["event"], e["reason"]) for e in events] == [("node-unhealthy", reason)]
    assert json.loads((job_dir / "stop-request.json").read_text())["reason"] == reason
    assert published(node, "NodeUnhealthy") == [1]
    # The order: the job first (local, instant), the group last (it may terminate the node at once).
    mutating = [c for c in node.runner.commands(mutating=True)]
    assert [c.split()[0] if c.startswith("kill") else " ".join(c.split()[1:3]) for c in mutating] == [
        "kill", "ec2 create-tags", "logs create-log-stream", "logs put-log-events",
        "autoscaling set-instance-health", "cloudwatch put-metric-data"]
    state = json.loads((node.root / STATE_PATH.lstrip("/")).read_text())
    assert state["unhealthy"]["done"] == list(RESPONSES)
    out = capsys.readouterr().out
    assert "UNHEALTHY since" in out and "responses done: stop-job, tag, log, health" in out
    log = (node.root / "var/log/cluster/health-monitor.log").read_text()
    assert "ERROR monitor: node UNHEALTHY: " + reason in log


def test_a_second_round_after_the_same_log_does_not_act_twice(monitored):
    node = monitored
    node.journal.append(XID_79)
    assert node.round() == 1
    tagged = instance_tags(node.instance_id)
    assert node.round() == 1  # still unhealthy: the node is being replaced
    assert node.runner.commands(mutating=True) == [
        c for c in node.runner.commands(mutating=True) if " cloudwatch put-metric-data " in c]
    assert published(node, "NodeUnhealthy") == [1]
    assert instance_tags(node.instance_id) == tagged and len(health_log_events(node.instance_id)) == 1
    # journalctl resumed after the cursor: the Xid line was not read again
    journal_calls = [c for c in node.runner.commands() if c.startswith("journalctl")]
    assert journal_calls == [f"journalctl -k --no-pager -o short-iso --show-cursor '--after-cursor=s=0b1c2d3e;i="
                             f"{len(node.journal.lines)}'"]


def test_a_failed_response_is_retried_next_round_and_the_others_are_not_repeated(monitored):
    node = monitored
    node.journal.append(XID_79)
    real_aws = node.aws_calls

    def throttled(argv):
        if argv[2] == "set-instance-health":
            return 254, "", "An error occurred (Throttling) when calling the SetInstanceHealth operation: Rate exceeded"
        return real_aws(argv)
    node.runner.on("aws", throttled)
    assert node.round() == 1
    assert group_health(node.instance_id) == "Healthy"
    state = json.loads((node.root / STATE_PATH.lstrip("/")).read_text())
    assert state["unhealthy"]["done"] == ["stop-job", "tag", "log"]
    node.runner.on("aws", real_aws)
    assert node.round() == 1
    assert group_health(node.instance_id) == "Unhealthy"
    operations = [o for s, o, p in real_aws.calls]
    assert operations == ["set-instance-health", "put-metric-data"]


def test_dry_run_prints_the_responses_and_saves_nothing(monitored, capsys):
    node = monitored
    assert node.round() == 0
    state_before = (node.root / STATE_PATH.lstrip("/")).read_text()
    proc, marker, job_dir = start_job_stand_in(node)
    try:
        node.journal.append(XID_79)
        capsys.readouterr()
        assert node.round("--dry-run") == 1
        out = capsys.readouterr().out
        assert f"  would run: kill -s TERM {proc.pid}" in out
        assert f"  would run: aws autoscaling set-instance-health --region us-east-1 --instance-id " \
               f"{node.instance_id} --health-status Unhealthy --no-should-respect-grace-period" in out
        assert "would run: aws ec2 create-tags" in out and "(dry run:" in out
        assert proc.poll() is None and not marker.exists() and not (job_dir / "stop-request.json").exists()
        assert node.aws_calls.calls == [] and instance_tags(node.instance_id) == {}
        assert (node.root / STATE_PATH.lstrip("/")).read_text() == state_before
        # the real round after it still sees the Xid
        assert node.round() == 1 and group_health(node.instance_id) == "Unhealthy"
    finally:
        proc.kill()
        proc.wait()


def test_a_job_started_by_systemd_is_stopped_through_its_unit(monitored):
    node = monitored
    proc, marker, job_dir = start_job_stand_in(node, launcher="systemd")
    stopped = []
    original = node.runner.handlers["systemctl"]  # the round's own systemctl calls (is-failed) answer as before
    node.runner.on("systemctl", lambda argv: original(argv) if argv[1] != "kill" else (
        stopped.append(argv[1:]), os.kill(proc.pid, signal.SIGTERM), (0, ""))[2])
    try:
        node.journal.append(XID_79)
        assert node.round() == 1
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()
    assert stopped == [["kill", "--kill-whom=main", "--signal=SIGTERM", "training-job-j-20250311-120000-abcd.service"]]
