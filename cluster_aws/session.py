"""One boto3 session per command or keeper round, and the clients made from it (a seam: tests put stubbed or
moto-backed clients in `clients`)."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import boto3
import botocore.exceptions

from cluster_aws.errors import EXIT_CREDENTIALS, EXIT_ENDPOINT, ClusterctlError


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
                raise ClusterctlError("no AWS region: pass --region or set AWS_REGION", EXIT_ENDPOINT)
            self.clients[service] = self.session.client(service)
        return self.clients[service]


def build_context(region: str | None, profile: str | None) -> AwsContext:
    try:
        session = boto3.Session(region_name=region, profile_name=profile)
        # Checked here: with credentials in the environment botocore may not look the profile up at all.
        if profile and profile not in session.available_profiles:
            raise botocore.exceptions.ProfileNotFound(profile=profile)
    except botocore.exceptions.ProfileNotFound:
        raise ClusterctlError(
            f"AWS profile {profile!r} not found in ~/.aws/config", EXIT_CREDENTIALS
        ) from None
    return AwsContext(session)
