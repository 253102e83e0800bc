"""CapacityPurchaser: the managed policy that may buy Capacity Blocks for ML, kept apart from the operator policy.

A Capacity Block is paid upfront when it is bought ("The price of a Capacity Block offering is charged up front",
EC2 User Guide, "Extend Capacity Blocks") and cannot be cancelled ("You can't modify or cancel a Capacity
Block", EC2 User Guide, "Cancel a Capacity Reservation"), and IAM has no condition that caps what a purchase
costs. So buying is
not part of operating the cluster: the operator policy (cluster_constructs/jobs.py) may look at offerings, and
only an identity that also holds this policy (`CapacityPurchaserPolicyArn`) may buy one (`clusterctl capacity
purchase`). Attach it to the few people who may spend that money.
"""

from __future__ import annotations

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from constructs import Construct

PURCHASE_ACTIONS = ("ec2:PurchaseCapacityBlock",)


class CapacityPurchaser(Construct):
    """`policy`: the managed policy with ec2:PurchaseCapacityBlock, and nothing else.

    Construct ids are an API: renaming `Policy` replaces the managed policy, and its ARN with it.
    """

    def __init__(self, scope: Construct, construct_id: str) -> None:
        super().__init__(scope, construct_id)
        # The reservation a purchase creates has no id before it exists, so the resource is any capacity
        # reservation of the account and Region (Service Authorization Reference, Amazon EC2:
        # PurchaseCapacityBlock on capacity-reservation).
        capacity_reservation_arn = Stack.of(self).format_arn(
            service="ec2", resource="capacity-reservation", resource_name="*"
        )
        self.policy = iam.ManagedPolicy(
            self,
            "Policy",
            description="clusterctl capacity purchase: buy Capacity Blocks for ML (paid upfront, not refundable)",
            statements=[
                iam.PolicyStatement(
                    sid="PurchaseCapacityBlocks",
                    actions=list(PURCHASE_ACTIONS),
                    resources=[capacity_reservation_arn],
                )
            ],
        )
