"""JobKeeper in a bare Stack: the job table, the keeper function, its rules and its role's exact permissions.

The handler module (job_keeper/handler.py) is not imported here: the template names it, the code asset is
staged by cluster_constructs/bundle.py (tests/cluster_constructs/test_bundle.py checks what the asset holds).
"""

import dataclasses
import json

import aws_cdk as cdk
import pytest
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from aws_cdk.assertions import Template
from keeper_calls import aws_calls

from cluster_constructs.bundle import stage_keeper_code
from cluster_constructs.job_keeper import JobKeeper
from cluster_spec.settings import CapacityMode
from job_keeper.keeper import Clients

GROUP = "TrainingClusterStack-nodes"
DOCUMENT = "TrainingClusterStack-JobsDocument-AbC123"
RESERVATION = "cr-0123456789abcdef0"
ACCOUNT_REGION = "us-east-1:111122223333"


class Built:
    """One JobKeeper in its own stack, and the template's resources by type."""

    def __init__(self, staging, *, mode: CapacityMode, encrypted_topic: bool = True) -> None:
        app = cdk.App(outdir=str(staging / "cdk.out"))
        env = cdk.Environment(account="111122223333", region="us-east-1")
        self.stack = cdk.Stack(app, "TrainingClusterStack", env=env)
        key = kms.Key(self.stack, "TopicKey") if encrypted_topic else None
        self.topic = sns.Topic(self.stack, "AlarmTopic", master_key=key)
        self.keeper = JobKeeper(
            self.stack,
            "JobKeeper",
            code=lambda_.Code.from_asset(str(stage_keeper_code(staging / "keeper"))),
            auto_scaling_group_name=GROUP,
            job_document_name=DOCUMENT,
            alarm_topic=self.topic,
            instance_type="p5.48xlarge",
            capacity_mode=mode,
            capacity_reservation_id=RESERVATION if mode is not CapacityMode.ON_DEMAND else None,
            log_retention=logs.RetentionDays.ONE_MONTH,
        )
        self.template = Template.from_stack(self.stack)
        self.json = self.template.to_json()

    def logical_id(self, construct) -> str:
        return self.stack.get_logical_id(construct.node.default_child)

    def of_type(self, resource_type: str) -> dict[str, dict]:
        return {k: v for k, v in self.json["Resources"].items() if v["Type"] == resource_type}

    def only(self, resource_type: str) -> dict:
        (resource,) = self.of_type(resource_type).values()
        return resource

    def statements(self) -> dict[str, dict]:
        (policy,) = [
            r["Properties"] for r in self.of_type("AWS::IAM::Policy").values()
            if r["Properties"]["Roles"] == [{"Ref": self.logical_id(self.keeper.role)}]
        ]
        found = policy["PolicyDocument"]["Statement"]
        assert len({s["Sid"] for s in found}) == len(found)  # every statement named, none merged away
        return {s["Sid"]: s for s in found}


@pytest.fixture(scope="module")
def on_demand(tmp_path_factory):
    return Built(tmp_path_factory.mktemp("keeper-on-demand"), mode=CapacityMode.ON_DEMAND)


@pytest.fixture(scope="module")
def capacity_block(tmp_path_factory):
    return Built(tmp_path_factory.mktemp("keeper-block"), mode=CapacityMode.CAPACITY_BLOCK,
                 encrypted_topic=False)


def test_the_table_has_one_string_key_on_demand_billing_encryption_and_recovery(on_demand):
    table = on_demand.only("AWS::DynamoDB::Table")
    assert table["Properties"] == {
        "KeySchema": [{"AttributeName": "pk", "KeyType": "HASH"}],
        "AttributeDefinitions": [{"AttributeName": "pk", "AttributeType": "S"}],
        "BillingMode": "PAY_PER_REQUEST",
        "SSESpecification": {"SSEEnabled": True},  # the AWS managed key (aws/dynamodb), no key of ours
        "PointInTimeRecoverySpecification": {"PointInTimeRecoveryEnabled": True},
    }  # no TableName: CloudFormation names it, so a retained table never blocks a redeploy
    # retained on `cdk destroy` and on replacement, like the job logs, the buckets and the file system
    assert (table["DeletionPolicy"], table["UpdateReplacePolicy"]) == ("Retain", "Retain")


def test_the_function_runs_the_keeper_handler_one_at_a_time(on_demand):
    function = on_demand.only("AWS::Lambda::Function")["Properties"]
    assert (function["Runtime"], function["Handler"]) == ("python3.13", "job_keeper.handler.handler")
    assert (function["Timeout"], function["MemorySize"], function["ReservedConcurrentExecutions"]) == (
        600, 512, 1)
    assert function["Role"] == {"Fn::GetAtt": [on_demand.logical_id(on_demand.keeper.role), "Arn"]}
    assert "VpcConfig" not in function  # it calls AWS APIs only
    assert function["Code"]["S3Key"].endswith(".zip")  # the staged asset, not inline code
    (log_group_id,) = on_demand.of_type("AWS::Logs::LogGroup")
    assert function["LoggingConfig"] == {"LogGroup": {"Ref": log_group_id}}
    invoke = on_demand.only("AWS::Lambda::EventInvokeConfig")["Properties"]
    # a failed reconcile is redone by the next tick, not retried; queued events live 15 minutes at most
    assert (invoke["MaximumRetryAttempts"], invoke["MaximumEventAgeInSeconds"]) == (0, 900)


def test_the_function_gets_the_clusters_names_in_its_environment(on_demand, capacity_block):
    table_id = on_demand.logical_id(on_demand.keeper.table)
    assert on_demand.only("AWS::Lambda::Function")["Properties"]["Environment"]["Variables"] == {
        "JOB_TABLE_NAME": {"Ref": table_id},
        "JOB_DOCUMENT_NAME": DOCUMENT,
        "AUTO_SCALING_GROUP_NAME": GROUP,
        "ALARM_TOPIC_ARN": {"Ref": on_demand.logical_id(on_demand.topic)},
        "STACK_NAME": "TrainingClusterStack",
        "INSTANCE_TYPE": "p5.48xlarge",
        "CAPACITY_MODE": "on-demand",
        "CAPACITY_RESERVATION_ID": "",  # none in this mode
    }
    block = capacity_block.only("AWS::Lambda::Function")["Properties"]["Environment"]["Variables"]
    assert (block["CAPACITY_MODE"], block["CAPACITY_RESERVATION_ID"]) == ("capacity-block", RESERVATION)


def test_the_log_group_keeps_the_stacks_retention_and_is_retained(on_demand):
    group = on_demand.only("AWS::Logs::LogGroup")
    assert group["Properties"] == {"RetentionInDays": 30}  # no fixed name: retained, it must not collide
    assert group["DeletionPolicy"] == "Retain"


def rules(built) -> dict[str, dict]:
    """The rules by construct id, as the template has them."""
    return {name: built.json["Resources"][built.logical_id(rule)]["Properties"]
            for name, rule in built.keeper.rules.items()}


def test_a_schedule_and_the_groups_launch_and_terminate_events_run_the_keeper(on_demand):
    found = rules(on_demand)
    assert set(found) == {"Schedule", "GroupEvents"}  # no Capacity Block rule on demand
    assert len(on_demand.of_type("AWS::Events::Rule")) == 2
    assert found["Schedule"]["ScheduleExpression"] == "rate(1 minute)"
    assert found["GroupEvents"]["EventPattern"] == {
        "source": ["aws.autoscaling"],
        "detail-type": ["EC2 Instance Launch Successful", "EC2 Instance Terminate Successful",
                        "EC2 Instance Launch Unsuccessful"],
        "detail": {"AutoScalingGroupName": [GROUP]},
    }
    function_arn = {"Fn::GetAtt": [on_demand.logical_id(on_demand.keeper.function), "Arn"]}
    for rule in found.values():
        (target,) = rule["Targets"]
        assert target["Arn"] == function_arn and "Input" not in target  # the event itself reaches the keeper
    # a tick is stale once the next is due; a node event only speeds up what the schedule does anyway
    assert found["Schedule"]["Targets"][0]["RetryPolicy"] == {
        "MaximumRetryAttempts": 2, "MaximumEventAgeInSeconds": 60}
    assert found["GroupEvents"]["Targets"][0]["RetryPolicy"] == {
        "MaximumRetryAttempts": 4, "MaximumEventAgeInSeconds": 300}


def test_each_rule_may_invoke_the_function_and_nothing_else_may(on_demand, capacity_block):
    for built in (on_demand, capacity_block):
        permissions = [p["Properties"] for p in built.of_type("AWS::Lambda::Permission").values()]
        rule_arns = sorted(json.dumps({"Fn::GetAtt": [built.logical_id(r), "Arn"]})
                           for r in built.keeper.rules.values())
        assert sorted(json.dumps(p["SourceArn"]) for p in permissions) == rule_arns
        assert {(p["Principal"], p["Action"]) for p in permissions} == {
            ("events.amazonaws.com", "lambda:InvokeFunction")}


def test_a_capacity_block_cluster_also_hears_the_blocks_expiration_warning(capacity_block):
    found = rules(capacity_block)
    assert set(found) == {"Schedule", "GroupEvents", "CapacityBlockEvents"}
    warning = found["CapacityBlockEvents"]
    assert warning["EventPattern"] == {
        "source": ["aws.ec2"],
        # both spellings of the EC2 User Guide's examples
        "detail-type": ["Capacity Block Expiration Warning", "Capacity Block Reservation Expiration Warning"],
    }
    # the instances begin to terminate 10 minutes after the warning: it is worth retrying until then
    assert warning["Targets"][0]["RetryPolicy"] == {"MaximumRetryAttempts": 10, "MaximumEventAgeInSeconds": 600}


def arn(suffix: str) -> dict:
    return {"Fn::Join": ["", ["arn:", {"Ref": "AWS::Partition"}, f":{suffix}"]]}


def test_the_role_may_do_exactly_what_the_keeper_needs(on_demand):
    statements = on_demand.statements()
    keeper = on_demand.keeper
    actions = {sid: sorted([s["Action"]] if isinstance(s["Action"], str) else s["Action"])
               for sid, s in statements.items()}
    assert actions == {
        "JobRecords": ["dynamodb:DeleteItem", "dynamodb:GetItem", "dynamodb:PutItem"],
        "SendJobDocument": ["ssm:SendCommand"],
        "SendToClusterNodes": ["ssm:SendCommand"],
        "ReadCommandResults": ["ssm:GetCommandInvocation"],
        "DescribeCluster": ["autoscaling:DescribeAutoScalingGroups", "ec2:DescribeCapacityReservations",
                            "ec2:DescribeInstances"],
        "PublishAlarm": ["sns:Publish"],
        "WriteLogs": ["logs:CreateLogStream", "logs:PutLogEvents"],
        "UseAlarmTopicKey": ["kms:Decrypt", "kms:GenerateDataKey"],
    }
    assert not [a for names in actions.values() for a in names if "*" in a]  # every action named
    assert {s["Effect"] for s in statements.values()} == {"Allow"}
    resources = {sid: s["Resource"] for sid, s in statements.items()}
    assert resources == {
        "JobRecords": {"Fn::GetAtt": [on_demand.logical_id(keeper.table), "Arn"]},  # this table only
        "SendJobDocument": arn(f"ssm:{ACCOUNT_REGION}:document/{DOCUMENT}"),
        "SendToClusterNodes": arn(f"ec2:{ACCOUNT_REGION}:instance/*"),
        "ReadCommandResults": "*",  # no resource-level permissions for these reads
        "DescribeCluster": "*",
        "PublishAlarm": {"Ref": on_demand.logical_id(on_demand.topic)},
        "WriteLogs": {"Fn::GetAtt": [on_demand.logical_id(keeper.log_group), "Arn"]},
        "UseAlarmTopicKey": {"Fn::GetAtt": [on_demand.logical_id(on_demand.topic.master_key), "Arn"]},
    }
    # SendCommand reaches only instances the cluster's group tagged; no other statement has a condition
    conditions = {sid: s["Condition"] for sid, s in statements.items() if "Condition" in s}
    assert conditions == {
        "SendToClusterNodes": {"StringEquals": {"ssm:resourceTag/aws:autoscaling:groupName": GROUP}}}


def test_the_role_is_the_functions_alone_with_no_managed_policy(on_demand):
    role = on_demand.json["Resources"][on_demand.logical_id(on_demand.keeper.role)]["Properties"]
    assert role["AssumeRolePolicyDocument"]["Statement"] == [
        {"Action": "sts:AssumeRole", "Effect": "Allow", "Principal": {"Service": "lambda.amazonaws.com"}}]
    assert "ManagedPolicyArns" not in role  # not even AWSLambdaBasicExecutionRole (logs on any group)
    assert len(on_demand.of_type("AWS::IAM::Policy")) == 1


def test_an_unencrypted_topic_needs_no_key_permission(capacity_block):
    statements = capacity_block.statements()
    assert "UseAlarmTopicKey" not in statements
    assert not [s for s in statements.values() if "kms:" in json.dumps(s["Action"])]


# What the role grants that no line of job_keeper/ calls: the Lambda runtime writes the function's log, and SNS
# uses the alarm topic's key with the publisher's permissions when the keeper publishes.
AROUND_THE_CODE = {"WriteLogs": {"logs:CreateLogStream", "logs:PutLogEvents"},
                   "UseAlarmTopicKey": {"kms:GenerateDataKey", "kms:Decrypt"}}


def test_the_role_grants_exactly_the_calls_the_keepers_code_makes(on_demand):
    """Read from job_keeper/ and what it uses of cluster_jobs/ and cluster_aws/ (the keeper's Lambda asset; its
    other packages, node_bootstrap, training and instance_catalog, make no AWS call): a new call without its
    grant fails here, and so does a grant no call needs."""
    services = [f.name for f in dataclasses.fields(Clients)]  # the clients job_keeper.handler makes
    calls = aws_calls(packages=("job_keeper", "cluster_jobs", "cluster_aws"), entry="job_keeper", services=services)
    statements = on_demand.statements()
    granted = {a for sid, s in statements.items() if sid not in AROUND_THE_CODE
               for a in ([s["Action"]] if isinstance(s["Action"], str) else s["Action"])}
    missing = {action: sorted(sites) for action, sites in calls.items() if action not in granted}
    assert missing == {}, "called without a grant"
    assert sorted(granted - set(calls)) == [], "granted, never called"
    assert {sid: set(statements[sid]["Action"]) for sid in AROUND_THE_CODE} == AROUND_THE_CODE


def test_the_keepers_other_packages_make_no_aws_call():
    """Why the call reader need not look into node_bootstrap, training and instance_catalog: none imports an AWS
    SDK."""
    from cdk_support import REPO_ROOT

    from cluster_constructs.bundle import KEEPER_CODE

    others = sorted(set(KEEPER_CODE.packages) - {"job_keeper", "cluster_jobs", "cluster_aws"})
    assert others == ["instance_catalog", "node_bootstrap", "training"]
    mentions = [str(path.relative_to(REPO_ROOT)) for package in others for path in (REPO_ROOT / package).rglob("*.py")
                if "boto3" in path.read_text() or "botocore" in path.read_text()]
    assert mentions == []
