"""Fixtures for clusterctl: fake credentials, a moto cluster (VPC, Auto Scaling group of p5 nodes, the stack
with its outputs, the jobs document, the log group), and a CLI runner that captures output."""

import dataclasses
import datetime
import io
import json
import sys
from dataclasses import dataclass, field

import boto3
import pytest
from botocore.stub import Stubber
from fake_aws import isolate_from_real_aws
from job_record_fakes import NOW
from moto import mock_aws

from cluster_aws.session import AwsContext
from cluster_jobs.table import JobTable
from clusterctl.cli import main
from clusterctl.runtime import Runtime

REGION = "us-east-1"
STACK = "TrainingClusterStack"
GROUP = "TrainingClusterStack-nodes"
DOCUMENT = "TrainingClusterStack-JobsDocument-AbC123"
LOG_GROUP = "/training-cluster/TrainingClusterStack"
JOB_TABLE = "TrainingClusterStack-JobTable-Q1w2E3"
MAX_JOB_RESTARTS = 5
IMAGE_ID = "ami-12c6146b"  # any id: moto does not validate AMIs by default


@pytest.fixture(autouse=True)
def aws_env(monkeypatch, tmp_path):
    """Fake credentials and no access to the developer's AWS config or the instance metadata service."""
    isolate_from_real_aws(monkeypatch, tmp_path, REGION)


@dataclass
class Result:
    code: int
    out: str
    err: str

    @property
    def lines(self):
        return self.out.splitlines()


@dataclass
class Cli:
    """Runs clusterctl in-process with a shared AwsContext (so stubbed clients can be put in it)."""

    context: AwsContext = field(default_factory=lambda: AwsContext(boto3.Session(region_name=REGION)))
    answers: list = field(default_factory=list)
    sleeps: list = field(default_factory=list)
    now: object = None

    def __call__(self, *argv) -> Result:
        out, err = io.StringIO(), io.StringIO()
        runtime = Runtime(
            out=out,
            err=err,
            confirm=self._confirm,
            sleep=self.sleeps.append,
            clock=self._clock,
            context=self.context,
        )
        if self.now is not None:
            runtime.now = lambda: self.now
        code = main(list(argv), runtime)
        return Result(code, out.getvalue(), err.getvalue())

    def _confirm(self, prompt):
        self.answers.append(prompt)
        return self.reply

    reply: str = "yes"

    def _clock(self):
        return float(len(self.sleeps)) * 2.0  # time advances only when the code sleeps


@pytest.fixture()
def cli():
    return Cli()


@pytest.fixture()
def at_now(cli):
    """The CLI with its clock stopped at NOW (job_record_fakes: the time of JOB's id)."""
    cli.now = NOW
    return cli


@pytest.fixture()
def ssm_stub(cli):
    """The CLI's SSM client replaced by a Stubber-wrapped one: every call must be expected, and every expected
    call made."""
    client = boto3.client("ssm", region_name=REGION)
    cli.context.clients["ssm"] = client
    with Stubber(client) as stubber:
        yield stubber
        stubber.assert_no_pending_responses()


@dataclass
class FakeCluster:
    instance_ids: list  # ordered by private IP
    private_ips: list

    def tag(self, index, **tags):
        boto3.client("ec2", region_name=REGION).create_tags(
            Resources=[self.instance_ids[index]], Tags=[{"Key": k, "Value": v} for k, v in tags.items()]
        )


MINIMAL_DOCUMENT = {
    "schemaVersion": "2.2",
    "description": "stand-in for the JobRunner document (its content is tested in tests/cluster_constructs)",
    "parameters": {"action": {"type": "String", "allowedValues": ["start", "status", "cancel"]}},
    "mainSteps": [{"action": "aws:runShellScript", "name": "run", "inputs": {"runCommand": ["true"]}}],
}


def create_job_table(name=JOB_TABLE):
    """The job table as cluster_constructs creates it: the string key `pk` only, on-demand billing."""
    boto3.client("dynamodb", region_name=REGION).create_table(
        TableName=name,
        KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
        BillingMode="PAY_PER_REQUEST",
    )
    return name


def job_table():
    return JobTable(boto3.client("dynamodb", region_name=REGION), JOB_TABLE)


def end_job(job_id, state="succeeded", reason=None):
    """What the keeper writes when a job's nodes all finished: the record's final state, the lock given back."""
    table = job_table()
    record = table.get(job_id)
    return table.save(dataclasses.replace(record, state=state, reason=reason, ended_at=record.updated_at),
                      datetime.datetime.now(datetime.UTC))


def deploy_fake_cluster(nodes=3, instance_type="p5.48xlarge", capacity_mode="on-demand", bootstrap="ready",
                        job_table=True, checkpoint_root="/fsx/checkpoints", extra_outputs=None,
                        fp8_backends="none,torchao"):
    """The stack and its nodes; job_table=False: a stack deployed before the job table (no JobTableName and
    MaxJobRestarts outputs, no table); checkpoint_root=None: one deployed before the CheckpointRoot output;
    fp8_backends=None: one deployed before the Fp8Backends output."""
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.42.1.0/24", AvailabilityZone="us-east-1a")["Subnet"]
    ec2.create_launch_template(
        LaunchTemplateName="nodes", LaunchTemplateData={"ImageId": IMAGE_ID, "InstanceType": instance_type}
    )
    autoscaling = boto3.client("autoscaling", region_name=REGION)
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=GROUP,
        LaunchTemplate={"LaunchTemplateName": "nodes"},
        MinSize=nodes,
        MaxSize=nodes,
        DesiredCapacity=nodes,
        VPCZoneIdentifier=subnet["SubnetId"],
    )
    members = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"][0]
    ids = [i["InstanceId"] for i in members["Instances"]]
    described = ec2.describe_instances(InstanceIds=ids)["Reservations"]
    ips = {i["InstanceId"]: i["PrivateIpAddress"] for r in described for i in r["Instances"]}
    ordered = sorted(ids, key=lambda i: tuple(int(x) for x in ips[i].split(".")))
    if bootstrap and ids:
        ec2.create_tags(Resources=ids, Tags=[{"Key": "cluster:bootstrap", "Value": bootstrap}])

    outputs = {
        "AutoScalingGroupName": GROUP,
        "LogGroupName": LOG_GROUP,
        "JobDocumentName": DOCUMENT,
        "InstanceType": instance_type,
        "NodeCount": str(nodes),
        "CapacityMode": capacity_mode,
        "DataBucketName": "training-data-bucket",
    }
    if checkpoint_root is not None:
        outputs["CheckpointRoot"] = checkpoint_root
    if fp8_backends is not None:
        outputs["Fp8Backends"] = fp8_backends
    if job_table:
        outputs["JobTableName"] = create_job_table()
        outputs["MaxJobRestarts"] = str(MAX_JOB_RESTARTS)
    outputs.update(extra_outputs or {})
    template = {
        "Resources": {"Logs": {"Type": "AWS::Logs::LogGroup", "Properties": {"LogGroupName": LOG_GROUP}}},
        "Outputs": {key: {"Value": value} for key, value in outputs.items()},
    }
    boto3.client("cloudformation", region_name=REGION).create_stack(
        StackName=STACK, TemplateBody=json.dumps(template)
    )
    boto3.client("ssm", region_name=REGION).create_document(
        Name=DOCUMENT, Content=json.dumps(MINIMAL_DOCUMENT), DocumentType="Command", DocumentFormat="JSON"
    )
    return FakeCluster(instance_ids=ordered, private_ips=[ips[i] for i in ordered])


@pytest.fixture()
def moto_aws():
    with mock_aws():
        yield


@pytest.fixture()
def cluster(moto_aws):
    return deploy_fake_cluster()


@pytest.fixture()
def fakes():
    """This module, for its names and helpers (a root conftest.py shadows `import conftest`)."""
    return sys.modules[__name__]


@pytest.fixture()
def sent(cli):
    """Every ssm:SendCommand request clusterctl makes, as sent (moto's ListCommands mixes in every instance
    when a command has no Targets, so the requests are captured before they leave the client)."""
    requests = []
    ssm = cli.context.client("ssm")
    ssm.meta.events.register(
        "provide-client-params.ssm.SendCommand", lambda params, **_: requests.append(dict(params))
    )
    return requests
