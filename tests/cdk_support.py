"""Helpers for the CDK tests: settings built the way app.py builds them, synthesized stack variants."""

from __future__ import annotations

import datetime as dt
import json
from pathlib import Path
from typing import Any

REPO_ROOT = Path(__file__).resolve().parent.parent
# Reservation dates in tests are judged against this clock, so they never expire.
TEST_NOW = dt.datetime(2026, 11, 20, 12, 0, tzinfo=dt.UTC)


def default_context() -> dict[str, Any]:
    return json.loads((REPO_ROOT / "cdk.json").read_text())["context"]


def feature_flags() -> dict[str, Any]:
    """cdk.json's CDK feature flags: tests build their Apps with them, as the CLI does."""
    return {k: v for k, v in default_context().items() if k.startswith("@")}


def build_settings(**overrides: Any):
    """ClusterSettings from cdk.json's defaults plus `overrides` (strings, as `-c key=value` would give)."""
    from cluster_spec.context import load_settings

    context = {**default_context(), **overrides}
    return load_settings(context.get, all_keys=context, now=TEST_NOW)


class SynthesizedStack:
    """One synthesized TrainingClusterStack variant: the stack, its assertions Template, and its JSON."""

    def __init__(self, overrides: dict[str, str], outdir: Path) -> None:
        import aws_cdk as cdk
        from aws_cdk.assertions import Template
        from cdk_nag import AwsSolutionsChecks

        from stacks.training_cluster_stack import STACK_NAME, TrainingClusterStack

        self.settings = build_settings(**overrides)
        self.app = cdk.App(outdir=str(outdir), context=feature_flags())
        self.stack = TrainingClusterStack(
            self.app, STACK_NAME, settings=self.settings, env=cdk.Environment(region=self.settings.region)
        )
        cdk.Aspects.of(self.app).add(AwsSolutionsChecks(verbose=True))
        self.template = Template.from_stack(self.stack)
        self.template_json = self.template.to_json()
        self.template_path = outdir / "template.json"
        self.template_path.write_text(json.dumps(self.template_json, indent=1))

    def resources(self, resource_type: str) -> dict[str, dict]:
        return {k: v for k, v in self.template_json["Resources"].items() if v["Type"] == resource_type}

    def only(self, resource_type: str) -> dict:
        found = list(self.resources(resource_type).values())
        assert len(found) == 1, f"expected one {resource_type}, found {len(found)}"
        return found[0]["Properties"]


# The variants every whole-stack test runs over: each capacity mode and each EFA layout family.
STACK_VARIANTS: dict[str, dict[str, str]] = {
    "default-p5-on-demand": {},
    "odcr-created": {
        "capacityMode": "odcr",
        "reservationEndDate": "2027-03-01T00:00:00Z",
        "nodeCount": "4",
        "spareNodes": "1",
        "alarmEmail": "ml-platform@example.com",
    },
    "odcr-existing": {
        "capacityMode": "odcr",
        "capacityReservationId": "cr-0123456789abcdef0",
        "reservationInstanceCount": "4",
        "dataBucketName": "team-training-data",
    },
    "capacity-block-p5en": {
        "capacityMode": "capacity-block",
        "capacityReservationId": "cr-0fedcba9876543210",
        "instanceType": "p5en.48xlarge",
        "availabilityZone": "us-east-1d",
        "reservationStartDate": "2027-01-05T11:30:00Z",
        "reservationEndDate": "2027-01-12T11:30:00Z",
        "budgetUsd": "250000",
        "metricsIntervalSeconds": "30",
    },
    "p4d-isolated": {
        "instanceType": "p4d.24xlarge",
        "natGateway": "false",
        "fsxStorageGiB": "1200",
        "fsxThroughputPerTiB": "125",
        "region": "us-west-2",
        "availabilityZone": "us-west-2b",
    },
    "p6-b200-efa-fsx": {"instanceType": "p6-b200.48xlarge", "nodeCount": "1", "fsxEfaEnabled": "true",
                        "idleGpuAlarm": "false", "stragglerAlarm": "false", "efaErrorAlarm": "false",
                        "maxJobRestarts": "0"},
}


def bare_stack(region: str = "us-east-1"):
    """An empty Stack to build one construct in, bound to a region like the real stack."""
    import aws_cdk as cdk

    return cdk.Stack(cdk.App(context=feature_flags()), "Test", env=cdk.Environment(region=region))


def resources_of(template, resource_type: str) -> list[dict]:
    """The Properties of every resource of `resource_type` in an assertions Template."""
    return [r.get("Properties", {}) for r in template.find_resources(resource_type).values()]
