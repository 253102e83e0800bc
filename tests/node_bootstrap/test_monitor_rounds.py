"""What carries from one health-monitor round to the next, end to end (node_monitor_support): the kernel-log
cursor (journal or /dev/kmsg, a restarted monitor, a reboot, a cursor journalctl rejects, a journal without
kernel messages), the state file, and rounds at the interval without --once."""

from __future__ import annotations

import json

from node_monitor_support import XID_79, AwsOnMoto, Imds, Journal, group_health, instance_tags, published, run_json

from node_bootstrap.monitor.state import CHECK_REQUEST_PATH, STATE_PATH


def test_a_restarted_monitor_does_not_read_old_events_again(monitored, kit):
    node = monitored
    node.journal.append(*kit.fixture_text("journal-kernel-app-xid.txt").splitlines()[1:])
    assert node.round() == 0 and published(node, "NodeHealthWarnings") == [1]
    # Each round is a new process: nothing survives in memory, only the state file.
    node.runner.handlers["journalctl"] = Journal("\n".join(node.journal.lines))
    assert node.round() == 0
    assert published(node, "NodeHealthWarnings") == [0]
    report = json.loads(run_json(node))
    assert {c["name"]: c["detail"] for c in report["checks"]}["xid"] == "no new Xid events"


def test_after_a_reboot_the_new_boot_is_read_from_its_start(monitored, kit):
    node = monitored
    assert node.round() == 0
    node.write("/proc/sys/kernel/random/boot_id", "7d7e8f90-aaaa-4bbb-8ccc-0123456789ab\n")
    node.runner.handlers["journalctl"] = Journal(kit.fixture_text("journal-kernel-app-xid.txt"))
    assert node.round() == 0
    assert any(c.endswith(" -b 0") for c in node.runner.commands() if c.startswith("journalctl"))
    assert published(node, "NodeHealthWarnings") == [1]


def test_kmsg_is_read_where_journald_is_missing_and_its_sequence_is_the_cursor(monitored, kit):
    node = monitored
    node.runner.on_path.discard("journalctl")
    records = kit.fixture_text("kmsg-xid.txt").splitlines(keepends=True)
    node.write("/dev/kmsg", "".join(records[:5]))  # up to the Xid 13 and its continuation lines
    assert node.round() == 0 and published(node, "NodeHealthWarnings") == [1]
    state = json.loads((node.root / STATE_PATH.lstrip("/")).read_text())
    assert state["kernelLog"] == {"source": "kmsg", "bootId": "3f1c2b4a-9d8e-4f7a-b6c5-1e2d3c4b5a69", "seq": 1187}
    node.write("/dev/kmsg", "".join(records))  # the Xid 79 arrives; the ring buffer still holds the rest
    assert node.round() == 1
    assert instance_tags(node.instance_id)["cluster:health-reason"].startswith("health monitor: xid: new: Xid 79")
    assert published(node, "NodeHealthWarnings") == [0]  # the Xid 13 was not counted again


def test_an_unreadable_kernel_log_warns_and_keeps_the_cursor(monitored):
    node = monitored
    assert node.round() == 0
    before = json.loads((node.root / STATE_PATH.lstrip("/")).read_text())["kernelLog"]
    node.runner.on("journalctl", lambda argv: (1, "", "Failed to open journal: Permission denied"))
    assert node.round() == 0 and published(node, "NodeHealthWarnings") == [1]
    assert json.loads((node.root / STATE_PATH.lstrip("/")).read_text())["kernelLog"] == before


def test_a_corrupt_state_file_is_a_first_round(monitored):
    node = monitored
    node.write(STATE_PATH, "{not json")
    assert node.round() == 0
    assert json.loads((node.root / STATE_PATH.lstrip("/")).read_text())["kernelLog"]["source"] == "journal"


def test_rounds_without_once_repeat_at_the_interval(fake_node, kit, cloud):
    from types import SimpleNamespace

    from node_bootstrap.config import load_node_config
    from node_bootstrap.monitor.command import run_monitor
    fake_node.runner.on("aws", AwsOnMoto())
    sleeps = []
    args = SimpleNamespace(dry_run=False, verbose=False, json=False, once=False)
    config = load_node_config(fake_node.path("/etc/cluster/node-config.json"))
    code = run_monitor(args, config, fake_node.host(), fake_node.runner, Imds(cloud), sleep=sleeps.append,
                       max_rounds=3)
    assert code == 0 and sleeps == [60, 60]
    assert sum(c.startswith("journalctl") for c in fake_node.runner.commands()) == 3


def test_a_cursor_journalctl_rejects_means_reading_the_boot_again(monitored):
    node = monitored
    assert node.round() == 0
    journal = node.runner.handlers["journalctl"]

    def rejecting(argv):
        if any(a.startswith("--after-cursor=") for a in argv):
            return 1, "", "Failed to seek to cursor: Invalid argument"
        return journal(argv)
    node.runner.on("journalctl", rejecting)
    journal.append(XID_79)
    assert node.round() == 1
    assert [c.split()[-1] for c in node.runner.commands() if c.startswith("journalctl")][-1] == "0"  # -b 0
    assert group_health(node.instance_id) == "Unhealthy"


def test_a_journal_without_kernel_messages_sends_the_monitor_to_kmsg_for_the_boot(monitored, kit):
    """journald that stores no kernel messages (Storage=none, not flushed) answers "-- No entries --": the Xid
    is only in the ring buffer, and the monitor must find it there, then keep reading there."""
    node = monitored
    node.runner.on("journalctl", Journal(kit.fixture_text("journal-kernel-empty.txt")))
    node.write("/dev/kmsg", kit.fixture_text("kmsg-xid.txt"))
    assert node.round() == 1
    assert instance_tags(node.instance_id)["cluster:health-reason"].startswith("health monitor: xid: new: Xid 79")
    state = json.loads((node.root / STATE_PATH.lstrip("/")).read_text())
    assert state["kernelLog"]["source"] == "kmsg" and state["kernelLog"]["seq"] == 1203
    node.runner.calls.clear()
    assert node.round() == 1
    assert not [c for c in node.runner.commands() if c.startswith("journalctl")]  # kmsg for the rest of the boot


# --- the check a hang on this node asks for (node_bootstrap/jobs/hang_origin.py) ---------------------------


def answers(capsys):
    """The rounds' lines about a hang's check request since the last call (the monitor logs to stderr)."""
    captured = capsys.readouterr()
    return [line.split(" ", 2)[1:] for line in (captured.out + captured.err).splitlines() if "asked for" in line]


def test_a_hangs_check_request_is_answered_by_the_next_round_and_removed(monitored, capsys):
    node = monitored
    request = {"jobId": "j-llama", "attempt": 2, "evidence": "rank 5 (pid 4242) is stopped (state T: SIGSTOP, "
               "a debugger or a job-control stop)", "at": "2026-12-04T10:00:00Z"}
    node.write(CHECK_REQUEST_PATH, json.dumps(request))
    assert node.round("--dry-run") == 0
    assert (node.root / CHECK_REQUEST_PATH.lstrip("/")).exists()  # a dry run removes nothing
    capsys.readouterr()
    assert node.round() == 0
    assert answers(capsys) == [[
        "WARNING", f"monitor: the check a hang on this node asked for (job j-llama attempt 2: {request['evidence']} "
        "(at 2026-12-04T10:00:00Z)): healthy, 0 warning(s)"]]
    assert not (node.root / CHECK_REQUEST_PATH.lstrip("/")).exists()
    assert node.round() == 0
    assert answers(capsys) == []  # answered once: the next round has nothing to say of it


def test_a_fault_the_requested_check_finds_makes_the_node_unhealthy_and_says_so(monitored, capsys):
    node = monitored
    assert node.round() == 0
    node.write(CHECK_REQUEST_PATH, "{not json")  # whatever the file holds, the round answers and removes it
    node.journal.append(XID_79)
    capsys.readouterr()
    assert node.round() == 1
    (level, line), = answers(capsys)
    assert level == "ERROR"
    assert line.startswith("monitor: the check a hang on this node asked for (job ? attempt ?: ? (at ?)): "
                           "UNHEALTHY: health monitor: xid: new: Xid 79 on ")
    assert not (node.root / CHECK_REQUEST_PATH.lstrip("/")).exists()
