"""A job keeper round on moto (DynamoDB, EC2, Auto Scaling) with the nodes' answers from a fake SSM client: what
a node prints reaches the keeper exactly as node_bootstrap.jobs' stdout would, through GetCommandInvocation."""

from __future__ import annotations

import datetime
import json

import boto3

from cluster_jobs.table import Attempt, JobRecord, JobTable
from job_keeper.keeper import Clients, Keeper, KeeperSettings

REGION = "us-east-1"
TABLE = "TrainingClusterStack-JobTable-Q1w2E3"
GROUP = "TrainingClusterStack-nodes"
DOCUMENT = "TrainingClusterStack-JobsDocument-AbC123"
JOB = "j-20261120-231502-ab12"
NOW = datetime.datetime(2026, 11, 20, 23, 30, 0, tzinfo=datetime.UTC)


class FakeSsm:
    """SendCommand and GetCommandInvocation: every node answers `stdout[instance id]` at once."""

    def __init__(self) -> None:
        self.stdout: dict[str, str] = {}
        self.sent: list[dict] = []

    def send_command(self, **request):
        self.sent.append(request)
        return {"Command": {"CommandId": f"c-{len(self.sent)}"}}

    def get_command_invocation(self, CommandId, InstanceId):  # noqa: N803 - boto3's parameter names
        return {"Status": "Success", "ResponseCode": 0, "StandardOutputContent": self.stdout[InstanceId],
                "StandardErrorContent": ""}


def deploy(nodes: int = 2) -> list[str]:
    """The job table and a group of ready nodes; their instance ids, ordered by private IP."""
    boto3.client("dynamodb", region_name=REGION).create_table(
        TableName=TABLE, KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
        AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}], BillingMode="PAY_PER_REQUEST")
    ec2 = boto3.client("ec2", region_name=REGION)
    vpc = ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
    subnet = ec2.create_subnet(VpcId=vpc, CidrBlock="10.42.1.0/24", AvailabilityZone="us-east-1a")["Subnet"]
    ec2.create_launch_template(LaunchTemplateName="nodes",
                               LaunchTemplateData={"ImageId": "ami-12c6146b", "InstanceType": "p5.48xlarge"})
    autoscaling = boto3.client("autoscaling", region_name=REGION)
    autoscaling.create_auto_scaling_group(
        AutoScalingGroupName=GROUP, LaunchTemplate={"LaunchTemplateName": "nodes"}, MinSize=nodes, MaxSize=nodes,
        DesiredCapacity=nodes, VPCZoneIdentifier=subnet["SubnetId"])
    group = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"][0]
    ids = [i["InstanceId"] for i in group["Instances"]]
    ec2.create_tags(Resources=ids, Tags=[{"Key": "cluster:bootstrap", "Value": "ready"}])
    described = ec2.describe_instances(InstanceIds=ids)["Reservations"]
    ips = {i["InstanceId"]: i["PrivateIpAddress"] for r in described for i in r["Instances"]}
    return sorted(ids, key=lambda i: tuple(int(x) for x in ips[i].split(".")))


def table() -> JobTable:
    return JobTable(boto3.client("dynamodb", region_name=REGION), TABLE)


def keeper(ssm: FakeSsm) -> Keeper:
    settings = KeeperSettings(table_name=TABLE, document_name=DOCUMENT, group_name=GROUP,
                              alarm_topic_arn="arn:aws:sns:us-east-1:111122223333:alarms",
                              stack_name="TrainingClusterStack", instance_type="p5.48xlarge",
                              capacity_mode="on-demand")
    clients = Clients(dynamodb=boto3.client("dynamodb", region_name=REGION), ssm=ssm,
                      ec2=boto3.client("ec2", region_name=REGION),
                      autoscaling=boto3.client("autoscaling", region_name=REGION),
                      sns=boto3.client("sns", region_name=REGION))
    return Keeper(settings, clients, now=lambda: NOW, sleep=lambda _: None, clock=lambda: 0.0)


def submit(nodes: list[str], job_id: str = JOB) -> JobRecord:
    """A running job on `nodes`, holding the lock, written through the table's own operations."""
    record = JobRecord(
        job_id=job_id, module="training", config="training/configs/tiny-cpu.toml", config_text="", overrides=[],
        resume_from="", nodes=len(nodes), gpus_per_node=8, max_restarts=0, max_job_restarts=5,
        instance_type="p5.48xlarge", checkpoint_dir=f"/fsx/checkpoints/{job_id}", state="running",
        created_at="2026-11-20T23:15:02Z", updated_at="2026-11-20T23:15:02Z",
        attempts=[Attempt(1, list(nodes), "10.42.1.4", "2026-11-20T23:15:02Z")])
    return table().create(record)


def running(step: object = 10, **more: object) -> str:
    """node_bootstrap.jobs status's stdout for a running job, with `more` fields (any JSON value)."""
    return json.dumps({"jobId": JOB, "state": "running", "exitCode": None, "startedAt": "2026-11-20T23:15:05Z",
                       "lastStep": step, "module": "training", "attempt": 1, **more}) + "\n"


def raw_item(job_id: str = JOB) -> dict:
    return boto3.client("dynamodb", region_name=REGION).get_item(
        TableName=TABLE, Key={"pk": {"S": job_id}}, ConsistentRead=True)["Item"]


def put_raw(item: dict) -> None:
    boto3.client("dynamodb", region_name=REGION).put_item(TableName=TABLE, Item=item)
