#!/usr/bin/env python3
"""CDK entry point: settings from context -> TrainingClusterStack.

Synthesis is offline: no AWS credentials, no context lookups. The stack is bound to the configured region and
left account-agnostic (CloudFormation fills in the account at deploy time).
"""

import sys

import aws_cdk as cdk
from cdk_nag import AwsSolutionsChecks

from cluster_spec.context import load_settings
from cluster_spec.values import SettingsError
from stacks.training_cluster_stack import STACK_NAME, TrainingClusterStack


def main() -> None:
    app = cdk.App()
    try:
        settings = load_settings(app.node.try_get_context, all_keys=app.node.get_all_context())
    except SettingsError as error:
        # One line, no traceback: the CDK CLI shows it and exits non-zero.
        print(f"Invalid setting: {error}", file=sys.stderr)
        sys.exit(1)
    TrainingClusterStack(
        app,
        STACK_NAME,
        settings=settings,
        env=cdk.Environment(region=settings.region),
        description="P5 training cluster: EFA nodes, FSx for Lustre, capacity reservations (p5-training-cluster)",
    )
    # cdk-nag on every synth: a finding without a reasoned suppression (stacks/nag_suppressions.py) is an error.
    cdk.Aspects.of(app).add(AwsSolutionsChecks())
    app.synth()


if __name__ == "__main__":
    main()
