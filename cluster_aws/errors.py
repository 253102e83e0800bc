"""AWS errors as one-line messages with documented exit codes: ClusterctlError and the mapping of botocore errors."""

from __future__ import annotations

import html
import re

import botocore.exceptions
import botocore.parsers

EXIT_OK = 0
EXIT_FAILED = 1  # the operation was refused or failed (nodes not ready, a job failed to start, ...)
EXIT_USAGE = 2  # invalid arguments (argparse uses 2 as well)
EXIT_CREDENTIALS = 3  # no, expired or invalid AWS credentials, or an unknown profile
EXIT_STACK = 4  # the stack is not deployed in this region, or lacks an output clusterctl needs
EXIT_ACCESS = 5  # access denied
EXIT_ENDPOINT = 6  # no region, an invalid region, or the service endpoint cannot be reached

# Both variables are read (cluster_aws.session.environment_region), in the AWS CLI's order.
NO_REGION = "no AWS region: pass --region, or set AWS_REGION or AWS_DEFAULT_REGION"

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


MESSAGE_LIMIT = 400  # characters of an error message: one line on a terminal, the start of anything longer
_HTML_TITLE = re.compile(r"<title[^>]*>(.*?)</title>", re.IGNORECASE | re.DOTALL)
_HTML_TAG = re.compile(r"<[^>]*>")


def one_line(text: str, limit: int = MESSAGE_LIMIT) -> str:
    """`text` as one line: whitespace runs (newlines included) become one space, cut at `limit`."""
    line = " ".join(str(text).split())
    return line if len(line) <= limit else line[: limit - 3].rstrip() + "..."


def looks_like_html(text: str) -> bool:
    """A proxy's or load balancer's error page rather than a message (AWS's XML errors start with <?xml or
    <ErrorResponse and are parsed by botocore, so they never get here)."""
    head = text.lstrip()[:300].lower()
    return head.startswith(("<!doctype html", "<html")) or "<body" in head or "<title" in head


def describe_html(text: str) -> str:
    """What an HTML error page says, in a few words: its <title>, else its text without tags."""
    title = _HTML_TITLE.search(text)
    return one_line(html.unescape(_HTML_TAG.sub(" ", title.group(1) if title else text)), 120)


class ClusterctlError(Exception):
    """A problem the user can act on: printed as one line on stderr, then exit with `exit_code`."""

    def __init__(self, message: str, exit_code: int = EXIT_FAILED) -> None:
        super().__init__(message)
        self.exit_code = exit_code


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
        return ClusterctlError(NO_REGION, EXIT_ENDPOINT)
    if isinstance(error, botocore.exceptions.InvalidRegionError):
        return ClusterctlError(f"invalid AWS region {error.kwargs.get('region_name')!r}", EXIT_ENDPOINT)
    if isinstance(error, botocore.exceptions.EndpointConnectionError):
        return ClusterctlError(
            f"cannot reach {error.kwargs.get('endpoint_url')}: is {region!r} a region where the service "
            "exists, and is the network up?",
            EXIT_ENDPOINT,
        )
    if isinstance(error, botocore.parsers.ResponseParserError):
        # botocore's message ends with the whole body it could not parse (an HTML page, over many lines).
        body = str(error).partition("\n")[2]
        what = f"an HTML page ({describe_html(body)})" if looks_like_html(body) else "something that is not XML"
        return ClusterctlError(
            f"the AWS endpoint answered with {what}, not an AWS response: is a proxy or firewall between "
            "you and AWS?",
            EXIT_ENDPOINT,
        )
    if isinstance(error, botocore.exceptions.ClientError):
        code = error.response.get("Error", {}).get("Code", "")
        message = error.response.get("Error", {}).get("Message", "")
        operation = error.operation_name
        status = error.response.get("ResponseMetadata", {}).get("HTTPStatusCode")
        if looks_like_html(message):
            # Not an AWS answer: botocore puts a body it cannot parse (a proxy's or firewall's error page)
            # into Message, newlines and all.
            return ClusterctlError(
                f"{operation} failed: HTTP {status or code}: the endpoint answered with an HTML page "
                f"({describe_html(message)}), not an AWS error: is a proxy or firewall between you and AWS?",
                EXIT_ENDPOINT,
            )
        if code in ACCESS_DENIED_CODES:
            # A purchase is the one call the operator policy does not grant (it cannot be undone).
            policy = ("the stack's capacity purchaser policy, the CapacityPurchaser Policy resource (stack output "
                      "CapacityPurchaserPolicyArn)" if operation == "PurchaseCapacityBlock" else
                      "the stack's operator policy, the JobRunner OperatorPolicy resource")
            return ClusterctlError(
                f"access denied: {operation}: {message or code} (attach {policy}, to your role)",
                EXIT_ACCESS,
            )
        if code in CREDENTIAL_CODES:
            return ClusterctlError(f"AWS credentials rejected: {code}: {message}", EXIT_CREDENTIALS)
        if code in ("", "Unknown") and message in ("", "Unknown"):
            # botocore found no AWS error in the body (a query-protocol service answered with HTML)
            return ClusterctlError(
                f"{operation} failed: HTTP {status} with no AWS error in the answer: is a proxy or firewall "
                "between you and AWS?",
                EXIT_ENDPOINT,
            )
        return ClusterctlError(one_line(f"{operation} failed: {code}: {message}"), EXIT_FAILED)
    return None
