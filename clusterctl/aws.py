"""AWS session, clients and the mapping of AWS errors to one-line messages with documented exit codes."""

from __future__ import annotations

from dataclasses import dataclass, field
from typing import Any

import boto3
import botocore.exceptions

EXIT_OK = 0
EXIT_FAILED = 1  # the operation was refused or failed (nodes not ready, a job failed to start, ...)
EXIT_USAGE = 2  # invalid arguments (argparse uses 2 as well)
EXIT_CREDENTIALS = 3  # no, expired or invalid AWS credentials, or an unknown profile
EXIT_STACK = 4  # the stack is not deployed in this region, or lacks an output clusterctl needs
EXIT_ACCESS = 5  # access denied
EXIT_ENDPOINT = 6  # no region, an invalid region, or the service endpoint cannot be reached

EXIT_CODES_HELP = (
    "exit codes: 0 ok; 1 refused or failed (e.g. nodes not ready, a node failed to start the job); "
    "2 invalid arguments; 3 no or invalid AWS credentials; 4 stack not deployed in the region; "
    "5 access denied; 6 no or invalid region, or AWS endpoint unreachable"
)

ACCESS_DENIED_CODES = {
    "AccessDenied",
    "AccessDeniedException",
    "UnauthorizedOperation",
    "AuthorizationError",
    "UnauthorizedAccess",
}
CREDENTIAL_CODES = {
    "ExpiredToken",
    "ExpiredTokenException",
    "InvalidClientTokenId",
    "UnrecognizedClientException",
    "SignatureDoesNotMatch",
    "AuthFailure",
    "InvalidAccessKeyId",
}


class ClusterctlError(Exception):
    """A problem the user can act on: printed as one line on stderr, then exit with `exit_code`."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


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


def describe_aws_error(error: Exception, region: str | None) -> ClusterctlError | None:
    """The one-line message and exit code for an AWS error, or None for errors that are bugs."""
    if isinstance(error, ClusterctlError):
        return error
    if isinstance(
        error, botocore.exceptions.NoCredentialsError | botocore.exceptions.PartialCredentialsError
    ):
        return ClusterctlError(
            "no AWS credentials: run `aws configure` or `aws sso login`, pass --profile, or set AWS_PROFILE",
            EXIT_CREDENTIALS,
        )
    if isinstance(error, botocore.exceptions.TokenRetrievalError | botocore.exceptions.SSOError):
        return ClusterctlError(
            f"AWS credentials could not be refreshed: {error} (run `aws sso login`)", EXIT_CREDENTIALS
        )
    if isinstance(error, botocore.exceptions.NoRegionError):
        return ClusterctlError("no AWS region: pass --region or set AWS_REGION", EXIT_ENDPOINT)
    if isinstance(error, botocore.exceptions.InvalidRegionError):
        return ClusterctlError(f"invalid AWS region {error.kwargs.get('region_name')!r}", EXIT_ENDPOINT)
    if isinstance(error, botocore.exceptions.EndpointConnectionError):
        return ClusterctlError(
            f"cannot reach {error.kwargs.get('endpoint_url')}: is {region!r} a region where the service "
            "exists, and is the network up?",
            EXIT_ENDPOINT,
        )
    if isinstance(error, botocore.exceptions.ClientError):
        code = error.response.get("Error", {}).get("Code", "")
        message = error.response.get("Error", {}).get("Message", "")
        operation = error.operation_name
        if code in ACCESS_DENIED_CODES:
            return ClusterctlError(
                f"access denied: {operation}: {message or code} (attach the stack's operator policy, the "
                "JobRunner OperatorPolicy resource, to your role)",
                EXIT_ACCESS,
            )
        if code in CREDENTIAL_CODES:
            return ClusterctlError(f"AWS credentials rejected: {code}: {message}", EXIT_CREDENTIALS)
        return ClusterctlError(f"{operation} failed: {code}: {message}", EXIT_FAILED)
    return None
