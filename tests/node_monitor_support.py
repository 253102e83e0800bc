"""The node health monitor end to end, for tests/node_bootstrap/test_monitor_*.py: `python3 -m node_bootstrap
monitor --once` on a fake P5 (recorded nvidia-smi, fi_info and kernel-log output through the runner seam), a
kernel journal that grows between rounds, a real process standing in for the job's supervisor, and every `aws`
command the monitor runs parsed against botocore's service model and executed on moto: the requests are the
real API's, and the instance's tags, its Auto Scaling health, the log event and the metrics are read back from
there. The `cloud` and `monitored` fixtures are in tests/node_bootstrap/conftest.py."""

from __future__ import annotations

import json
import subprocess
import sys

import boto3
from botocore import xform_name
from botocore.exceptions import ClientError

from node_bootstrap.imds import InstanceIdentity

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


class Imds:
    def __init__(self, instance_id):
        self.instance_id = instance_id

    def identity(self):
        return InstanceIdentity(self.instance_id, REGION)


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


def run_json(node):
    import contextlib
    import io
    out = io.StringIO()
    with contextlib.redirect_stdout(out):
        node.round("--json")
    return out.getvalue()
