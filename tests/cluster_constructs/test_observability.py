"""ClusterObservability: retained log group, encrypted alarm topic, the two alarms that catch an idle cluster."""

import json

import pytest
from aws_cdk.assertions import Match, Template
from cdk_support import bare_stack, build_settings, resources_of

from cluster_constructs.observability import ClusterObservability, retention_days
from stacks.settings import LOG_RETENTION_DAYS


@pytest.fixture(scope="module")
def template():
    stack = bare_stack()
    observability = ClusterObservability(
        stack,
        "Obs",
        settings=build_settings(alarmEmail="ops@example.com").observability,
        log_group_name="/training-cluster/Test",
    )
    observability.add_node_alarm(auto_scaling_group_name="Test-nodes")
    observability.add_protected_mode_alarm(auto_scaling_group_name="Test-nodes")
    observability.add_file_system_alarm(file_system_id="fs-0123456789abcdef0", storage_capacity_gib=4800)
    return Template.from_stack(stack)


def test_log_group_is_retained_with_retention(template):
    template.has_resource(
        "AWS::Logs::LogGroup",
        {
            "Properties": {"LogGroupName": "/training-cluster/Test", "RetentionInDays": 30},
            "DeletionPolicy": "Retain",
        },
    )


def test_topic_is_encrypted_and_subscribed(template):
    template.has_resource_properties("AWS::SNS::Topic", {"KmsMasterKeyId": Match.any_value()})
    template.has_resource_properties(
        "AWS::SNS::Subscription", {"Protocol": "email", "Endpoint": "ops@example.com"}
    )
    (key,) = resources_of(template, "AWS::KMS::Key")
    statements = key["KeyPolicy"]["Statement"]
    services = [s["Principal"]["Service"] for s in statements if "Service" in s.get("Principal", {})]
    assert services == ["cloudwatch.amazonaws.com"]
    (asg,) = [s for s in statements if s.get("Sid") == "AllowAutoScalingNotifications"]
    assert asg["Principal"] == {"AWS": "*"}
    assert set(asg["Condition"]) == {"StringEquals", "ArnEquals"}
    role = json.dumps(asg["Condition"]["ArnEquals"]["aws:PrincipalArn"])
    assert "role/aws-service-role/autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling" in role


def test_missing_nodes_alarm(template):
    template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "ComparisonOperator": "GreaterThanThreshold",
            "Threshold": 0,
            "EvaluationPeriods": 3,
            "Metrics": Match.array_with([Match.object_like({"Expression": "desired - inservice"})]),
            "AlarmActions": [{"Ref": Match.string_like_regexp("^ObsAlarmTopic")}],
        },
    )


def test_file_system_full_alarm(template):
    template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "MetricName": "FreeDataStorageCapacity",
            "Namespace": "AWS/FSx",
            "ComparisonOperator": "LessThanThreshold",
            "Threshold": 4800 * 1024**3 * 0.1,
            "Dimensions": [{"Name": "FileSystemId", "Value": "fs-0123456789abcdef0"}],
        },
    )


def test_protected_mode_alarm_keeps_its_state_until_a_node_boots_cleanly(template):
    from node_bootstrap import protection

    template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "MetricName": protection.PROTECTED_MODE_METRIC,
            "Namespace": protection.METRIC_NAMESPACE,
            "Statistic": "Maximum",
            "Period": 60,
            "ComparisonOperator": "GreaterThanOrEqualToThreshold",
            "Threshold": 1,
            "TreatMissingData": "ignore",
            "Dimensions": [{"Name": "AutoScalingGroupName", "Value": "Test-nodes"}],
            "AlarmDescription": Match.string_like_regexp("group tag cluster:protected of Test-nodes"),
            "AlarmActions": [{"Ref": Match.string_like_regexp("^ObsAlarmTopic")}],
        },
    )


def test_every_allowed_retention_maps_to_the_cdk_enum():
    for days in LOG_RETENTION_DAYS:
        assert retention_days(days) is not None
