"""NodeGroup: the nodes' role, launch template and fixed-size Auto Scaling group.

The launch template lists every EFA interface of the instance type in the AWS-recommended layout (EC2 User
Guide, "Maximize network bandwidth on instances with multiple network cards"): card 0 / device 0 is the ENA
primary interface, card 0 / device 1 is EFA-only, and every further card i carries an EFA-only interface on
device 0. A launch template that lists interfaces carries the security groups on each interface (not in
SecurityGroupIds) and no subnet: the Auto Scaling group places each interface in its own subnet (EC2 Auto
Scaling User Guide, "Network interfaces in a launch template").
"""

from __future__ import annotations

from aws_cdk import (
    ArnFormat,
    Aws,
    CfnAutoScalingScheduledAction,
    CfnTag,
    CfnUpdatePolicy,
    Fn,
    Stack,
)
from aws_cdk import (
    aws_autoscaling as autoscaling,
)
from aws_cdk import (
    aws_ec2 as ec2,
)
from aws_cdk import (
    aws_iam as iam,
)
from constructs import Construct

from cluster_constructs.capacity import CapacityTarget
from cluster_spec.settings import ComputeSettings
from instance_catalog.instance_types import InstanceType

BOOTSTRAP_TAG_KEYS = ["cluster:bootstrap", "cluster:bootstrap-reason"]
# The node health monitor's verdict on its own instance (node_bootstrap/monitor/actions.py writes these keys).
HEALTH_TAG_KEYS = ["cluster:health", "cluster:health-reason"]
# Protected mode's bookkeeping on the group itself (node_bootstrap/protection.py writes these keys).
GROUP_TAG_KEY_PATTERNS = ["cluster:bootstrap-failure:*", "cluster:bootstrap-last-success", "cluster:protected"]
CLOUDWATCH_NAMESPACES = ["CWAgent", "TrainingCluster"]  # the agent's and the trainer's metrics
# What the SSM Agent needs for Run Command and Session Manager, and nothing of AmazonSSMManagedInstanceCore's
# inventory, patching, association and parameter reads (a node could read every SSM parameter in the account):
# UpdateInstanceInformation registers the instance and reports its status; the agent receives commands and
# sends replies through ssmmessages (SSM Agent >= 3.3.40) or, where that is not allowed, ec2messages
# (Systems Manager User Guide, "Reference: ec2messages, ssmmessages, and other API operations"; the AWS
# managed policy AWSCloud9SSMInstanceProfile grants the same UpdateInstanceInformation + ssmmessages set).
SSM_AGENT_ACTIONS = [
    "ssm:UpdateInstanceInformation",
    "ssmmessages:CreateControlChannel",
    "ssmmessages:CreateDataChannel",
    "ssmmessages:OpenControlChannel",
    "ssmmessages:OpenDataChannel",
    "ec2messages:AcknowledgeMessage",
    "ec2messages:DeleteMessage",
    "ec2messages:FailMessage",
    "ec2messages:GetEndpoint",
    "ec2messages:GetMessages",
    "ec2messages:SendReply",
]


def efa_network_interfaces(
    instance: InstanceType,
    security_group_id: str,
) -> list[ec2.CfnLaunchTemplate.NetworkInterfaceProperty]:
    """The launch template's NetworkInterfaces for `instance`, in the recommended EFA layout."""
    layout = [(0, 0, "interface", "primary ENA interface")]
    if instance.efa_interfaces:
        layout.append((0, 1, "efa-only", "EFA-only, network card 0"))
        layout.extend(
            (card, 0, "efa-only", f"EFA-only, network card {card}")
            for card in range(1, instance.network_cards)
        )
    return [
        ec2.CfnLaunchTemplate.NetworkInterfaceProperty(
            network_card_index=card,
            device_index=device,
            interface_type=kind,
            description=description,
            groups=[security_group_id],
            delete_on_termination=True,
        )
        for card, device, kind, description in layout
    ]


def root_device_name(ami_parameter: str) -> str:
    """The root device of the AMI family: a wrong name would attach a second, unused volume instead of sizing
    the root volume. Ubuntu AMIs boot from /dev/sda1, Amazon Linux from /dev/xvda."""
    return "/dev/sda1" if "ubuntu" in ami_parameter.lower() else "/dev/xvda"


class NodeGroup(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: ComputeSettings,
        capacity: CapacityTarget,
        subnet: ec2.ISubnet,
        security_group: ec2.ISecurityGroup,
        user_data: ec2.UserData,
        log_group_arn: str,
        group_name: str,
        desired_capacity: int,
    ) -> None:
        super().__init__(scope, construct_id)
        self.settings = settings
        self.group_name = group_name

        self.role = iam.Role(
            self,
            "Role",
            assumed_by=iam.ServicePrincipal("ec2.amazonaws.com"),
            description="Training cluster nodes: SSM agent, CloudWatch Logs and metrics, own readiness tags, "
            "health in own group, the bundle object",
        )
        self._grant_node_permissions(log_group_arn)
        profile = iam.CfnInstanceProfile(self, "InstanceProfile", roles=[self.role.role_name])

        image = ec2.MachineImage.from_ssm_parameter(settings.ami_parameter).get_image(self)
        instance = settings.instance_type
        self.launch_template = ec2.CfnLaunchTemplate(
            self,
            "LaunchTemplate",
            launch_template_data=ec2.CfnLaunchTemplate.LaunchTemplateDataProperty(
                image_id=image.image_id,  # resolved from the SSM public parameter at deploy time
                instance_type=instance.name,
                iam_instance_profile=ec2.CfnLaunchTemplate.IamInstanceProfileProperty(arn=profile.attr_arn),
                network_interfaces=efa_network_interfaces(instance, security_group.security_group_id),
                metadata_options=ec2.CfnLaunchTemplate.MetadataOptionsProperty(
                    http_tokens="required",
                    http_endpoint="enabled",
                    http_put_response_hop_limit=1,
                ),
                block_device_mappings=[
                    ec2.CfnLaunchTemplate.BlockDeviceMappingProperty(
                        device_name=root_device_name(settings.ami_parameter),
                        ebs=ec2.CfnLaunchTemplate.EbsProperty(
                            volume_type="gp3",
                            volume_size=settings.root_volume_gib,
                            encrypted=True,
                            delete_on_termination=True,
                            iops=6000,
                            throughput=500,
                        ),
                    )
                ],
                ebs_optimized=True,
                monitoring=ec2.CfnLaunchTemplate.MonitoringProperty(enabled=True),
                instance_market_options=capacity.launch_template_market_options(),
                capacity_reservation_specification=capacity.launch_template_reservation(),
                user_data=Fn.base64(user_data.render()),
                tag_specifications=[
                    ec2.CfnLaunchTemplate.TagSpecificationProperty(
                        resource_type=kind,
                        tags=[CfnTag(key="Name", value=f"{Aws.STACK_NAME}-node")],
                    )
                    for kind in ("instance", "volume")
                ],
            ),
        )

        self.auto_scaling_group = autoscaling.CfnAutoScalingGroup(
            self,
            "AutoScalingGroup",
            auto_scaling_group_name=group_name,
            min_size=str(desired_capacity),
            max_size=str(desired_capacity),
            desired_capacity=str(desired_capacity),
            vpc_zone_identifier=[subnet.subnet_id],
            launch_template=autoscaling.CfnAutoScalingGroup.LaunchTemplateSpecificationProperty(
                launch_template_id=self.launch_template.ref,
                version=self.launch_template.attr_latest_version_number,
            ),
            placement_group=capacity.placement_group_name,
            capacity_reservation_specification=capacity.auto_scaling_reservation(),
            health_check_type="EC2",
            health_check_grace_period=900,  # bootstrap (RAID, Lustre, health gate) takes minutes
            metrics_collection=[
                autoscaling.CfnAutoScalingGroup.MetricsCollectionProperty(granularity="1Minute")
            ],
        )
        # A new launch template version (a new AMI, a code change in the bundle) applies to nodes launched
        # from then on; running nodes are never replaced by a deploy in the middle of a training run.
        self.auto_scaling_group.cfn_options.update_policy = CfnUpdatePolicy(
            auto_scaling_scheduled_action=CfnAutoScalingScheduledAction(
                ignore_unmodified_group_size_properties=True
            ),
        )

    @property
    def group_arn_pattern(self) -> str:
        # A group's ARN is arn:aws:autoscaling:REGION:ACCOUNT:autoScalingGroup:UUID:autoScalingGroupName/NAME
        # (Service Authorization Reference, Amazon EC2 Auto Scaling, resource type autoScalingGroup): a colon after
        # the resource type. The default ArnFormat puts a slash there, and the grants on it never matched.
        return Stack.of(self).format_arn(
            service="autoscaling",
            resource="autoScalingGroup",
            resource_name=f"*:autoScalingGroupName/{self.group_name}",
            arn_format=ArnFormat.COLON_RESOURCE_NAME,
        )

    def allow_object_download(self, *, bucket_name: str, object_key: str) -> None:
        """Let the nodes download one S3 object (the bundle, at boot) and nothing else in its bucket."""
        self.role.add_to_principal_policy(
            iam.PolicyStatement(
                actions=["s3:GetObject"],
                resources=[Stack.of(self).format_arn(
                    service="s3", region="", account="", resource=bucket_name, resource_name=object_key
                )],
            )
        )

    def allow_job_table_read(self, *, table_arn: str) -> None:
        """Let the nodes read one item of the job table at a time: a job's `start` checks that the table holds
        its attempt as the job's current one (node_bootstrap/jobs/job_table.py). GetItem only: no query, no
        scan, no write."""
        self.role.add_to_principal_policy(
            iam.PolicyStatement(sid="JobTableGetItem", actions=["dynamodb:GetItem"], resources=[table_arn])
        )

    def _grant_node_permissions(self, log_group_arn: str) -> None:
        statements = [
            # The SSM Agent: Run Command (jobs) and Session Manager. These actions take no resource ARN, or
            # (UpdateInstanceInformation) the caller's own instance; AWS documents them with Resource "*".
            iam.PolicyStatement(actions=SSM_AGENT_ACTIONS, resources=["*"]),
            # The CloudWatch agent ships bootstrap and job logs into the cluster's log group only.
            iam.PolicyStatement(
                actions=["logs:CreateLogStream", "logs:PutLogEvents", "logs:DescribeLogStreams"],
                resources=[log_group_arn, f"{log_group_arn}:log-stream:*"],
            ),
            # PutMetricData has no resource-level permissions; the namespace condition scopes it.
            iam.PolicyStatement(
                actions=["cloudwatch:PutMetricData"],
                resources=["*"],
                conditions={"StringEquals": {"cloudwatch:namespace": CLOUDWATCH_NAMESPACES}},
            ),
            # Bootstrap reads its own tags (DescribeTags has no resource-level permissions).
            iam.PolicyStatement(actions=["ec2:DescribeTags"], resources=["*"]),
            # Bootstrap sets and clears its readiness tags, and no others, on instances of its own group. IAM
            # cannot narrow CreateTags to the calling instance: ec2:SourceInstanceARN names the caller, and a
            # Resource must be an ARN, so "${ec2:SourceInstanceARN}" alone is rejected (cfn-lint E3510).
            iam.PolicyStatement(
                actions=["ec2:CreateTags", "ec2:DeleteTags"],
                resources=[Stack.of(self).format_arn(service="ec2", resource="instance", resource_name="*")],
                conditions={
                    "StringEquals": {"aws:ResourceTag/aws:autoscaling:groupName": self.group_name},
                    "ForAllValues:StringEquals": {"aws:TagKeys": BOOTSTRAP_TAG_KEYS},
                    # ForAllValues holds for an empty key set too, and DeleteTags without keys deletes every tag.
                    "Null": {"aws:TagKeys": "false"},
                },
            ),
            # The node health monitor tags its own instance unhealthy with the reason: create only, these keys
            # only, instances of this group only.
            iam.PolicyStatement(
                actions=["ec2:CreateTags"],
                resources=[Stack.of(self).format_arn(service="ec2", resource="instance", resource_name="*")],
                conditions={
                    "StringEquals": {"aws:ResourceTag/aws:autoscaling:groupName": self.group_name},
                    "ForAllValues:StringEquals": {"aws:TagKeys": HEALTH_TAG_KEYS},
                    "Null": {"aws:TagKeys": "false"},  # as above: never an empty key set
                },
            ),
            # A node that fails its health gate, or that its health monitor finds unhealthy later, marks itself
            # Unhealthy so the group replaces it. The action's only resource is the group (the instance id is a
            # request parameter IAM cannot match), so this allows any instance of this group, and no other group.
            iam.PolicyStatement(
                actions=["autoscaling:SetInstanceHealth"], resources=[self.group_arn_pattern]
            ),
            # Protected mode: nodes record failures and successes as group tags (only these keys) and, after
            # too many failures in a row, suspend the group's ReplaceUnhealthy process.
            iam.PolicyStatement(
                actions=["autoscaling:CreateOrUpdateTags", "autoscaling:DeleteTags"],
                resources=[self.group_arn_pattern],
                conditions={"ForAllValues:StringLike": {"aws:TagKeys": GROUP_TAG_KEY_PATTERNS}},
            ),
            iam.PolicyStatement(actions=["autoscaling:SuspendProcesses"], resources=[self.group_arn_pattern]),
            # DescribeTags has no resource-level permissions (Service Authorization Reference, Auto Scaling).
            iam.PolicyStatement(actions=["autoscaling:DescribeTags"], resources=["*"]),
        ]
        for statement in statements:
            self.role.add_to_principal_policy(statement)
