"""ClusterObservability: retained log group, encrypted alarm topic, the two alarms that catch an idle cluster."""

import json

import pytest
from aws_cdk.assertions import Match, Template
from cdk_support import bare_stack, build_settings, resources_of

from cluster_constructs.observability import ClusterObservability, retention_days
from cluster_spec.settings import LOG_RETENTION_DAYS


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
    observability.add_node_health_alarm(auto_scaling_group_name="Test-nodes")
    observability.add_file_system_alarm(file_system_id="fs-0123456789abcdef0", storage_capacity_gib=4800)
    observability.add_job_keeper_alarm(function_name="Test-JobKeeperFunction-AbC123")
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


def test_node_health_alarm_fires_on_a_node_the_monitor_found_unhealthy(template):
    from node_bootstrap.monitor import actions

    template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "MetricName": actions.UNHEALTHY_METRIC,
            "Namespace": actions.METRIC_NAMESPACE,
            "Statistic": "Maximum",
            "Period": 60,
            "ComparisonOperator": "GreaterThanOrEqualToThreshold",
            "Threshold": 1,
            "TreatMissingData": "notBreaching",
            "Dimensions": [{"Name": "AutoScalingGroupName", "Value": "Test-nodes"}],
            "AlarmDescription": Match.string_like_regexp("instance tag cluster:health-reason"),
            "AlarmActions": [{"Ref": Match.string_like_regexp("^ObsAlarmTopic")}],
        },
    )


def test_job_keeper_alarm_fires_when_the_keeper_keeps_failing(template):
    template.has_resource_properties(
        "AWS::CloudWatch::Alarm",
        {
            "Namespace": "AWS/Lambda",
            "MetricName": "Errors",
            "Dimensions": [{"Name": "FunctionName", "Value": "Test-JobKeeperFunction-AbC123"}],
            "Statistic": "Sum",
            "Period": 300,
            "EvaluationPeriods": 3,  # 15 minutes of failed runs, not one
            "ComparisonOperator": "GreaterThanOrEqualToThreshold",
            "Threshold": 1,
            "TreatMissingData": "notBreaching",
            "AlarmDescription": Match.string_like_regexp("JobKeeperLogGroupName"),
            "AlarmActions": [{"Ref": Match.string_like_regexp("^ObsAlarmTopic")}],
        },
    )


def test_every_allowed_retention_maps_to_the_cdk_enum():
    for days in LOG_RETENTION_DAYS:
        assert retention_days(days) is not None


# ----- the alarms on the nodes' and the trainer's metrics ------------------------------------------------
def metric_alarms(**overrides) -> dict[str, dict]:
    stack = bare_stack()
    observability = ClusterObservability(
        stack, "Obs", settings=build_settings(**overrides).observability, log_group_name="/training-cluster/Test"
    )
    observability.add_metric_alarms(auto_scaling_group_name="Test-nodes", cluster_name="Test",
                                    usd_per_node_hour=55.04)
    template = Template.from_stack(stack)
    alarms = template.find_resources("AWS::CloudWatch::Alarm")
    return {logical_id.removeprefix("Obs").rstrip("0123456789ABCDEF"): a["Properties"]
            for logical_id, a in alarms.items()}


def _metric_stats(alarm: dict) -> dict[str, dict]:
    return {m["Id"]: m["MetricStat"] for m in alarm["Metrics"] if "MetricStat" in m}


def test_default_alarms_idle_stragglers_efa_and_no_budget():
    alarms = metric_alarms()
    assert set(alarms) == {"IdleGpuAlarm", "StragglerStepTimeAlarm", "StragglerGpuAlarm", "EfaErrorsAlarm"}
    for alarm in alarms.values():
        (action,) = alarm["AlarmActions"]
        assert action["Ref"].startswith("ObsAlarmTopic")
        assert alarm["TreatMissingData"] == "notBreaching"


def test_idle_gpu_alarm_is_30_minutes_below_the_threshold_while_nodes_are_in_service():
    idle = metric_alarms(idleGpuUtilizationPercent="25")["IdleGpuAlarm"]
    assert (idle["Threshold"], idle["ComparisonOperator"]) == (25, "LessThanThreshold")
    assert idle["EvaluationPeriods"] == idle["DatapointsToAlarm"] == 6
    (expression,) = [m["Expression"] for m in idle["Metrics"] if "Expression" in m]
    assert expression == "IF(nodes >= 1, FILL(gpu, 0), 100)"
    stats = _metric_stats(idle)
    assert stats["gpu"]["Metric"]["MetricName"] == "nvidia_smi_utilization_gpu"
    assert stats["gpu"]["Metric"]["Dimensions"] == [{"Name": "AutoScalingGroupName", "Value": "Test-nodes"}]
    assert stats["nodes"]["Metric"]["MetricName"] == "GroupInServiceInstances"
    assert {s["Period"] for s in stats.values()} == {300}  # 6 x 5 minutes = 30 minutes


def test_straggler_alarms_use_the_margin():
    alarms = metric_alarms(stragglerMarginPercent="20")
    step = alarms["StragglerStepTimeAlarm"]
    assert (step["MetricName"], step["Namespace"], step["Statistic"]) == ("StragglerRatio", "TrainingCluster",
                                                                         "Maximum")
    assert step["Dimensions"] == [{"Name": "Cluster", "Value": "Test"}]
    assert step["Threshold"] == pytest.approx(1.2) and step["EvaluationPeriods"] == 3 and step["Period"] == 300
    gpu = alarms["StragglerGpuAlarm"]
    assert gpu["Threshold"] == 20 and gpu["EvaluationPeriods"] == 3
    (expression,) = [m["Expression"] for m in gpu["Metrics"] if "Expression" in m]
    assert expression == "IF(mean >= 10, mean - lowest, 0)"
    assert {k: s["Stat"] for k, s in _metric_stats(gpu).items()} == {"mean": "Average", "lowest": "Minimum"}


def test_efa_error_alarm_sums_error_events_of_the_cluster():
    efa = metric_alarms()["EfaErrorsAlarm"]
    assert (efa["MetricName"], efa["Statistic"], efa["Threshold"]) == ("EfaErrorEvents", "Sum", 0)
    assert efa["Dimensions"] == [{"Name": "AutoScalingGroupName", "Value": "Test-nodes"}]
    assert efa["EvaluationPeriods"] == efa["DatapointsToAlarm"] == 3


def test_budget_alarm_is_node_minutes_times_the_catalog_price_over_seven_days():
    budget = metric_alarms(budgetUsd="100000")["BudgetAlarm"]
    assert (budget["Threshold"], budget["ComparisonOperator"]) == (100000, "GreaterThanThreshold")
    (expression,) = [m["Expression"] for m in budget["Metrics"] if "Expression" in m]
    assert expression == "node_minutes / 60 * 55.04"
    stat = _metric_stats(budget)["node_minutes"]
    assert (stat["Metric"]["MetricName"], stat["Stat"], stat["Period"]) == ("GroupInServiceInstances", "Sum",
                                                                           7 * 24 * 3600)
    # PutMetricAlarm: Period x EvaluationPeriods <= 604,800 s
    assert budget["EvaluationPeriods"] * stat["Period"] <= 604_800


def test_every_metric_alarm_can_be_turned_off():
    alarms = metric_alarms(idleGpuAlarm="false", stragglerAlarm="false", efaErrorAlarm="false")
    assert alarms == {}
