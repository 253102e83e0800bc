"""CapacityPurchaser: buying Capacity Blocks is a policy of its own, apart from the operator policy."""

import aws_cdk as cdk
import pytest
from aws_cdk.assertions import Template

from cluster_constructs.capacity_purchase import CapacityPurchaser


@pytest.fixture(scope="module")
def built():
    stack = cdk.Stack(cdk.App(), "TrainingClusterStack",
                      env=cdk.Environment(account="111122223333", region="us-east-1"))
    purchaser = CapacityPurchaser(stack, "CapacityPurchaser")
    return stack, purchaser, Template.from_stack(stack)


def test_the_purchaser_policy_may_buy_capacity_blocks_and_nothing_else(built):
    stack, purchaser, template = built
    (policy,) = template.find_resources("AWS::IAM::ManagedPolicy").values()
    assert policy["Properties"]["PolicyDocument"]["Statement"] == [{
        "Sid": "PurchaseCapacityBlocks",
        "Effect": "Allow",
        "Action": "ec2:PurchaseCapacityBlock",
        "Resource": {"Fn::Join": ["", [
            "arn:", {"Ref": "AWS::Partition"}, ":ec2:us-east-1:111122223333:capacity-reservation/*"]]},
    }]
    assert "Roles" not in policy["Properties"] and "Users" not in policy["Properties"]  # attached by people
    assert stack.resolve(purchaser.policy.managed_policy_arn) == {"Ref": stack.get_logical_id(
        purchaser.policy.node.default_child)}
