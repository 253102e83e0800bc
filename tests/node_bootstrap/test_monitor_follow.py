"""The kernel-log follower (`monitor --follow`) answers a fatal Xid as the kernel logs it, without a round:
the fake node's /dev/kmsg is a named pipe this test writes kernel records into, the round interval is an hour
and no round runs; the responses are the round's own (node_monitor_support: aws on moto)."""

from __future__ import annotations

import json
import os
import threading

import pytest
from node_jobs_support import wait_until
from node_monitor_support import XID_79, group_health, health_log_events, instance_tags, start_job_stand_in

from node_bootstrap.cli import main
from node_bootstrap.monitor.actions import RESPONSES
from node_bootstrap.monitor.state import STATE_PATH

# The round's reason for the same Xid (test_monitor_responses.py): the follower's finding is the round's.
REASON = ("health monitor: xid: new: Xid 79 on 0000:b9:00: GPU has fallen off the bus (no longer reachable over "
          "PCIe) (NVIDIA: RESTART_BM)")
KMSG_79 = "3,1843,912345678,-;NVRM: Xid (PCI:0000:b9:00): 79, pid='<unknown>', name=<unknown>, GPU has fallen " \
          "off the bus.\n SUBSYSTEM=pci\n DEVICE=+pci:0000:b9:00.0\n"
KMSG_13 = "4,1844,912345999,-;NVRM: Xid (PCI:0000:53:00): 13, pid=4242, name=python, Graphics Exception: ESR " \
          "0x504648=0x1000e\n"


class Follower:
    """`monitor --follow` in a thread of this test (moto's AWS is this process's), fed through the pipe."""

    def __init__(self, node, imds):
        config = json.loads((node.root / "etc/cluster/node-config.json").read_text())
        config["monitor"]["intervalSeconds"] = 3600  # a round would come an hour late: none runs here
        node.write("/etc/cluster/node-config.json", json.dumps(config))
        self.node = node
        self.kmsg = node.root / "dev/kmsg"
        os.mkfifo(self.kmsg)
        self.exit_code = None

        def run():
            self.exit_code = main(["monitor", "--follow", "--root", str(node.root)],
                                  make_runner=lambda dry_run: node.runner, imds=imds)
        node.runner.calls.clear()
        self.thread = threading.Thread(target=run, name="follower", daemon=True)
        self.thread.start()
        self.writer = open(self.kmsg, "w")  # returns once the follower has opened the pipe to read

    def write(self, records: str) -> None:
        self.writer.write(records)
        self.writer.flush()

    def stop(self) -> int:
        """The kernel log ends (the writer closes): the follower returns."""
        if not self.writer.closed:
            self.writer.close()
        self.thread.join(timeout=20)
        assert not self.thread.is_alive()
        return self.exit_code


@pytest.fixture
def follower(monitored):
    from node_monitor_support import Imds
    made = []

    def start():
        made.append(Follower(monitored, Imds(monitored.instance_id)))
        return made[-1]
    yield start
    for f in made:
        f.stop()


def state(node):
    path = node.root / STATE_PATH.lstrip("/")
    return json.loads(path.read_text()) if path.exists() else {}


def monitor_log(node):
    path = node.root / "var/log/cluster/health-monitor.log"
    return path.read_text() if path.exists() else ""


def test_a_fatal_xid_is_answered_at_once_without_a_round(monitored, follower):
    node = monitored
    proc, marker, job_dir = start_job_stand_in(node)
    try:
        f = follower()
        f.write("6,1842,912300000,-;nvme nvme3: I/O 17 QID 5 timeout, completion polled\n")  # not an Xid
        f.write(KMSG_79)
        wait_until(lambda: (state(node).get("unhealthy") or {}).get("done") == list(RESPONSES), 20,
                   "the follower's responses")
        assert proc.wait(timeout=10) == 0 and marker.read_text() == "SIGTERM"
        assert f.stop() == 2  # the kernel log ended
    finally:
        proc.kill()
        proc.wait()
    assert state(node)["unhealthy"]["reason"] == REASON
    assert instance_tags(node.instance_id) == {"cluster:health": "unhealthy", "cluster:health-reason": REASON}
    assert group_health(node.instance_id) == "Unhealthy"
    assert [(e["event"], e["reason"]) for e in health_log_events(node.instance_id)] == [("node-unhealthy", REASON)]
    assert json.loads((job_dir / "stop-request.json").read_text())["reason"] == REASON
    # the round's responses, in the round's order; and no round ran (no GPU query, no journal read)
    commands = node.runner.commands()
    assert [c.split()[0] if c.startswith("kill") else " ".join(c.split()[1:3]) for c in commands] == [
        "kill", "ec2 create-tags", "logs create-log-stream", "logs put-log-events", "autoscaling set-instance-health"]
    assert "ERROR monitor: node UNHEALTHY (from the kernel log, at once): " + REASON in monitor_log(node)

    # The next round finds the finding recorded and repeats none of the responses.
    node.journal.append(XID_79)
    assert node.round() == 1
    assert [c for c in node.runner.commands(mutating=True)] == [
        c for c in node.runner.commands(mutating=True) if " cloudwatch put-metric-data " in c]
    assert len(health_log_events(node.instance_id)) == 1


def test_an_application_xid_is_logged_and_nothing_is_done(monitored, follower):
    node = monitored
    proc, marker, job_dir = start_job_stand_in(node)
    try:
        f = follower()
        f.write(KMSG_13)
        wait_until(lambda: "WARN xid (kernel log): new, not acted on: Xid 13 on 0000:53:00" in monitor_log(node),
                   20, "the follower's warning")
        assert f.stop() == 2
        assert proc.poll() is None and not marker.exists()
    finally:
        proc.kill()
        proc.wait()
    assert state(node).get("unhealthy") is None
    assert node.runner.commands(mutating=True) == [] and instance_tags(node.instance_id) == {}
    assert group_health(node.instance_id) == "Healthy"


def test_without_dev_kmsg_the_journal_is_followed(monitored, tmp_path, monkeypatch):
    """journalctl -k -f, where /dev/kmsg cannot be opened: a stand-in journalctl on PATH prints the line the
    real one prints for the Xid, in the form the follower asks for (short-iso), and ends."""
    from node_monitor_support import Imds
    node = monitored
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    argv_file = tmp_path / "journalctl.argv"
    (bin_dir / "journalctl").write_text(f"#!/bin/sh\necho \"$@\" > {argv_file}\necho \"{XID_79}\"\n")
    (bin_dir / "journalctl").chmod(0o755)
    monkeypatch.setenv("PATH", f"{bin_dir}{os.pathsep}{os.environ['PATH']}")
    assert not (node.root / "dev/kmsg").exists()
    node.runner.calls.clear()
    assert main(["monitor", "--follow", "--root", str(node.root)], make_runner=lambda dry_run: node.runner,
                imds=Imds(node.instance_id)) == 2
    assert argv_file.read_text().split() == ["-k", "-f", "-n", "0", "--no-pager", "-o", "short-iso"]
    assert state(node)["unhealthy"] == {"reason": REASON, "since": state(node)["unhealthy"]["since"],
                                        "done": list(RESPONSES)}
    assert group_health(node.instance_id) == "Unhealthy"


def test_follow_takes_no_round_options(monitored, capsys):
    assert main(["monitor", "--follow", "--once", "--root", str(monitored.root)]) == 2
    assert "monitor --follow takes no --once, --dry-run or --json" in capsys.readouterr().err


def test_a_finding_the_follower_records_while_a_round_runs_is_kept_and_answered_once(monitored):
    """The follower answers an Xid while a round is busy with nvidia-smi: the round, whose own kernel-log read
    was clean, keeps the follower's finding instead of saving its older state over it, and repeats no response."""
    from node_monitor_support import Imds

    from node_bootstrap.config import load_node_config
    from node_bootstrap.host import Host
    from node_bootstrap.monitor.actions import Responder
    from node_bootstrap.monitor.follow import respond_now

    node = monitored
    host = Host(str(node.root))
    responder = Responder(load_node_config(host.path("/etc/cluster/node-config.json")), host, node.runner,
                          Imds(node.instance_id).identity)
    gpu_query = node.runner.handlers["nvidia-smi"]

    def follower_meanwhile(argv):
        if not state(node).get("unhealthy"):
            respond_now(host, responder, REASON[len("health monitor: "):])
        return gpu_query(argv)
    node.runner.on("nvidia-smi", follower_meanwhile)
    assert node.round() == 1  # unhealthy: the follower's finding
    assert state(node)["unhealthy"]["reason"] == REASON and state(node)["unhealthy"]["done"] == list(RESPONSES)
    operations = [" ".join(c.split()[1:3]) for c in node.runner.commands(mutating=True) if c.startswith("aws ")]
    assert operations == ["ec2 create-tags", "logs create-log-stream", "logs put-log-events",
                          "autoscaling set-instance-health", "cloudwatch put-metric-data"]
    assert "monitor: checks pass now, but this node was found unhealthy at " in monitor_log(node)
