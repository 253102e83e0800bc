"""One boto3 session per command or keeper round, and the clients made from it (a seam: tests put stubbed or
moto-backed clients in `clients`)."""

from __future__ import annotations

import os
from dataclasses import dataclass, field
from typing import Any

import boto3
import botocore.exceptions

from cluster_aws.errors import EXIT_CREDENTIALS, EXIT_ENDPOINT, NO_REGION, ClusterctlError


@dataclass
class AwsContext:
    """One boto3 session and the clients made from it (tests put stubbed clients in `clients`)."""

    session: boto3.Session
    clients: dict[str, Any] = field(default_factory=dict)

    @property
    def region(self) -> str | None:
        return self.session.region_name

    def client(self, service: str) -> Any:
        if service not in self.clients:
            if not self.region:
                raise ClusterctlError(NO_REGION, EXIT_ENDPOINT)
            self.clients[service] = self.session.client(service)
        return self.clients[service]


def environment_region() -> str | None:
    """The region the environment names, in the AWS CLI's order: AWS_REGION, then AWS_DEFAULT_REGION.

    boto3 reads only AWS_DEFAULT_REGION (and the profile's region); AWS_REGION is what the AWS CLI v2, the other
    SDKs and Lambda set, so a user with only AWS_REGION set would otherwise be told that no region is set.
    """
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION"):
        value = os.environ.get(name, "").strip()
        if value:
            return value
    return None


def build_context(region: str | None, profile: str | None) -> AwsContext:
    """A session for --region, else the environment's region (environment_region), else the profile's."""
    try:
        session = boto3.Session(region_name=region or environment_region(), profile_name=profile)
        # Checked here: with credentials in the environment botocore may not look the profile up at all.
        if profile and profile not in session.available_profiles:
            raise botocore.exceptions.ProfileNotFound(profile=profile)
    except botocore.exceptions.ProfileNotFound:
        raise ClusterctlError(
            f"AWS profile {profile!r} not found in ~/.aws/config", EXIT_CREDENTIALS
        ) from None
    return AwsContext(session)
