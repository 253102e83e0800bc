"""NodeGroup: the EFA launch template for each catalog instance type, the node role, the fixed-size group."""

import json

import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk.assertions import Match, Template
from cdk_support import bare_stack, build_settings, resources_of

from cluster_constructs.capacity import CapacityTarget
from cluster_constructs.compute import SSM_AGENT_ACTIONS, NodeGroup, efa_network_interfaces, root_device_name
from instance_catalog.instance_types import INSTANCE_TYPES

EXPECTED_EFA = {
    "p5.48xlarge": 32,
    "p5e.48xlarge": 32,
    "p5en.48xlarge": 16,
    "p4d.24xlarge": 4,
    "p4de.24xlarge": 4,
    "p6-b200.48xlarge": 8,
}


def _node_group(download: tuple[str, str] | None = None, job_table_arn: str | None = None, **overrides):
    settings = build_settings(**overrides)
    stack = bare_stack()
    vpc = ec2.Vpc(
        stack,
        "Vpc",
        availability_zones=["us-east-1a"],
        nat_gateways=0,
        subnet_configuration=[ec2.SubnetConfiguration(name="n", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)],
    )
    group = ec2.SecurityGroup(stack, "Efa", vpc=vpc, allow_all_outbound=False)
    capacity = CapacityTarget(
        stack,
        "Capacity",
        settings=settings.capacity,
        instance_type=settings.compute.instance_type.name,
        node_count=settings.compute.node_count,
        availability_zone=settings.network.availability_zone,
    )
    user_data = ec2.UserData.custom("#!/bin/bash\necho boot\n")
    nodes = NodeGroup(
        stack,
        "Nodes",
        settings=settings.compute,
        capacity=capacity,
        subnet=vpc.isolated_subnets[0],
        security_group=group,
        user_data=user_data,
        log_group_arn="arn:aws:logs:us-east-1:111122223333:log-group:/training-cluster/Test",
        group_name="Test-nodes",
        desired_capacity=settings.compute.node_count,
    )
    if download:
        nodes.allow_object_download(bucket_name=download[0], object_key=download[1])
    if job_table_arn:
        nodes.allow_job_table_read(table_arn=job_table_arn)
    return stack, nodes, Template.from_stack(stack)


@pytest.mark.parametrize("name", sorted(INSTANCE_TYPES))
def test_efa_layout_per_instance_type(name):
    interfaces = [vars_of(i) for i in efa_network_interfaces(INSTANCE_TYPES[name], "sg-1")]
    efa = [i for i in interfaces if i["interface_type"] == "efa-only"]
    assert len(efa) == EXPECTED_EFA[name]
    assert interfaces[0] == {
        "network_card_index": 0,
        "device_index": 0,
        "interface_type": "interface",
        "description": "primary ENA interface",
        "groups": ["sg-1"],
        "delete_on_termination": True,
    }
    assert (efa[0]["network_card_index"], efa[0]["device_index"]) == (0, 1)
    # every further card carries one EFA-only interface on device 0, cards in order, none skipped
    assert [(i["network_card_index"], i["device_index"]) for i in efa[1:]] == [
        (card, 0) for card in range(1, INSTANCE_TYPES[name].network_cards)
    ]
    assert all(i["groups"] == ["sg-1"] for i in interfaces)


def vars_of(prop) -> dict:
    return {k: v for k, v in prop._values.items()}


@pytest.fixture(scope="module")
def p5():
    return _node_group()


def test_launch_template_for_p5(p5):
    _, _, template = p5
    (lt,) = resources_of(template, "AWS::EC2::LaunchTemplate")
    data = lt["LaunchTemplateData"]
    assert data["InstanceType"] == "p5.48xlarge"
    assert len(data["NetworkInterfaces"]) == 33  # 1 ENA + 32 EFA-only
    assert "SecurityGroupIds" not in data and "SecurityGroups" not in data
    assert not any("SubnetId" in i or "AssociatePublicIpAddress" in i for i in data["NetworkInterfaces"])
    assert data["MetadataOptions"]["HttpTokens"] == "required"
    (root,) = data["BlockDeviceMappings"]
    assert root == {
        "DeviceName": "/dev/xvda",
        "Ebs": {
            "DeleteOnTermination": True,
            "Encrypted": True,
            "Iops": 6000,
            "Throughput": 500,
            "VolumeSize": 512,
            "VolumeType": "gp3",
        },
    }
    assert "InstanceMarketOptions" not in data and "CapacityReservationSpecification" not in data
    # the AMI comes from the SSM public parameter at deploy time, never an id baked into the template
    assert data["ImageId"]["Ref"].startswith("SsmParameterValueawsservicedeeplearningami")
    parameters = template.to_json()["Parameters"]
    (ami_parameter,) = [p for k, p in parameters.items() if k == data["ImageId"]["Ref"]]
    assert ami_parameter["Type"] == "AWS::SSM::Parameter::Value<AWS::EC2::Image::Id>"
    assert ami_parameter["Default"].startswith("/aws/service/deeplearning/ami/x86_64/")


def test_group_is_fixed_size_in_the_placement_group(p5):
    stack, nodes, template = p5
    template.has_resource_properties(
        "AWS::AutoScaling::AutoScalingGroup",
        {
            "AutoScalingGroupName": "Test-nodes",
            "MinSize": "2",
            "MaxSize": "2",
            "DesiredCapacity": "2",
            "PlacementGroup": {"Ref": Match.string_like_regexp("^CapacityPlacementGroup")},
            "CapacityReservationSpecification": Match.absent(),
            "VPCZoneIdentifier": [Match.any_value()],
        },
    )


def _statements(template) -> list[dict]:
    return [s for p in resources_of(template, "AWS::IAM::Policy") for s in p["PolicyDocument"]["Statement"]]


def _actions(statement) -> list[str]:
    return statement["Action"] if isinstance(statement["Action"], list) else [statement["Action"]]


def test_node_role_permissions_are_scoped(p5):
    _, _, template = p5
    (role,) = [r["Properties"] for k, r in template.find_resources("AWS::IAM::Role").items() if k.startswith("Nodes")]
    # no AmazonSSMManagedInstanceCore: its ssm:GetParameter(s) on * would read every parameter of the account
    assert "ManagedPolicyArns" not in role
    by_action = {
        json.dumps(sorted(s["Action"]) if isinstance(s["Action"], list) else s["Action"]): s
        for s in _statements(template)
    }
    assert {a.split(":")[0] for a in SSM_AGENT_ACTIONS} == {"ssm", "ssmmessages", "ec2messages"}
    assert [a for a in SSM_AGENT_ACTIONS if a.startswith("ssm:")] == ["ssm:UpdateInstanceInformation"]
    tags = by_action[json.dumps(["ec2:CreateTags", "ec2:DeleteTags"])]
    assert tags["Condition"] == {
        "StringEquals": {"aws:ResourceTag/aws:autoscaling:groupName": "Test-nodes"},
        "ForAllValues:StringEquals": {"aws:TagKeys": ["cluster:bootstrap", "cluster:bootstrap-reason"]},
        "Null": {"aws:TagKeys": "false"},  # no DeleteTags without keys (that deletes every tag)
    }
    # The health monitor: its own instance's health tags, create only (compute.HEALTH_TAG_KEYS).
    monitor_tags = by_action[json.dumps("ec2:CreateTags")]
    assert monitor_tags["Condition"] == {
        "StringEquals": {"aws:ResourceTag/aws:autoscaling:groupName": "Test-nodes"},
        "ForAllValues:StringEquals": {"aws:TagKeys": ["cluster:health", "cluster:health-reason"]},
        "Null": {"aws:TagKeys": "false"},
    }
    assert monitor_tags["Resource"] == tags["Resource"]
    # minimizePolicies merges the statements on the group ARN without conditions into one.
    health = by_action[json.dumps(["autoscaling:SetInstanceHealth", "autoscaling:SuspendProcesses"])]
    # {"Fn::Join": ["", ["arn:aws:autoscaling:us-east-1:", {"Ref": "AWS::AccountId"}, ":autoScalingGroup:..."]]}
    # the real ARN form (a colon after autoScalingGroup): a slash there matches no group, and the grant nothing
    assert health["Resource"]["Fn::Join"][1][-1] == ":autoScalingGroup:*:autoScalingGroupName/Test-nodes"
    metrics = by_action[json.dumps("cloudwatch:PutMetricData")]
    assert metrics["Condition"] == {"StringEquals": {"cloudwatch:namespace": ["CWAgent", "TrainingCluster"]}}
    logs = by_action[json.dumps(["logs:CreateLogStream", "logs:DescribeLogStreams", "logs:PutLogEvents"])]
    assert logs["Resource"] == [
        "arn:aws:logs:us-east-1:111122223333:log-group:/training-cluster/Test",
        "arn:aws:logs:us-east-1:111122223333:log-group:/training-cluster/Test:log-stream:*",
    ]
    wildcard = [s for s in _statements(template) if s["Resource"] == "*"]
    # minimizePolicies merges statements with the same resource: compare the actions granted on "*"
    granted = {(a, json.dumps(s.get("Condition"))) for s in wildcard for a in _actions(s)}
    metrics_condition = json.dumps({"StringEquals": {"cloudwatch:namespace": ["CWAgent", "TrainingCluster"]}})
    assert granted == {
        *((a, "null") for a in [*SSM_AGENT_ACTIONS, "ec2:DescribeTags", "autoscaling:DescribeTags"]),
        ("cloudwatch:PutMetricData", metrics_condition),
    }
    # Protected mode: its own group's tags (these keys only) and its ReplaceUnhealthy process.
    group_tags = by_action[json.dumps(["autoscaling:CreateOrUpdateTags", "autoscaling:DeleteTags"])]
    assert group_tags["Resource"] == health["Resource"]
    assert group_tags["Condition"] == {"ForAllValues:StringLike": {"aws:TagKeys": [
        "cluster:bootstrap-failure:*", "cluster:bootstrap-last-success", "cluster:protected"]}}
    assert "Condition" not in health
    # No other statement grants SetInstanceHealth: the gate and the monitor set health in their own group only.
    assert [s for s in _statements(template) if "autoscaling:SetInstanceHealth" in json.dumps(s["Action"])] == [health]
    # no S3 permission at all until the stack names the bundle object
    assert not [s for s in _statements(template) if "s3:" in json.dumps(s["Action"])]


def test_health_tag_keys_match_what_the_monitor_writes():
    from cluster_constructs.compute import HEALTH_TAG_KEYS
    from node_bootstrap.monitor import actions

    assert HEALTH_TAG_KEYS == [actions.TAG_HEALTH, actions.TAG_HEALTH_REASON]


def test_object_download_is_one_object_of_the_bucket():
    _, _, template = _node_group(download=("cdk-assets-bucket", "0123abcd.zip"))
    (statement,) = [s for s in _statements(template) if "s3:" in json.dumps(s["Action"])]
    assert statement["Action"] == "s3:GetObject"
    assert statement["Resource"] == "arn:aws:s3:::cdk-assets-bucket/0123abcd.zip"  # the region's partition


def test_the_job_table_read_is_one_get_item_on_that_table():
    # a job's `start` checks its attempt against the job table (node_bootstrap/jobs/job_table.py): GetItem, and
    # no other DynamoDB action, on that table only
    arn = "arn:aws:dynamodb:us-east-1:111122223333:table/Test-JobTable"
    _, _, template = _node_group(job_table_arn=arn)
    (statement,) = [s for s in _statements(template) if "dynamodb:" in json.dumps(s["Action"])]
    assert (statement["Action"], statement["Resource"], statement["Effect"]) == ("dynamodb:GetItem", arn, "Allow")
    _, _, without = _node_group()
    assert not [s for s in _statements(without) if "dynamodb:" in json.dumps(s["Action"])]


def test_group_tag_keys_match_what_the_nodes_write():
    from cluster_constructs.compute import GROUP_TAG_KEY_PATTERNS
    from node_bootstrap import protection

    assert GROUP_TAG_KEY_PATTERNS == [protection.FAILURE_TAG_PREFIX + "*", protection.LAST_SUCCESS_TAG,
                                      protection.PROTECTED_TAG]


def test_odcr_is_targeted_by_the_group_reservations_only():
    _, _, template = _node_group(capacityMode="odcr", capacityReservationId="cr-0123456789abcdef0")
    template.has_resource_properties(
        "AWS::AutoScaling::AutoScalingGroup",
        {
            "PlacementGroup": Match.absent(),
            "CapacityReservationSpecification": {
                "CapacityReservationPreference": "capacity-reservations-only",
                "CapacityReservationTarget": {"CapacityReservationIds": ["cr-0123456789abcdef0"]},
            },
        },
    )


def test_capacity_block_in_the_launch_template():
    _, _, template = _node_group(
        capacityMode="capacity-block",
        capacityReservationId="cr-0fedcba9876543210",
        instanceType="p5en.48xlarge",
        reservationEndDate="2027-01-12T11:30:00Z",
    )
    template.has_resource_properties(
        "AWS::EC2::LaunchTemplate",
        {
            "LaunchTemplateData": Match.object_like(
                {
                    "InstanceType": "p5en.48xlarge",
                    "InstanceMarketOptions": {"MarketType": "capacity-block"},
                    "CapacityReservationSpecification": {
                        "CapacityReservationTarget": {"CapacityReservationId": "cr-0fedcba9876543210"}
                    },
                }
            )
        },
    )
    template.has_resource_properties("AWS::AutoScaling::AutoScalingGroup", {"PlacementGroup": Match.absent()})


def test_root_device_follows_the_ami_family():
    assert (
        root_device_name("/aws/service/deeplearning/ami/x86_64/x-amazon-linux-2023/latest/ami-id")
        == "/dev/xvda"
    )
    assert (
        root_device_name("/aws/service/deeplearning/ami/x86_64/x-ubuntu-22.04/latest/ami-id") == "/dev/sda1"
    )
