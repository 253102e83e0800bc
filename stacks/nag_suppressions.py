"""cdk-nag AwsSolutions suppressions: every one in this file, each with the reason a reviewer would accept.

Suppressions are attached to construct paths (construct ids are an API here) and, for IAM5, to the exact
wildcard they accept, so a new wildcard elsewhere still fails the nag test.
"""

from __future__ import annotations

import re

from aws_cdk import Stack
from cdk_nag import NagPackSuppression, NagSuppressions, RegexAppliesTo

_BUCKET_OBJECTS = RegexAppliesTo(regex=r"/^Resource::<Storage(Data|Checkpoint)Bucket[0-9A-F]{8}\.Arn>\/\*$/")
_ASSET_OBJECTS = RegexAppliesTo(regex=r"/^Resource::arn:[^:]+:s3:::cdk-[a-z0-9]+-assets-.*\/\*$/")
_S3_GRANT_ACTIONS = RegexAppliesTo(regex=r"/^Action::s3:(GetBucket|GetObject|List|Abort|DeleteObject)\*$/")


def _imported_bucket_objects(stack: Stack) -> list[RegexAppliesTo]:
    storage = stack.settings.storage  # type: ignore[attr-defined]
    names = [re.escape(n) for n in (storage.data_bucket_name, storage.checkpoint_bucket_name) if n]
    if not names:
        return []
    return [RegexAppliesTo(regex=rf"/^Resource::arn:[^:]+:s3:::({'|'.join(names)})\/\*$/")]


def _node_role_suppressions(stack: Stack) -> None:
    path = f"/{stack.stack_name}/Nodes/Role"
    NagSuppressions.add_resource_suppressions_by_path(
        stack,
        f"{path}/Resource",
        [
            NagPackSuppression(
                id="AwsSolutions-IAM4",
                reason="AmazonSSMManagedInstanceCore is the AWS-maintained minimum for the SSM agent; jobs reach the "
                "nodes only through SSM Run Command (no SSH, no public IPs).",
                applies_to=["Policy::arn:<AWS::Partition>:iam::aws:policy/AmazonSSMManagedInstanceCore"],
            ),
        ],
    )
    NagSuppressions.add_resource_suppressions_by_path(
        stack,
        f"{path}/DefaultPolicy/Resource",
        [
            NagPackSuppression(
                id="AwsSolutions-IAM5",
                reason="Log streams are created at run time per instance and per job; the grant is limited to the "
                "cluster's own log group.",
                applies_to=[
                    RegexAppliesTo(
                        regex=r"/^Resource::<ObservabilityLogGroup[0-9A-F]{8}\.Arn>:log-stream:\*$/"
                    )
                ],
            ),
            NagPackSuppression(
                id="AwsSolutions-IAM5",
                reason="cloudwatch:PutMetricData and ec2:DescribeTags have no resource-level permissions; a "
                "cloudwatch:namespace condition limits metrics to the agent's and the trainer's namespaces, "
                "and DescribeTags only reads.",
                applies_to=["Resource::*"],
            ),
            NagPackSuppression(
                id="AwsSolutions-IAM5",
                reason="Instance ids are not known at deploy time; conditions limit ec2:CreateTags to instances of "
                "this cluster's Auto Scaling group and to the two bootstrap readiness tag keys.",
                applies_to=[RegexAppliesTo(regex=r"/^Resource::arn:[^:]+:ec2:.*:instance\/\*$/")],
            ),
            NagPackSuppression(
                id="AwsSolutions-IAM5",
                reason="An Auto Scaling group ARN contains a generated id; the group name part is fixed, so a node "
                "can only set health in its own group.",
                applies_to=[
                    RegexAppliesTo(
                        regex=r"/^Resource::arn:[^:]+:autoscaling:.*:autoScalingGroup\/"
                        r"\*:autoScalingGroupName\/.*-nodes$/"
                    )
                ],
            ),
            NagPackSuppression(
                id="AwsSolutions-IAM5",
                reason="CDK grant_read/grant_read_write action groups on the cluster's own data and checkpoint "
                "buckets (created or imported by name) and on the node bundle asset object: nodes read data, "
                "write checkpoints, and download their bootstrap bundle.",
                applies_to=[
                    _S3_GRANT_ACTIONS,
                    _BUCKET_OBJECTS,
                    _ASSET_OBJECTS,
                    *_imported_bucket_objects(stack),
                ],
            ),
        ],
    )


def _operator_policy_suppressions(stack: Stack) -> None:
    NagSuppressions.add_resource_suppressions_by_path(
        stack,
        f"/{stack.stack_name}/Jobs/OperatorPolicy/Resource",
        [
            NagPackSuppression(
                id="AwsSolutions-IAM5",
                reason="SSM command reads, Auto Scaling/EC2 Describe*, Capacity Block offerings, Service Quotas "
                "reads and CloudWatch GetMetricData/ListMetrics take no resource ARN (Service Authorization "
                "Reference); they are read-only.",
                applies_to=["Resource::*"],
            ),
            NagPackSuppression(
                id="AwsSolutions-IAM5",
                reason="ssm:SendCommand to instances is limited by condition to those tagged with this cluster's "
                "Auto Scaling group name; instance ids change as nodes are replaced.",
                applies_to=[RegexAppliesTo(regex=r"/^Resource::arn:[^:]+:ec2:.*:instance\/\*$/")],
            ),
            NagPackSuppression(
                id="AwsSolutions-IAM5",
                reason="ec2:PurchaseCapacityBlock creates a reservation whose id does not exist before the purchase.",
                applies_to=[RegexAppliesTo(regex=r"/^Resource::arn:[^:]+:ec2:.*:capacity-reservation\/\*$/")],
            ),
            NagPackSuppression(
                id="AwsSolutions-IAM5",
                reason="A stack ARN ends in a generated id; the stack name part is fixed to this stack.",
                applies_to=[RegexAppliesTo(regex=r"/^Resource::arn:[^:]+:cloudformation:.*:stack\/.*\/\*$/")],
            ),
        ],
    )


def apply_nag_suppressions(stack: Stack) -> None:
    _node_role_suppressions(stack)
    _operator_policy_suppressions(stack)
