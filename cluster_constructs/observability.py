"""ClusterObservability: the log group for bootstrap and job logs, the alarm topic, and the alarms.

A missing node and a full file system silently idle a paid cluster: both alarm. So does protected mode: nodes
that keep failing their bootstrap stop being replaced, and someone must look. So do idle GPUs while nodes are
in service (the most expensive failure there is), stragglers, EFA errors that keep rising, and an estimated
cost above the budget; each of those is a setting that can be turned off (cluster_spec/settings.py,
ObservabilitySettings). The metrics they read are named in cluster_spec/metrics.py; what each
alarm means and what to do about it is in docs/troubleshooting.md.
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

from cluster_spec import metrics as cm
from cluster_spec.settings import ObservabilitySettings

LOW_FREE_STORAGE_FRACTION = 0.1
ALARM_PERIOD = Duration.minutes(5)
IDLE_PERIODS = 6  # 30 minutes of 5-minute periods
STRAGGLER_PERIODS = 3  # 15 minutes
EFA_ERROR_PERIODS = 3  # 15 minutes
JOB_KEEPER_ERROR_PERIODS = 3  # 15 minutes: about 15 failed runs of the every-minute keeper, not one hiccup
# The longest window a CloudWatch alarm can look back: Period x EvaluationPeriods <= 604,800 s (PutMetricAlarm).
BUDGET_WINDOW = Duration.days(7)
# Published by the nodes (node_bootstrap/protection.py) in the namespace their role may write.
PROTECTED_MODE_NAMESPACE = "TrainingCluster"
PROTECTED_MODE_METRIC = "BootstrapProtectedMode"
NODE_UNHEALTHY_METRIC = "NodeUnhealthy"  # node_bootstrap/monitor/actions.py, every round: 0 or 1

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
        self.settings = settings
        self.alarms: list[cloudwatch.Alarm] = []
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
        return self._notify(alarm)

    def add_protected_mode_alarm(self, *, auto_scaling_group_name: str) -> cloudwatch.Alarm:
        """Alarm when nodes put the group into protected mode (node_bootstrap/protection.py publishes 1 then, and 0
        after each successful bootstrap). Missing data keeps the state: the group stays suspended until an
        operator resumes it, and the next node that boots cleanly turns the alarm OK."""
        return self._group_flag_alarm(
            "ProtectedModeAlarm",
            PROTECTED_MODE_METRIC,
            auto_scaling_group_name,
            cloudwatch.TreatMissingData.IGNORE,
            "Protected mode: node bootstraps keep failing for the same reason, so the group no longer replaces "
            f"unhealthy nodes. The reason is the group tag cluster:protected of {auto_scaling_group_name}; "
            "fix it, then resume as docs/operations.md 'Protected mode' says.",
        )

    def add_node_health_alarm(self, *, auto_scaling_group_name: str) -> cloudwatch.Alarm:
        """Alarm when a node's health monitor finds it unhealthy (it publishes NodeUnhealthy=1 every round
        from then on, until the group replaces it). Missing data is not a breach: a replaced node stops
        publishing, and so does a cluster scaled to zero."""
        return self._group_flag_alarm(
            "NodeHealthAlarm",
            NODE_UNHEALTHY_METRIC,
            auto_scaling_group_name,
            cloudwatch.TreatMissingData.NOT_BREACHING,
            f"A node of {auto_scaling_group_name} found itself unhealthy (GPU lost, uncorrectable ECC, a fatal "
            "Xid, an EFA device or NVLink down) and is being replaced; its job was stopped. Why: the "
            "instance tag cluster:health-reason, or `clusterctl nodes` (docs/operations.md, When a node fails).",
        )

    def _group_flag_alarm(
        self,
        construct_id: str,
        metric_name: str,
        auto_scaling_group_name: str,
        treat_missing_data: cloudwatch.TreatMissingData,
        description: str,
    ) -> cloudwatch.Alarm:
        """An alarm to the topic when the nodes' 0/1 flag metric of this group reaches 1 in any minute."""
        flag = cloudwatch.Metric(
            namespace=PROTECTED_MODE_NAMESPACE,
            metric_name=metric_name,
            statistic="Maximum",
            period=Duration.minutes(1),
            dimensions_map={"AutoScalingGroupName": auto_scaling_group_name},
        )
        alarm = flag.create_alarm(
            self,
            construct_id,
            threshold=1,
            evaluation_periods=1,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=treat_missing_data,
            alarm_description=description,
        )
        alarm.add_alarm_action(cw_actions.SnsAction(self.alarm_topic))
        return alarm

    def add_job_keeper_alarm(self, *, function_name: str) -> cloudwatch.Alarm:
        """Alarm when the job keeper function fails in every 5-minute period for 15 minutes (an exception, a
        timeout, a denied call): until it runs again, a job that loses a node is not restarted. A single failed
        run is not an alarm: the next tick, a minute later, redoes it."""
        errors = cloudwatch.Metric(
            namespace="AWS/Lambda",
            metric_name="Errors",
            statistic="Sum",
            period=ALARM_PERIOD,
            dimensions_map={"FunctionName": function_name},
        )
        alarm = errors.create_alarm(
            self,
            "JobKeeperErrorsAlarm",
            threshold=1,
            evaluation_periods=JOB_KEEPER_ERROR_PERIODS,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_OR_EQUAL_TO_THRESHOLD,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description="The job keeper keeps failing, so a job that loses a node is not restarted. Its log: "
            "the output JobKeeperLogGroupName (docs/troubleshooting.md, 'The job keeper fails').",
        )
        return self._notify(alarm)

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
        return self._notify(alarm)

    def add_metric_alarms(
        self, *, auto_scaling_group_name: str, cluster_name: str, usd_per_node_hour: float
    ) -> list[cloudwatch.Alarm]:
        """The alarms on the nodes' and the trainer's metrics that the settings turn on."""
        s = self.settings
        created = []
        if s.idle_gpu_alarm:
            created.append(self._idle_gpu_alarm(auto_scaling_group_name))
        if s.straggler_alarm:
            created += self._straggler_alarms(auto_scaling_group_name, cluster_name)
        if s.efa_error_alarm:
            created.append(self._efa_error_alarm(auto_scaling_group_name))
        if s.budget_usd is not None:
            created.append(self._budget_alarm(auto_scaling_group_name, s.budget_usd, usd_per_node_hour))
        return created

    def _notify(self, alarm: cloudwatch.Alarm) -> cloudwatch.Alarm:
        alarm.add_alarm_action(cw_actions.SnsAction(self.alarm_topic))
        self.alarms.append(alarm)
        return alarm

    @staticmethod
    def _metric(namespace: str, name: str, dimensions: dict[str, str], statistic: str,
                period: Duration = ALARM_PERIOD) -> cloudwatch.Metric:
        return cloudwatch.Metric(namespace=namespace, metric_name=name, dimensions_map=dimensions,
                                 statistic=statistic, period=period)

    def _idle_gpu_alarm(self, group: str) -> cloudwatch.Alarm:
        """Mean GPU utilization of the cluster below the threshold for 30 minutes while nodes are in service.
        No GPU metrics at all while nodes run counts as idle (FILL 0): a node without its agent is paid for
        too. With no node in service (a Capacity Block before its start) the expression is 100: not idle."""
        threshold = self.settings.idle_gpu_utilization_percent
        idle = cloudwatch.MathExpression(
            expression="IF(nodes >= 1, FILL(gpu, 0), 100)",
            using_metrics={
                "gpu": self._metric(cm.AGENT_NAMESPACE, cm.GPU_UTILIZATION, {cm.GROUP: group}, "Average"),
                "nodes": self._metric(cm.AUTOSCALING_NAMESPACE, cm.GROUP_IN_SERVICE, {cm.GROUP: group},
                                      "Minimum"),
            },
            label="Mean GPU utilization while nodes are in service (%)",
            period=ALARM_PERIOD,
        )
        alarm = idle.create_alarm(
            self, "IdleGpuAlarm",
            threshold=threshold,
            comparison_operator=cloudwatch.ComparisonOperator.LESS_THAN_THRESHOLD,
            evaluation_periods=IDLE_PERIODS,
            datapoints_to_alarm=IDLE_PERIODS,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=f"GPUs idle: mean GPU utilization below {threshold}% for 30 minutes while nodes "
            "are in service (no job running, a hung job, or nodes without GPU metrics). The nodes bill all the "
            "same: submit, fix or scale in. See docs/troubleshooting.md, 'Low GPU utilization'.",
        )
        return self._notify(alarm)

    def _straggler_alarms(self, group: str, cluster_name: str) -> list[cloudwatch.Alarm]:
        """A straggler for 15 minutes, seen two ways: the slowest rank's step time against the median rank's
        (the trainer's EMF record), and the lowest GPU's utilization against the cluster's mean while a job
        keeps the GPUs busy (the agent's cluster roll-up: one GPU or node held back by its host, data loading,
        or a fault)."""
        margin = self.settings.straggler_margin_percent
        ratio = self._metric(cm.TRAINING_NAMESPACE, cm.STRAGGLER_RATIO, {cm.CLUSTER: cluster_name}, "Maximum")
        step_alarm = ratio.create_alarm(
            self, "StragglerStepTimeAlarm",
            threshold=1 + margin / 100,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=STRAGGLER_PERIODS,
            datapoints_to_alarm=STRAGGLER_PERIODS,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=f"Straggler: the slowest rank's step time is more than {margin}% above the median "
            "rank's for 15 minutes. The job runs at the slowest rank's pace. See docs/troubleshooting.md, "
            "'Stragglers'.",
        )
        gap = cloudwatch.MathExpression(
            expression=f"IF(mean >= {self.settings.idle_gpu_utilization_percent}, mean - lowest, 0)",
            using_metrics={
                "mean": self._metric(cm.AGENT_NAMESPACE, cm.GPU_UTILIZATION, {cm.GROUP: group}, "Average"),
                "lowest": self._metric(cm.AGENT_NAMESPACE, cm.GPU_UTILIZATION, {cm.GROUP: group}, "Minimum"),
            },
            label="Mean GPU utilization minus the lowest GPU's (points)",
            period=ALARM_PERIOD,
        )
        gpu_alarm = gap.create_alarm(
            self, "StragglerGpuAlarm",
            threshold=margin,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=STRAGGLER_PERIODS,
            datapoints_to_alarm=STRAGGLER_PERIODS,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=f"Straggler: one GPU's utilization more than {margin} points below the cluster's "
            "mean for 15 minutes while a job runs. Find the node on the dashboard ('GPU utilization per node') "
            "or with `clusterctl top`. See docs/troubleshooting.md, 'Stragglers'.",
        )
        return [self._notify(step_alarm), self._notify(gpu_alarm)]

    def _efa_error_alarm(self, group: str) -> cloudwatch.Alarm:
        errors = self._metric(cm.TRAINING_NAMESPACE, cm.EFA_ERROR_EVENTS, {cm.GROUP: group}, "Sum")
        alarm = errors.create_alarm(
            self, "EfaErrorsAlarm",
            threshold=0,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=EFA_ERROR_PERIODS,
            datapoints_to_alarm=EFA_ERROR_PERIODS,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description="EFA errors rising: SRD retransmit timeouts, unresponsive or impaired peers, or "
            "RDMA work-request errors in every 5 minutes for 15 minutes. See docs/troubleshooting.md, "
            "'EFA errors'.",
        )
        return self._notify(alarm)

    def _budget_alarm(self, group: str, budget_usd: float, usd_per_node_hour: float) -> cloudwatch.Alarm:
        """Estimated cost: node-minutes in service (the group's 1-minute GroupInServiceInstances, summed) x the
        catalog's hourly On-Demand price / 60, over the last 7 days: the longest window an alarm can evaluate.
        For a cluster younger than 7 days that is its cost since creation; after that, the cost of the last
        7 days (`clusterctl top` shows the cost since creation). An estimate: a Capacity Block is paid upfront
        at its own price, and prices differ by region (instance_catalog/instance_types.py)."""
        node_minutes = self._metric(cm.AUTOSCALING_NAMESPACE, cm.GROUP_IN_SERVICE, {cm.GROUP: group}, "Sum",
                                    period=BUDGET_WINDOW)
        cost = cloudwatch.MathExpression(
            expression=f"node_minutes / 60 * {usd_per_node_hour}",
            using_metrics={"node_minutes": node_minutes},
            label="Estimated On-Demand cost, last 7 days (USD)",
            period=BUDGET_WINDOW,
        )
        alarm = cost.create_alarm(
            self, "BudgetAlarm",
            threshold=budget_usd,
            comparison_operator=cloudwatch.ComparisonOperator.GREATER_THAN_THRESHOLD,
            evaluation_periods=1,
            treat_missing_data=cloudwatch.TreatMissingData.NOT_BREACHING,
            alarm_description=f"Budget: estimated cost above ${budget_usd:,.2f} (nodes in service x "
            f"${usd_per_node_hour:,.2f}/h over the last 7 days, which is since creation for a younger "
            "cluster). See docs/troubleshooting.md, 'Cost overrun'.",
        )
        return self._notify(alarm)
