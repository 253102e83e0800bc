"""ClusterObservability: the log group for bootstrap and job logs, the alarm topic, and the alarms.

A missing node and a full file system are the two failures that silently idle a paid cluster: both alarm. So
does protected mode: nodes that keep failing their bootstrap stop being replaced, and someone must look.
"""

from __future__ import annotations

from aws_cdk import (
    Aws,
    Duration,
    RemovalPolicy,
)
from aws_cdk import (
    aws_cloudwatch as cloudwatch,
)
from aws_cdk import (
    aws_cloudwatch_actions as cw_actions,
)
from aws_cdk import (
    aws_iam as iam,
)
from aws_cdk import (
    aws_kms as kms,
)
from aws_cdk import (
    aws_logs as logs,
)
from aws_cdk import (
    aws_sns as sns,
)
from aws_cdk import (
    aws_sns_subscriptions as subscriptions,
)
from constructs import Construct

from stacks.settings import ObservabilitySettings

LOW_FREE_STORAGE_FRACTION = 0.1
# Published by the nodes (node_bootstrap/protection.py) in the namespace their role may write.
PROTECTED_MODE_NAMESPACE = "TrainingCluster"
PROTECTED_MODE_METRIC = "BootstrapProtectedMode"

_RETENTION = {
    1: "ONE_DAY",
    3: "THREE_DAYS",
    5: "FIVE_DAYS",
    7: "ONE_WEEK",
    14: "TWO_WEEKS",
    30: "ONE_MONTH",
    60: "TWO_MONTHS",
    90: "THREE_MONTHS",
    120: "FOUR_MONTHS",
    150: "FIVE_MONTHS",
    180: "SIX_MONTHS",
    365: "ONE_YEAR",
    400: "THIRTEEN_MONTHS",
    545: "EIGHTEEN_MONTHS",
    731: "TWO_YEARS",
    1096: "THREE_YEARS",
    1827: "FIVE_YEARS",
    3653: "TEN_YEARS",
}


def retention_days(days: int) -> logs.RetentionDays:
    """The CloudWatch Logs retention enum for a number of days (settings allow exactly these values)."""
    return getattr(logs.RetentionDays, _RETENTION[days])


class ClusterObservability(Construct):
    def __init__(
        self, scope: Construct, construct_id: str, *, settings: ObservabilitySettings, log_group_name: str
    ) -> None:
        super().__init__(scope, construct_id)
        self.log_group = logs.LogGroup(
            self,
            "LogGroup",
            log_group_name=log_group_name,
            retention=retention_days(settings.log_retention_days),
            removal_policy=RemovalPolicy.RETAIN,  # job logs are a run's record; they outlive the cluster
        )
        # CloudWatch alarms and Auto Scaling publish to an encrypted topic only through a customer managed key
        # that lets those services use it (the AWS managed SNS key does not).
        key = kms.Key(
            self,
            "AlarmTopicKey",
            enable_key_rotation=True,
            description="Training cluster alarm topic",
            removal_policy=RemovalPolicy.DESTROY,
        )
        key.grant(iam.ServicePrincipal("cloudwatch.amazonaws.com"), "kms:Decrypt", "kms:GenerateDataKey*")
        # Auto Scaling publishes its notifications as its service-linked role, which may not exist yet in a
        # fresh account (it is created with the first group, after this key): a key policy naming it as the
        # principal would be rejected, so the statement matches it by condition instead.
        key.add_to_resource_policy(
            iam.PolicyStatement(
                sid="AllowAutoScalingNotifications",
                principals=[iam.AnyPrincipal()],
                actions=["kms:Decrypt", "kms:GenerateDataKey*"],
                resources=["*"],
                conditions={
                    "StringEquals": {"kms:CallerAccount": Aws.ACCOUNT_ID},
                    "ArnEquals": {
                        "aws:PrincipalArn": f"arn:{Aws.PARTITION}:iam::{Aws.ACCOUNT_ID}:role/aws-service-role/"
                        "autoscaling.amazonaws.com/AWSServiceRoleForAutoScaling"
                    },
                },
            )
        )
        self.alarm_topic = sns.Topic(
            self, "AlarmTopic", master_key=key, enforce_ssl=True, display_name="Training cluster alarms"
        )
        if settings.alarm_email:
            self.alarm_topic.add_subscription(subscriptions.EmailSubscription(settings.alarm_email))

    def add_node_alarm(self, *, auto_scaling_group_name: str) -> cloudwatch.Alarm:
        """Alarm when fewer nodes are in service than desired for 15 minutes (a failed launch, a node that
        failed its health gate and was not replaced, an exhausted reservation)."""

        def group_metric(name: str) -> cloudwatch.Metric:
            return cloudwatch.Metric(
                namespace="AWS/AutoScaling",
                metric_name=name,
                statistic="Minimum",
                period=Duration.minutes(5),
                dimensions_map={"AutoScalingGroupName": auto_scaling_group_name},
            )

        missing = cloudwatch.MathExpression(
            expression="desired - inservice",
            using_metrics={
                "desired": group_metric("GroupDesiredCapacity"),
                "inservice": group_metric("GroupInServiceInstances"),
            },
            label="Nodes missing",
            period=Duration.minutes(5),
        )
        alarm = missing.create_alarm(
            self,
            "NodesMissingAlarm",
            threshold=0,
            evaluation_periods=3,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description="Fewer training nodes in service than desired for 15 minutes",
        )
        alarm.add_alarm_action(cw_actions.SnsAction(self.alarm_topic))
        return alarm

    def add_protected_mode_alarm(self, *, auto_scaling_group_name: str) -> cloudwatch.Alarm:
        """Alarm when nodes put the group into protected mode (node_bootstrap/protection.py publishes 1 then, and 0
        after each successful bootstrap). Missing data keeps the state: the group stays suspended until an
        operator resumes it, and the next node that boots cleanly turns the alarm OK."""
        protected = cloudwatch.Metric(
            namespace=PROTECTED_MODE_NAMESPACE,
            metric_name=PROTECTED_MODE_METRIC,
            statistic="Maximum",
            period=Duration.minutes(1),
            dimensions_map={"AutoScalingGroupName": auto_scaling_group_name},
        )
        alarm = protected.create_alarm(
            self,
            "ProtectedModeAlarm",
            threshold=1,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.IGNORE,
            alarm_description=(
                "Protected mode: node bootstraps keep failing for the same reason, so the group no longer replaces "
                f"unhealthy nodes. The reason is the group tag cluster:protected of {auto_scaling_group_name}; "
                "fix it, then resume as docs/operations.md 'Protected mode' says."
            ),
        )
        alarm.add_alarm_action(cw_actions.SnsAction(self.alarm_topic))
        return alarm

    def add_file_system_alarm(self, *, file_system_id: str, storage_capacity_gib: int) -> cloudwatch.Alarm:
        """Alarm when FSx for Lustre has less than 10% free: checkpoints fail to save on a full file system."""
        free = cloudwatch.Metric(
            namespace="AWS/FSx",
            metric_name="FreeDataStorageCapacity",
            statistic="Minimum",
            period=Duration.minutes(5),
            dimensions_map={"FileSystemId": file_system_id},
        )
        alarm = free.create_alarm(
            self,
            "FileSystemFullAlarm",
            evaluation_periods=2,
            threshold=storage_capacity_gib * 1024**3 * LOW_FREE_STORAGE_FRACTION,
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            alarm_description="FSx for Lustre has less than 10% free storage",
        )
        alarm.add_alarm_action(cw_actions.SnsAction(self.alarm_topic))
        return alarm
