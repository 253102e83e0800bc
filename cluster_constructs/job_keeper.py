"""JobKeeper: the job table, the job keeper Lambda function, and the EventBridge rules that run it.

The table holds one record per job and the lock that lets a cluster run one job at a time
(cluster_jobs/table.py). The keeper (job_keeper/keeper.py, entry point job_keeper.handler.handler)
reconciles the running job with the cluster: when the job lost a node it stops what is left of it, waits for
the group to be back at full ready strength and starts the next attempt through the stack's jobs document.
It is level-triggered: it reads the group, the nodes and the table on every run and acts on the difference, so
the schedule alone is enough and the Auto Scaling and Capacity Block events only make it faster. A stale event
is therefore worth little, which sets the retry limits below.

The function may do exactly what the keeper needs and nothing more (docs/architecture.md section 7): item reads
and writes on this table only, the jobs document only on this cluster's nodes, the describes it reconciles
from, and a publish to the alarm topic when it gives up.
"""

from __future__ import annotations

from aws_cdk import Duration, RemovalPolicy, Stack
from aws_cdk import aws_dynamodb as dynamodb
from aws_cdk import aws_events as events
from aws_cdk import aws_events_targets as targets
from aws_cdk import aws_iam as iam
from aws_cdk import aws_kms as kms
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_logs as logs
from aws_cdk import aws_sns as sns
from constructs import Construct

from cluster_spec.settings import CapacityMode

HANDLER = "job_keeper.handler.handler"
# Python 3.13: the keeper's code (job_keeper, cluster_jobs) needs >= 3.11; Lambda supports 3.13 until 2029
# (Lambda runtimes, "Supported runtimes"). The runtime is part of the code's contract, so it moves by a reviewed change.
RUNTIME = lambda_.Runtime.PYTHON_3_13
TIMEOUT = Duration.minutes(10)  # a reconcile that stops a job and starts the next attempt waits on SSM commands
MEMORY_MIB = 512
# The keeper's item actions on the job table (cluster_jobs/table.py, as the keeper uses it): reads, the
# whole-item puts, and the lock's delete. TransactWriteItems has no permission of its own: each item action in it
# is authorized as itself, here a Put and a Delete (DynamoDB Developer Guide, "Using IAM with DynamoDB
# transactions"). The keeper never lists the table (Scan) nor writes a ConditionCheck item.
# tests/cluster_constructs/test_job_keeper.py holds the role to exactly the calls job_keeper/ makes.
KEEPER_TABLE_ACTIONS = (
    "dynamodb:GetItem",
    "dynamodb:PutItem",
    "dynamodb:DeleteItem",
)
SCHEDULE = events.Schedule.rate(Duration.minutes(1))
AUTO_SCALING_EVENTS = (
    "EC2 Instance Launch Successful",
    "EC2 Instance Terminate Successful",
    "EC2 Instance Launch Unsuccessful",
)
# EC2 sends one 40 minutes before a Capacity Block ends; its instances begin to terminate 10 minutes later (EC2
# User Guide, "Monitor Capacity Blocks using EventBridge"). The guide's examples spell the detail-type both
# ways, so the rule matches both.
CAPACITY_BLOCK_EVENTS = ("Capacity Block Expiration Warning", "Capacity Block Reservation Expiration Warning")


class JobKeeper(Construct):
    """The job table (`table`), the keeper function (`function`, its `role` and `log_group`) and its rules
    (`rules`, by construct id).

    Construct ids are an API: renaming `Table` replaces the table (and, retained, leaves the old one behind).
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        code: lambda_.Code,
        auto_scaling_group_name: str,
        job_document_name: str,
        alarm_topic: sns.Topic,
        instance_type: str,
        capacity_mode: CapacityMode,
        capacity_reservation_id: str | None,
        log_retention: logs.RetentionDays,
        log_group_name: str | None = None,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)

        self.table = dynamodb.Table(
            self,
            "Table",
            partition_key=dynamodb.Attribute(name="pk", type=dynamodb.AttributeType.STRING),
            billing_mode=dynamodb.BillingMode.PAY_PER_REQUEST,  # a few writes a minute at most
            encryption=dynamodb.TableEncryption.AWS_MANAGED,
            point_in_time_recovery_specification=dynamodb.PointInTimeRecoverySpecification(
                point_in_time_recovery_enabled=True
            ),
            # Retained like the job logs, the buckets and the file system: the records are the history of the
            # runs (attempts, restart reasons, steps lost) and outlive the cluster. CloudFormation names the
            # table, so a redeploy after `cdk destroy` does not collide with the retained one.
            removal_policy=RemovalPolicy.RETAIN,
        )

        self.log_group = logs.LogGroup(
            self,
            "LogGroup",
            log_group_name=log_group_name,  # None: CloudFormation names it
            retention=log_retention,
            # Retained with the cluster's log group: what the keeper decided and why is part of a run's record.
            # A fixed name would collide with the retained group on the next deploy: give one that is new for
            # every creation of the stack, or none.
            removal_policy=RemovalPolicy.RETAIN,
        )
        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("lambda.amazonaws.com"),
            description="Job keeper: reconciles the running job with the cluster's nodes",
        )
        for statement in keeper_statements(
            stack,
            table_arn=self.table.table_arn,
            job_document_name=job_document_name,
            auto_scaling_group_name=auto_scaling_group_name,
            alarm_topic=alarm_topic,
            log_group_arn=self.log_group.log_group_arn,
        ):
            self.role.add_to_policy(statement)

        self.function = lambda_.Function(
            self,
            "Function",
            description="Job keeper: restarts the running job on a new node set when it lost a node",
            runtime=RUNTIME,
            handler=HANDLER,
            code=code,
            role=self.role,
            timeout=TIMEOUT,
            memory_size=MEMORY_MIB,
            reserved_concurrent_executions=1,  # one reconcile at a time: two would both restart the job
            log_group=self.log_group,
            environment={
                "JOB_TABLE_NAME": self.table.table_name,
                "JOB_DOCUMENT_NAME": job_document_name,
                "AUTO_SCALING_GROUP_NAME": auto_scaling_group_name,
                "ALARM_TOPIC_ARN": alarm_topic.topic_arn,
                "STACK_NAME": stack.stack_name,
                "INSTANCE_TYPE": instance_type,
                "CAPACITY_MODE": capacity_mode.value,
                "CAPACITY_RESERVATION_ID": capacity_reservation_id or "",
            },
            # EventBridge invokes asynchronously. A failed reconcile is not retried: the next minute's run
            # redoes it from the world as it is then. Events that wait while a reconcile runs (concurrency 1
            # throttles them) are kept for 15 minutes, long enough for a Capacity Block warning to outlast a
            # reconcile of up to TIMEOUT, then dropped.
            retry_attempts=0,
            max_event_age=Duration.minutes(15),
        )

        # CDK makes a function depend on its role and the role's policy, so the permissions exist before the
        # first run; the dependency on the role is also implied by the Role GetAtt (cfn-lint W3005). It is CDK's
        # wiring, and harmless.
        self.function.node.default_child.add_metadata("cfn-lint", {"config": {"ignore_checks": ["W3005"]}})

        target = self.function
        self.rules: dict[str, events.Rule] = {
            # Every minute: the keeper's heartbeat; a missed event costs at most this long.
            "Schedule": events.Rule(
                self,
                "Schedule",
                description="Job keeper: reconcile every minute",
                schedule=SCHEDULE,
                # a tick is worth nothing once the next one is due
                targets=[targets.LambdaFunction(target, retry_attempts=2, max_event_age=Duration.minutes(1))],
            ),
            # A node launched or terminated: reconcile now rather than at the next tick.
            "GroupEvents": events.Rule(
                self,
                "GroupEvents",
                description="Job keeper: the cluster's nodes were launched or terminated",
                event_pattern=events.EventPattern(
                    source=["aws.autoscaling"],
                    detail_type=list(AUTO_SCALING_EVENTS),
                    detail={"AutoScalingGroupName": [auto_scaling_group_name]},
                ),
                targets=[targets.LambdaFunction(target, retry_attempts=4, max_event_age=Duration.minutes(5))],
            ),
        }
        if capacity_mode is CapacityMode.CAPACITY_BLOCK:
            # The block is about to end: the job stops for that reason and is not restarted. The pattern does not
            # filter on the reservation id (the guide's examples are loose about the event's fields, and a missed
            # warning costs more than an extra reconcile): the keeper compares the event's
            # capacity-reservation-id with CAPACITY_RESERVATION_ID itself.
            self.rules["CapacityBlockEvents"] = events.Rule(
                self,
                "CapacityBlockEvents",
                description="Job keeper: the cluster's Capacity Block is about to end",
                event_pattern=events.EventPattern(source=["aws.ec2"], detail_type=list(CAPACITY_BLOCK_EVENTS)),
                # useful only before the block's instances begin to terminate, 10 minutes after the warning
                targets=[targets.LambdaFunction(target, retry_attempts=10, max_event_age=Duration.minutes(10))],
            )


def keeper_statements(
    stack: Stack,
    *,
    table_arn: str,
    job_document_name: str,
    auto_scaling_group_name: str,
    alarm_topic: sns.Topic,
    log_group_arn: str,
) -> list[iam.PolicyStatement]:
    """The keeper role's statements: every action named, each on the narrowest resource the service allows.

    Exactly the AWS calls of job_keeper/ and what it uses of cluster_jobs/ and cluster_aws/, plus what runs
    around the code: the Lambda runtime writes the function's log (WriteLogs), and SNS uses the alarm topic's
    key with the publisher's permissions (UseAlarmTopicKey)."""
    document_arn = stack.format_arn(service="ssm", resource="document", resource_name=job_document_name)
    instance_arn = stack.format_arn(service="ec2", resource="instance", resource_name="*")
    statements = [
        iam.PolicyStatement(sid="JobRecords", actions=list(KEEPER_TABLE_ACTIONS), resources=[table_arn]),
        # SendCommand is authorized on the document and on each target instance: the document is the stack's
        # jobs document, the instances are this cluster's nodes (the Auto Scaling group tags each with its name).
        iam.PolicyStatement(sid="SendJobDocument", actions=["ssm:SendCommand"], resources=[document_arn]),
        iam.PolicyStatement(
            sid="SendToClusterNodes",
            actions=["ssm:SendCommand"],
            resources=[instance_arn],
            conditions={"StringEquals": {"ssm:resourceTag/aws:autoscaling:groupName": auto_scaling_group_name}},
        ),
        # Reads that take no resource ARN (Service Authorization Reference: AWS Systems Manager, Amazon EC2,
        # Amazon EC2 Auto Scaling): the job command's results, the group, its instances and the reservation.
        iam.PolicyStatement(sid="ReadCommandResults", actions=["ssm:GetCommandInvocation"], resources=["*"]),
        iam.PolicyStatement(
            sid="DescribeCluster",
            actions=[
                "autoscaling:DescribeAutoScalingGroups",
                "ec2:DescribeInstances",
                "ec2:DescribeCapacityReservations",
            ],
            resources=["*"],
        ),
        iam.PolicyStatement(sid="PublishAlarm", actions=["sns:Publish"], resources=[alarm_topic.topic_arn]),
        # The function's own log group only (its ARN ends in :*, which covers its streams).
        iam.PolicyStatement(
            sid="WriteLogs", actions=["logs:CreateLogStream", "logs:PutLogEvents"], resources=[log_group_arn]
        ),
    ]
    if alarm_topic.master_key is not None:
        statements.append(alarm_topic_key_statement(alarm_topic.master_key))
    return statements


def alarm_topic_key_statement(key: kms.IKey) -> iam.PolicyStatement:
    """A publisher to an encrypted topic needs the topic's key: SNS generates and decrypts the message's data
    key with the publisher's permissions (SNS Developer Guide, "Key management"). The key is the alarm topic's
    own (cluster_constructs/observability.py); nothing else is encrypted with it."""
    return iam.PolicyStatement(
        sid="UseAlarmTopicKey", actions=["kms:GenerateDataKey", "kms:Decrypt"], resources=[key.key_arn]
    )
