"""The node health monitor end to end: `python3 -m node_bootstrap monitor --once` on a fake P5 (recorded
nvidia-smi, fi_info and kernel-log output through the runner seam), a kernel journal that grows between
rounds, a real process standing in for the job's supervisor, and every `aws` command the monitor runs
parsed against botocore's service model and executed on moto: the requests are the real API's, and the
instance's tags, its Auto Scaling health, the log event and the metrics are read back from there."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys

import boto3
import pytest
from botocore import xform_name
from botocore.exceptions import ClientError
from moto import mock_aws

from node_bootstrap.cli import main
from node_bootstrap.imds import InstanceIdentity
from node_bootstrap.monitor.actions import RESPONSES
from node_bootstrap.monitor.state import STATE_PATH

GROUP = "TrainingClusterStack-nodes"
LOG_GROUP = "/training-cluster/TrainingClusterStack"
REGION = "us-east-1"
XID_79 = ("2025-03-11T12:03:19+00:00 ip-10-0-12-34 kernel: NVRM: Xid (PCI:0000:b9:00): 79, pid='<unknown>', "
          "name=<unknown>, GPU has fallen off the bus.")


class AwsOnMoto:
    """`aws SERVICE OPERATION --option value ...` as the AWS CLI maps it onto the API (operation and option
    names are the model's names in kebab case, `--no-x` is a false boolean, JSON for lists and structures),
    validated by botocore against the service model and run on moto."""

    def __init__(self):
        self.calls = []

    def __call__(self, argv):
        service, operation = argv[1], argv[2]
        client = boto3.client(service, region_name=REGION)
        model = client.meta.service_model
        names = {xform_name(name, "-"): name for name in model.operation_names}
        assert operation in names, f"aws {service} has no operation {operation}"
        shape = model.operation_model(names[operation]).input_shape
        members = {xform_name(name, "-"): name for name in shape.members}
        params, i = {}, 3
        while i < len(argv):
            option = argv[i][2:]
            if option in ("region", "output"):
                assert argv[i + 1]
                i += 2
                continue
            negated = option.startswith("no-") and option[3:] in members
            key = option[3:] if negated else option
            assert key in members, f"aws {service} {operation} has no option --{option}"
            member = shape.members[members[key]]
            if member.type_name == "boolean":
                params[members[key]] = not negated
                i += 1
                continue
            raw = argv[i + 1]
            if member.type_name in ("list", "structure"):
                params[members[key]] = json.loads(raw) if raw.lstrip().startswith(("[", "{")) else [raw]
            elif member.type_name in ("integer", "long"):
                params[members[key]] = int(raw)
            else:
                params[members[key]] = raw
            i += 2
        self.calls.append((service, operation, params))
        try:
            response = getattr(client, xform_name(names[operation]))(**params)  # ParamValidationError: a bug
        except ClientError as e:
            error = e.response["Error"]
            return 254, "", f"An error occurred ({error['Code']}) when calling the {names[operation]} operation: " \
                            f"{error['Message']}"
        response.pop("ResponseMetadata", None)
        return 0, json.dumps(response, default=str)


class Journal:
    """journalctl -k: the kernel's lines so far, and cursors into them (`i=<lines read>`)."""

    def __init__(self, text):
        self.lines = text.splitlines()

    def append(self, *lines):
        self.lines.extend(lines)

    def __call__(self, argv):
        assert argv[1:6] == ["-k", "--no-pager", "-o", "short-iso", "--show-cursor"], argv
        after = [a for a in argv if a.startswith("--after-cursor=")]
        start = int(after[0].rsplit("i=", 1)[1]) if after else 0
        if not after:
            assert argv[-2:] == ["-b", "0"]
        new = self.lines[start:]
        if not new:
            return 0, "-- No entries --\n"
        return 0, "".join(line + "\n" for line in new) + f"-- cursor: s=0b1c2d3e;i={len(self.lines)}\n"


@pytest.fixture
def cloud():
    """moto's AWS with the node's group (one instance), log group; yields the instance id."""
    with mock_aws():
        ec2 = boto3.client("ec2", region_name=REGION)
        image = "ami-12c6146b"  # any id: moto does not validate AMIs, and its default images may not be loaded
        subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
        ec2.create_launch_template(LaunchTemplateName="node-template",
                                   LaunchTemplateData={"ImageId": image, "InstanceType": "p5.48xlarge"})
        autoscaling = boto3.client("autoscaling", region_name=REGION)
        autoscaling.create_auto_scaling_group(
            AutoScalingGroupName=GROUP, LaunchTemplate={"LaunchTemplateName": "node-template"}, MinSize=1,
            MaxSize=1, DesiredCapacity=1, VPCZoneIdentifier=subnet)
        instance_id = autoscaling.describe_auto_scaling_groups()["AutoScalingGroups"][0]["Instances"][0]["InstanceId"]
        boto3.client("logs", region_name=REGION).create_log_group(logGroupName=LOG_GROUP)
        yield instance_id


class Imds:
    def __init__(self, instance_id):
        self.instance_id = instance_id

    def identity(self):
        return InstanceIdentity(self.instance_id, REGION)


@pytest.fixture
def monitored(fake_node, kit, cloud):
    """The fake node with a journal that grows, aws on moto, and `round()` to run one monitor round."""
    node = fake_node
    node.journal = Journal(kit.fixture_text("journal-kernel-clean.txt"))
    node.aws_calls = AwsOnMoto()
    node.runner.on("journalctl", node.journal)
    node.runner.on("aws", node.aws_calls)
    node.runner.on("kill", lambda argv: (os.kill(int(argv[-1]), getattr(signal, "SIG" + argv[2])), (0, ""))[1])

    def round_(*extra):
        node.runner.calls.clear()
        node.aws_calls.calls.clear()

        def make_runner(dry_run):
            node.runner.dry_run = dry_run
            return node.runner
        return main(["monitor", "--once", "--root", str(node.root), *extra], make_runner=make_runner,
                    imds=Imds(cloud))
    node.round = round_
    node.instance_id = cloud
    return node


def instance_tags(instance_id):
    tags = boto3.client("ec2", region_name=REGION).describe_tags(
        Filters=[{"Name": "resource-id", "Values": [instance_id]}])["Tags"]
    return {t["Key"]: t["Value"] for t in tags if t["Key"].startswith("cluster:")}


def group_health(instance_id):
    found = boto3.client("autoscaling", region_name=REGION).describe_auto_scaling_instances(
        InstanceIds=[instance_id])["AutoScalingInstances"]
    return found[0]["HealthStatus"]


def health_log_events(instance_id):
    logs = boto3.client("logs", region_name=REGION)
    streams = [s["logStreamName"] for s in logs.describe_log_streams(logGroupName=LOG_GROUP)["logStreams"]]
    if f"{instance_id}/health" not in streams:
        return []
    events = logs.get_log_events(logGroupName=LOG_GROUP, logStreamName=f"{instance_id}/health")["events"]
    return [json.loads(e["message"]) for e in events]


def published(node, name):
    """The values of metric `name` the last round published (from the validated PutMetricData request)."""
    values = []
    for service, operation, params in node.aws_calls.calls:
        if (service, operation) == ("cloudwatch", "put-metric-data"):
            assert params["Namespace"] == "TrainingCluster"
            for datum in params["MetricData"]:
                assert datum["Dimensions"] == [{"Name": "AutoScalingGroupName", "Value": GROUP}]
                if datum["MetricName"] == name:
                    values.append(datum["Value"])
    return values


def start_job_stand_in(node, job_id="j-20250311-120000-abcd", launcher="direct"):
    """A real process in the place of the job's supervisor: its command line names the job (as the real
    supervisor's does) and it records the signal it gets."""
    marker = node.root / "sigterm-received"
    script = ("import signal, sys, time\n"
              "def on_term(signum, frame):\n"
              f"    open({str(marker)!r}, 'w').write('SIGTERM')\n"
              "    sys.exit(0)\n"
              "signal.signal(signal.SIGTERM, on_term)\n"
              "print('ready', flush=True)\n"
              "time.sleep(120)\n")
    proc = subprocess.Popen([sys.executable, "-c", script, "--job-id", job_id], stdout=subprocess.PIPE, text=True)
    assert proc.stdout.readline().strip() == "ready"
    job_dir = node.root / "var/lib/cluster/jobs" / job_id
    job_dir.mkdir(parents=True)
    (job_dir / "status.json").write_text(json.dumps({
        "jobId": job_id, "state": "running", "supervisorPid": proc.pid, "launcher": launcher,
        "unit": f"training-job-{job_id}"}))
    return proc, marker, job_dir


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


def test_an_application_xid_is_a_warning_only(monitored, kit):
    node = monitored
    assert node.round() == 0
    node.journal.append(*kit.fixture_text("journal-kernel-app-xid.txt").splitlines()[1:])  # the Xid 31
    assert node.round() == 0
    assert published(node, "NodeHealthWarnings") == [1] and published(node, "NodeUnhealthy") == [0]
    assert instance_tags(node.instance_id) == {} and group_health(node.instance_id) == "Healthy"
    assert [c for c in node.runner.commands(mutating=True) if "put-metric-data" not in c] == []
    log = (node.root / "var/log/cluster/health-monitor.log").read_text()
    assert "WARNING monitor: WARN xid: new, not acted on: Xid 31 on 0000:75:00: GPU memory page fault" in log


def test_an_efa_device_that_disappears_makes_the_node_unhealthy(monitored):
    node = monitored
    assert node.round() == 0
    node.fi_info_txt = "fi_info-efa-rdm.31-devices.txt"
    assert node.round() == 1
    assert instance_tags(node.instance_id)["cluster:health-reason"] == (
        "health monitor: efa: 31 EFA devices, expected 32")
    assert group_health(node.instance_id) == "Unhealthy"


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


def run_json(node):
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        node.round("--json")
    return out.getvalue()


def test_after_a_reboot_the_new_boot_is_read_from_its_start(monitored, kit):
    node = monitored
    assert node.round() == 0
    node.write("/proc/sys/kernel/random/boot_id", "7d7e8f90-aaaa-4bbb-8ccc-0123456789ab\n")
    node.runner.handlers["journalctl"] = Journal(kit.fixture_text("journal-kernel-app-xid.txt"))
    assert node.round() == 0
    assert any(c.endswith(" -b 0") for c in node.runner.commands() if c.startswith("journalctl"))
    assert published(node, "NodeHealthWarnings") == [1]


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
    node.runner.on("systemctl", lambda argv: (stopped.append(argv[1:]), os.kill(proc.pid, signal.SIGTERM), (0, ""))[2])
    try:
        node.journal.append(XID_79)
        assert node.round() == 1
        assert proc.wait(timeout=10) == 0
    finally:
        proc.kill()
        proc.wait()
    assert stopped == [["kill", "--kill-whom=main", "--signal=SIGTERM", "training-job-j-20250311-120000-abcd.service"]]


@pytest.mark.parametrize("setup, status, detail", [
    (dict(throttle_csv="nvidia-smi-query-throttle.thermal.csv"), "warn",
     "GPU 2 (00000000:75:00.0): HW thermal slowdown; GPU 6 (00000000:B9:00.0): HW slowdown, HW thermal slowdown"),
    (dict(nvlink_txt="nvidia-smi-nvlink-status.link-down.txt"), "fail", "GPU 5: link 7, 8 inactive"),
    (dict(nvlink_txt="nvidia-smi-nvlink-status.degraded.txt"), "warn",
     "GPU 3 link 4 at 1.562 GB/s (others 26.562)"),
    (dict(gpu_csv="nvidia-smi-query-gpu.ecc-error.csv"), "fail",
     "GPU 3 (00000000:86:00.0): 2 uncorrectable ECC errors"),
    (dict(remap_csv="nvidia-smi-query-remapped-rows.pending.csv"), "fail",
     "row remap pending (needs a GPU reset) on 00000000:A8:00.0"),
])
def test_throttling_nvlink_ecc_and_row_remaps(monitored, setup, status, detail):
    node = monitored
    for key, value in setup.items():
        setattr(node, key, value)
    report = json.loads(run_json(node))
    found = [c for c in report["checks"] if c["status"] != "ok"]
    assert [(c["status"], c["detail"]) for c in found] == [(status, detail)]
    assert report["healthy"] is (status == "warn")


def test_healthy_p5_report_names_every_check(monitored):
    report = json.loads(run_json(monitored))
    assert {c["name"]: c["status"] for c in report["checks"]} == {
        "gpu-count": "ok", "gpu-memory": "ok", "gpu-ecc": "ok", "gpu-row-remap": "ok", "xid": "ok", "efa": "ok",
        "gpu-throttle": "ok", "nvlink": "ok"}
    nvlink = {c["name"]: c["detail"] for c in report["checks"]}["nvlink"]
    assert nvlink == "144 links active on 8 GPUs at 26.562 GB/s"


def test_tools_that_do_not_report_throttling_or_nvlink_are_not_a_warning(monitored):
    node = monitored
    original = node.runner.handlers["nvidia-smi"]

    def old_driver(argv):
        if "clocks_event_reasons" in argv[1] or argv[1] == "nvlink":
            return 2, "", 'Field "clocks_event_reasons.hw_slowdown" is not a valid field to query.'
        return original(argv)
    node.runner.on("nvidia-smi", old_driver)
    report = json.loads(run_json(node))
    details = {c["name"]: (c["status"], c["detail"]) for c in report["checks"]}
    assert details["gpu-throttle"][0] == "ok" and details["gpu-throttle"][1].startswith("not reported")
    assert details["nvlink"][0] == "ok" and details["nvlink"][1].startswith("not reported")


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



def test_a_hanging_nvidia_smi_is_fatal_and_not_asked_again(monitored):
    node = monitored
    calls = []

    def hanging(argv):
        calls.append(argv)
        return 124, "", "timed out after 120 s; still not gone 5 s after SIGKILL (stuck in the kernel?)"
    node.runner.on("nvidia-smi", hanging)
    assert node.round() == 1
    assert len(calls) == 1  # the GPU query; not the throttle and NVLink queries after it
    assert instance_tags(node.instance_id)["cluster:health-reason"].startswith("health monitor: gpu-count: ")
    assert group_health(node.instance_id) == "Unhealthy"


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
