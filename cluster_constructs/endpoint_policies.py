"""The VPC endpoints' policies: what may pass each endpoint between the nodes and AWS.

An endpoint policy is a resource policy on the path itself: a request through the endpoint must be allowed by it
and by IAM (AWS PrivateLink Guide, "Control access to VPC endpoints using endpoint policies"). Without one an
endpoint passes anything, so code on a node holding another account's credentials could copy checkpoints to
that account's bucket through the S3 endpoint. Each policy here passes:

- S3 (gateway): the stack's buckets and the node bundle's object, for principals of the stack's account; and
  reads of the AWS-owned buckets the nodes' software installs from (anonymous dnf and apt requests, or the SSM
  Agent's): the Amazon Linux 2023 repositories, the SSM Agent's, and FSx's Lustre client repository for Ubuntu.
- Logs: the cluster's log group only (the CloudWatch agent and the health monitor write nothing else).
- Auto Scaling: the cluster's group, and the describes, which take no resource.
- SSM, SSM messages, EC2 messages, CloudWatch metrics, EC2: principals of the stack's account, any action (their
  calls take no resource the stack can name before the nodes exist: instance ids, command ids; the node role
  names the actions).

aws:PrincipalAccount is absent from anonymous requests, so the account statements never pass one.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import ArnFormat, Stack
from aws_cdk import aws_iam as iam

ACCOUNT_ONLY_ENDPOINTS = ("Ssm", "SsmMessages", "Ec2Messages", "Monitoring", "Ec2")


def _account(stack: Stack) -> dict[str, dict[str, str]]:
    return {"StringEquals": {"aws:PrincipalAccount": stack.account}}


def _s3_arn(stack: Stack, bucket: str, key: str | None = None) -> str:
    return stack.format_arn(service="s3", region="", account="", resource=bucket, resource_name=key)


def aws_owned_buckets(region: str) -> list[str]:
    """The AWS-owned buckets, by name pattern, that the nodes read from the Region's S3.

    - al2023-repos-<region>-<id>: the Amazon Linux 2023 repositories, which dnf reads from S3 in the node's
      Region (`dnf repolist -v` shows al2023-repos-<region>-de612dc2.s3.dualstack.<region>.amazonaws.com):
      the CloudWatch agent and the Lustre client are installed from them at boot (node_bootstrap/cloudwatch.py,
      lustre_client.py). The suffix is AWS's; a wildcard, so a new one does not break the nodes.
    - amazon-ssm-<region>, aws-ssm-<region>, <region>-birdwatcher-prod, aws-ssm-distributor-file-<region>,
      aws-ssm-document-attachments-<region>: what the SSM Agent reads for its own updates, the modules of
      AWS's documents and Distributor packages (Systems Manager User Guide, "SSM Agent communications with AWS
      managed S3 buckets"). Its Windows, macOS and patching buckets are left out: the nodes are Linux, and a
      node is replaced, not patched.
    - fsx-lustre-client-repo and fsx-lustre-client-repo-public-keys: the Lustre client's apt repository and
      its key on Ubuntu AMIs (node_bootstrap/lustre_client.py).
    """
    return [
        f"al2023-repos-{region}-*",
        f"amazon-ssm-{region}",
        f"aws-ssm-{region}",
        f"{region}-birdwatcher-prod",
        f"aws-ssm-distributor-file-{region}",
        f"aws-ssm-document-attachments-{region}",
        "fsx-lustre-client-repo",
        "fsx-lustre-client-repo-public-keys",
    ]


def aws_owned_s3_statements(stack: Stack) -> list[iam.PolicyStatement]:
    """Reads of the AWS-owned buckets, for anyone: dnf and apt sign nothing, and these buckets are public."""
    return [
        iam.PolicyStatement(
            sid="ReadAwsOwnedRepositories",
            principals=[iam.AnyPrincipal()],
            actions=["s3:GetObject"],
            resources=[_s3_arn(stack, bucket, "*") for bucket in aws_owned_buckets(stack.region)],
        )
    ]


def stack_s3_statements(
    stack: Stack, bucket_names: Sequence[str], object_arns: Sequence[str]
) -> list[iam.PolicyStatement]:
    """The stack's buckets, any action (IAM and the bucket policies decide; the nodes' role has none on them,
    and whether FSx's import and export use this endpoint is not documented, so they pass either way), and the
    single objects the nodes download, for principals of the stack's account."""
    buckets = [arn for name in bucket_names for arn in (_s3_arn(stack, name), _s3_arn(stack, name, "*"))]
    return [
        iam.PolicyStatement(
            sid="ClusterBuckets",
            principals=[iam.AnyPrincipal()],
            actions=["s3:*"],
            resources=buckets,
            conditions=_account(stack),
        ),
        iam.PolicyStatement(
            sid="NodeDownloads",
            principals=[iam.AnyPrincipal()],
            actions=["s3:GetObject"],
            resources=list(object_arns),
            conditions=_account(stack),
        ),
    ]


def job_table_statements(stack: Stack, table_arn: str) -> list[iam.PolicyStatement]:
    """The DynamoDB gateway endpoint: one read of the job table, for principals of the stack's account. A node's
    `start` reads its job's item there (node_bootstrap/jobs/job_table.py); nothing else in the nodes' subnets
    uses DynamoDB, so nothing else passes."""
    return [
        iam.PolicyStatement(
            sid="JobTableGetItem",
            principals=[iam.AnyPrincipal()],
            actions=["dynamodb:GetItem"],
            resources=[table_arn],
            conditions=_account(stack),
        )
    ]


def interface_statements(
    stack: Stack, endpoint: str, *, log_group_name: str, auto_scaling_group_name: str
) -> list[iam.PolicyStatement]:
    """The policy statements of the interface endpoint named `endpoint` (ClusterNetwork's INTERFACE_ENDPOINTS)."""
    if endpoint == "Logs":
        group = stack.format_arn(service="logs", resource="log-group", resource_name=log_group_name,
                                 arn_format=ArnFormat.COLON_RESOURCE_NAME)
        # The group itself and everything under it (its streams: log-group:<name>:log-stream:<stream>).
        return [iam.PolicyStatement(sid="ClusterLogGroup", principals=[iam.AnyPrincipal()], actions=["logs:*"],
                                    resources=[group, f"{group}:*"], conditions=_account(stack))]
    if endpoint == "AutoScaling":
        # A group's ARN is autoScalingGroup:<uuid>:autoScalingGroupName/<name>: a colon after the resource type.
        group = stack.format_arn(service="autoscaling", resource="autoScalingGroup",
                                 resource_name=f"*:autoScalingGroupName/{auto_scaling_group_name}",
                                 arn_format=ArnFormat.COLON_RESOURCE_NAME)
        return [
            iam.PolicyStatement(sid="ClusterGroup", principals=[iam.AnyPrincipal()], actions=["autoscaling:*"],
                                resources=[group], conditions=_account(stack)),
            # DescribeTags and the other describes take no resource (Service Authorization Reference, Amazon EC2
            # Auto Scaling).
            iam.PolicyStatement(sid="Describes", principals=[iam.AnyPrincipal()], actions=["autoscaling:Describe*"],
                                resources=["*"], conditions=_account(stack)),
        ]
    if endpoint in ACCOUNT_ONLY_ENDPOINTS:
        return [iam.PolicyStatement(sid="AccountPrincipals", principals=[iam.AnyPrincipal()], actions=["*"],
                                    resources=["*"], conditions=_account(stack))]
    raise ValueError(f"interface endpoint {endpoint!r} has no policy here: add one to endpoint_policies.py")
