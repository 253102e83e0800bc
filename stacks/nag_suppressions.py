"""cdk-nag AwsSolutions suppressions: every one in this file, each with the reason a reviewer would accept.

Suppressions are attached to construct paths (construct ids are an API here) and, for IAM5, to the exact
wildcard they accept, so a new wildcard elsewhere still fails the nag test.
"""

from __future__ import annotations

from aws_cdk import Stack
from cdk_nag import NagPackSuppression, NagSuppressions, RegexAppliesTo


def _node_role_suppressions(stack: Stack) -> None:
    NagSuppressions.add_resource_suppressions_by_path(
        stack,
        f"/{stack.stack_name}/Nodes/Role/DefaultPolicy/Resource",
        [
            NagPackSuppression(
                id="AwsSolutions-IAM5",
                reason="The node role's wildcard log-stream grant: logs:CreateLogStream, PutLogEvents and "
                "DescribeLogStreams on any stream of the cluster's own log group (streams are named per instance and "
                "per job at run time); no other log group.",
                applies_to=[
                    RegexAppliesTo(
                        regex=r"/^Resource::<ObservabilityLogGroup[0-9A-F]{8}\.Arn>:log-stream:\*$/"
                    )
                ],
            ),
            NagPackSuppression(
                id="AwsSolutions-IAM5",
                reason="Resource * for actions with no resource-level permission: the SSM Agent's "
                "ssm:UpdateInstanceInformation, ssmmessages:Create/OpenControlChannel, Create/OpenDataChannel and "
                "ec2messages:AcknowledgeMessage, DeleteMessage, FailMessage, GetEndpoint, GetMessages, SendReply "
                "(Run Command and Session Manager only: no parameter, document or inventory access); "
                "cloudwatch:PutMetricData, limited by a cloudwatch:namespace condition to CWAgent and "
                "TrainingCluster; and ec2:DescribeTags and autoscaling:DescribeTags, which read the tags of any "
                "instance and any Auto Scaling group in the Region.",
                applies_to=["Resource::*"],
            ),
            NagPackSuppression(
                id="AwsSolutions-IAM5",
                reason="ec2:CreateTags and DeleteTags on any instance tagged aws:autoscaling:groupName=<this "
                "cluster's group> (condition), for the keys cluster:bootstrap and cluster:bootstrap-reason only: a "
                "node may set or clear those two tags on any node of its own group, not only on itself (IAM has no "
                "documented way to match the target instance to the caller's ec2:SourceInstanceARN).",
                applies_to=[RegexAppliesTo(regex=r"/^Resource::arn:[^:]+:ec2:.*:instance\/\*$/")],
            ),
            NagPackSuppression(
                id="AwsSolutions-IAM5",
                reason="On this cluster's Auto Scaling group only (the wildcard is the group ARN's generated id): "
                "autoscaling:SetInstanceHealth, so a node may mark any instance of its own group Unhealthy (the "
                "action's resource is the group: IAM cannot narrow it to the calling instance); "
                "autoscaling:SuspendProcesses, any process of its own group (protected mode suspends "
                "ReplaceUnhealthy); CreateOrUpdateTags and DeleteTags for the protected-mode tag keys only "
                "(aws:TagKeys condition). Nothing on another group.",
                applies_to=[
                    RegexAppliesTo(
                        regex=r"/^Resource::arn:[^:]+:autoscaling:.*:autoScalingGroup:"
                        r"\*:autoScalingGroupName\/.*-nodes$/"
                    )
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
                reason="Resource * for read-only actions that take no resource ARN: ssm:GetCommandInvocation, "
                "ListCommandInvocations and ListCommands (any command in the account and Region), "
                "autoscaling:DescribeAutoScalingGroups, ec2:DescribeInstances, DescribeInstanceTypes, "
                "DescribeCapacityReservations, DescribeCapacityBlockOfferings, DescribeSpotPriceHistory, "
                "pricing:GetProducts (public price lists), servicequotas:GetServiceQuota, "
                "GetAWSDefaultServiceQuota, cloudwatch:GetMetricData and ListMetrics.",
                applies_to=["Resource::*"],
            ),
            NagPackSuppression(
                id="AwsSolutions-IAM5",
                reason="ssm:SendCommand to any instance whose aws:autoscaling:groupName tag is this cluster's group "
                "(condition), and only with this stack's jobs document (a separate statement); instance ids "
                "change as nodes are replaced.",
                applies_to=[RegexAppliesTo(regex=r"/^Resource::arn:[^:]+:ec2:.*:instance\/\*$/")],
            ),
            NagPackSuppression(
                id="AwsSolutions-IAM5",
                reason="cloudformation:DescribeStacks on this stack's name with any stack id (the ARN ends in a "
                "generated id): reads its outputs, including those of a later redeploy under the same name.",
                applies_to=[RegexAppliesTo(regex=r"/^Resource::arn:[^:]+:cloudformation:.*:stack\/.*\/\*$/")],
            ),
        ],
    )


def _capacity_purchaser_suppressions(stack: Stack) -> None:
    NagSuppressions.add_resource_suppressions_by_path(
        stack,
        f"/{stack.stack_name}/CapacityPurchaser/Policy/Resource",
        [
            NagPackSuppression(
                id="AwsSolutions-IAM5",
                reason="ec2:PurchaseCapacityBlock on any capacity reservation of the account and Region, in a policy "
                "of its own (not the operator policy): whoever holds it can buy any Capacity Block offering, paid "
                "upfront and not cancellable (clusterctl asks first). The reservation id does not exist before the "
                "purchase, so no narrower ARN can be named.",
                applies_to=[RegexAppliesTo(regex=r"/^Resource::arn:[^:]+:ec2:.*:capacity-reservation\/\*$/")],
            ),
        ],
    )


def _job_keeper_suppressions(stack: Stack) -> None:
    NagSuppressions.add_resource_suppressions_by_path(
        stack,
        f"/{stack.stack_name}/JobKeeper/Role/DefaultPolicy/Resource",
        [
            NagPackSuppression(
                id="AwsSolutions-IAM5",
                reason="Resource * for read-only actions that take no resource ARN: ssm:GetCommandInvocation (the "
                "result of any command in the account and Region), "
                "autoscaling:DescribeAutoScalingGroups, ec2:DescribeInstances and "
                "ec2:DescribeCapacityReservations. The keeper's writes are all on named resources.",
                applies_to=["Resource::*"],
            ),
            NagPackSuppression(
                id="AwsSolutions-IAM5",
                reason="ssm:SendCommand to any instance whose aws:autoscaling:groupName tag is this cluster's group "
                "(condition), and only with this stack's jobs document (a separate statement): the keeper stops "
                "and restarts jobs on the cluster's nodes, whose ids change as nodes are replaced.",
                applies_to=[RegexAppliesTo(regex=r"/^Resource::arn:[^:]+:ec2:.*:instance\/\*$/")],
            ),
        ],
    )
    NagSuppressions.add_resource_suppressions_by_path(
        stack,
        f"/{stack.stack_name}/JobKeeper/Function/Resource",
        [
            NagPackSuppression(
                id="AwsSolutions-L1",
                reason="The keeper's runtime is pinned to Python 3.13 (supported by Lambda until 2029) on purpose: "
                "it is part of the code's contract and moves by a reviewed change, not whenever aws-cdk-lib "
                "learns of a newer runtime.",
            ),
        ],
    )


def apply_nag_suppressions(stack: Stack) -> None:
    _node_role_suppressions(stack)
    _operator_policy_suppressions(stack)
    _capacity_purchaser_suppressions(stack)
    _job_keeper_suppressions(stack)
