"""checkov's findings on the template that are accepted, each with its reason, as CloudFormation metadata.

`make checkov` scans the synthesized default template; checkov honours a resource's
`Metadata: {checkov: {skip: [{id, comment}]}}`, so an accepted finding is skipped on that one resource only and
the same check still fails anywhere else. docs/security.md lists the same exceptions (a test pins the two
together). Keys are construct paths below the stack (construct ids are an API here).
"""

from __future__ import annotations

from aws_cdk import CfnResource, Stack

# CDK's own custom resource that strips the default security group's rules (restrictDefaultSecurityGroup).
_RESTRICT_DEFAULT_SG_HANDLER = "Custom::VpcRestrictDefaultSGCustomResourceProvider/Handler"

CHECKOV_EXCEPTIONS: dict[str, list[tuple[str, str]]] = {
    "Observability/LogGroup": [
        (
            "CKV_AWS_158",
            "CloudWatch Logs encrypts every log group at rest; a customer managed key would have to outlive the "
            "retained group (it is kept after cdk destroy) and the logs hold bootstrap and training progress, "
            "no secrets.",
        )
    ],
    "Network/FlowLogs": [
        (
            "CKV_AWS_158",
            "VPC flow log group (rejected connections only), encrypted at rest by CloudWatch Logs; holds "
            "addresses and ports, no payload.",
        )
    ],
    "Observability/AlarmTopicKey": [
        (
            "CKV_AWS_33",
            "The wildcard principal is limited by conditions to the account's Auto Scaling service-linked role "
            "(aws:PrincipalArn) and kms:CallerAccount; naming that role as the principal fails in an account "
            "where it does not exist yet.",
        )
    ],
    "Storage/AccessLogs": [
        (
            "CKV_AWS_18",
            "This is the server access log bucket of the data and checkpoint buckets; logging it into itself "
            "would log its own log deliveries.",
        )
    ],
    "Nodes/Role/DefaultPolicy": [
        (
            "CKV_AWS_111",
            "The write actions on Resource * are the SSM Agent's (ssm:UpdateInstanceInformation, ssmmessages and "
            "ec2messages channel and message calls), which AWS documents with Resource *, and "
            "cloudwatch:PutMetricData, limited by a namespace condition; stacks/nag_suppressions.py lists them.",
        )
    ],
    "JobKeeper/LogGroup": [
        (
            "CKV_AWS_158",
            "The job keeper's log group, encrypted at rest by CloudWatch Logs; a customer managed key would have to "
            "outlive the retained group, and the logs hold the keeper's decisions (job ids, instance ids, reasons), "
            "no secrets.",
        )
    ],
    "JobKeeper/Table": [
        (
            "CKV_AWS_119",
            "The job table is encrypted at rest with the AWS managed key (aws/dynamodb). It holds job records "
            "(config text, node ids, steps, reasons), no secrets; a customer managed key would have to outlive "
            "the retained table and adds key policy upkeep for every reader.",
        )
    ],
    "JobKeeper/Function": [
        (
            "CKV_AWS_116",
            "The job keeper is level-triggered: a failed run is redone by the next one-minute tick from the "
            "world as it is then, so a dead-letter queue would only collect stale events. Its errors are in its "
            "log group.",
        ),
        (
            "CKV_AWS_117",
            "The job keeper calls only AWS APIs (DynamoDB, SSM, EC2, Auto Scaling, SNS) and reaches no resource "
            "inside the VPC; in the VPC it would need NAT or more endpoints for the same calls.",
        ),
        (
            "CKV_AWS_173",
            "The keeper's environment holds resource names and ARNs (table, document, group, topic), no secrets; "
            "Lambda encrypts it at rest with the AWS managed key.",
        ),
    ],
    _RESTRICT_DEFAULT_SG_HANDLER: [
        (
            "CKV_AWS_116",
            "CDK's own custom resource handler: CloudFormation invokes it on deploy and delete and waits for its "
            "answer, so a failure shows as a failed stack operation; a dead-letter queue adds nothing.",
        ),
        (
            "CKV_AWS_117",
            "CDK's own custom resource handler calls only the EC2 API (revoke the default security group's "
            "rules); it needs no VPC, and the private subnets have no route to the EC2 API without endpoints.",
        ),
        (
            "CKV_AWS_115",
            "CDK's own custom resource handler runs once per deploy or delete of this stack; a reserved "
            "concurrency limit protects nothing.",
        ),
    ],
}


def apply_checkov_exceptions(stack: Stack) -> None:
    for path, exceptions in CHECKOV_EXCEPTIONS.items():
        resource = _cfn_resource(stack, path)
        if resource is None:
            continue  # absent in this variant (e.g. a construct CDK creates only with some settings)
        resource.add_metadata(
            "checkov", {"skip": [{"id": check, "comment": comment} for check, comment in exceptions]}
        )


def _cfn_resource(stack: Stack, path: str) -> CfnResource | None:
    """The CloudFormation resource at `path`: the construct itself, or its default child."""
    construct = stack
    for part in path.split("/"):
        construct = construct.node.try_find_child(part)
        if construct is None:
            return None
    if not isinstance(construct, CfnResource):
        construct = construct.node.default_child
    return construct if isinstance(construct, CfnResource) else None
