"""One call in several regions at once, each region's failure reported on its own line instead of ending the
command: a region where the caller lacks a permission, or an opt-in region the account has not enabled,
must not hide the answers of the others.

What a disabled opt-in region answers: EC2 rejects the request with AuthFailure ("AWS was not able to
validate the provided access credentials", HTTP 401), the same code as bad credentials; regions launched
after March 20, 2019 are opt-in (AWS Account Management guide, "Enable or disable AWS Regions in your
account"). So AuthFailure in one region while others answer is reported as a region to enable.
"""

from __future__ import annotations

import re
from collections.abc import Callable, Sequence
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from typing import Any, Generic, TypeVar

import botocore.exceptions

from cluster_aws.errors import (
    ACCESS_DENIED_CODES,
    EXIT_ACCESS,
    EXIT_CREDENTIALS,
    EXIT_FAILED,
    EXIT_USAGE,
    ClusterctlError,
    describe_aws_error,
)
from cluster_aws.session import AwsContext

T = TypeVar("T")
REGION_CODE = re.compile(r"^[a-z]{2}(-[a-z]+)+-[0-9]+$")  # us-east-1, ap-southeast-5, us-gov-west-1
MAX_PARALLEL_REGIONS = 8  # threads; each call is I/O-bound


@dataclass(frozen=True)
class RegionResult(Generic[T]):
    region: str
    value: T | None  # None when the region failed
    error: str = ""  # one line when it failed
    exit_code: int = 0  # what the error would exit with on its own

    @property
    def ok(self) -> bool:
        return not self.error


def parse_regions(text: str, option: str = "--regions") -> tuple[str, ...]:
    """'us-east-1, us-west-2' -> ('us-east-1', 'us-west-2'), in order, without repeats."""
    regions = tuple(dict.fromkeys(part.strip() for part in text.split(",") if part.strip()))
    bad = [r for r in regions if not REGION_CODE.fullmatch(r)]
    if not regions or bad:
        raise ClusterctlError(
            f"{option}={text!r}: allowed: comma-separated region codes, e.g. us-east-1,us-west-2", EXIT_USAGE
        )
    return regions


def regional_client(context: AwsContext, service: str, region: str) -> Any:
    """A client of `service` in `region` from the context's session; cached in context.clients under
    "service@region", where tests put stubbed clients."""
    key = f"{service}@{region}"
    if key not in context.clients:
        context.clients[key] = context.session.client(service, region_name=region)
    return context.clients[key]


def across_regions(
    context: AwsContext, service: str, regions: Sequence[str], call: Callable[[Any, str], T]
) -> list[RegionResult[T]]:
    """`call(client, region)` in every region in parallel; results in the order of `regions`. AWS errors
    become that region's error line; anything else is a bug and propagates."""
    # Clients are made here, in this thread: boto3 sessions are not thread-safe, clients are.
    clients = {region: regional_client(context, service, region) for region in regions}
    with ThreadPoolExecutor(max_workers=min(len(regions), MAX_PARALLEL_REGIONS)) as pool:
        futures = {region: pool.submit(call, clients[region], region) for region in regions}
    results: list[RegionResult[T]] = []
    for region in regions:
        try:
            results.append(RegionResult(region, futures[region].result()))
        except Exception as error:  # noqa: BLE001 - mapped below, or re-raised
            message, code = describe_region_error(error, region)
            results.append(RegionResult(region, None, message, code))
    return results


def describe_region_error(error: Exception, region: str) -> tuple[str, int]:
    """One line and an exit code for an AWS error in one region of several; other errors are re-raised."""
    if isinstance(error, botocore.exceptions.ClientError):
        code = error.response.get("Error", {}).get("Code", "")
        message = error.response.get("Error", {}).get("Message", "") or code
        operation = error.operation_name
        if code == "AuthFailure":
            return (
                f"{operation}: AuthFailure: {message} (an opt-in region not enabled for this account answers "
                "so; enable it or check with `aws account list-regions`)",
                EXIT_CREDENTIALS,
            )
        if code == "OptInRequired":
            return f"{operation}: OptInRequired: {message} (the account is not subscribed here)", EXIT_ACCESS
        if code in ACCESS_DENIED_CODES:
            return f"access denied: {operation}: {message}", EXIT_ACCESS
    mapped = describe_aws_error(error, region)
    if mapped is None:
        raise error
    return str(mapped), mapped.exit_code


def exit_code_of(results: Sequence[RegionResult[Any]]) -> int:
    """0 when any region answered; else the first region's error code (every region failed)."""
    if any(r.ok for r in results):
        return 0
    return results[0].exit_code if results else EXIT_FAILED
