"""One command to many nodes through SSM Run Command: send in batches of 50, wait for every node's answer,
and read the JSON object node_bootstrap.jobs prints."""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from typing import Any

import botocore.exceptions

SEND_BATCH = 50  # ssm:SendCommand takes at most 50 InstanceIds (SSM API reference, SendCommand)


# The version CloudFormation deployed: the document's default version. $LATEST would run any newer version
# someone created with ssm:UpdateDocument outside the stack, before anyone set it as the default.
DOCUMENT_VERSION = "$DEFAULT"


POLL_SECONDS = 2.0


TERMINAL_STATUSES = {
    "Success",
    "Failed",
    "Cancelled",
    "TimedOut",
    "DeliveryTimedOut",
    "ExecutionTimedOut",
    "Undeliverable",
    "Terminated",
    "InvalidPlatform",
    "AccessDenied",
}


Sleep = Callable[[float], None]


Clock = Callable[[], float]


@dataclass(frozen=True)
class Invocation:
    """One node's answer to one command."""

    instance_id: str
    status: str  # SSM: Success, Failed, TimedOut, Undeliverable, ...
    response_code: int | None  # the node command's exit code
    stdout: str
    stderr: str

    @property
    def payload(self) -> dict[str, Any] | None:
        """The JSON object node_bootstrap.jobs printed (its last stdout line)."""
        for line in reversed(self.stdout.strip().splitlines()):
            try:
                value = json.loads(line)
            except (ValueError, RecursionError):  # not JSON, or nested past the parser's depth (a job's output)
                continue
            return value if isinstance(value, dict) else None
        return None

    @property
    def error(self) -> str:
        """Why it failed, in one line."""
        if self.payload and self.payload.get("error"):
            return str(self.payload["error"])
        lines = (self.stderr or self.stdout).strip().splitlines()
        detail = f": {lines[-1]}" if lines else ""
        return f"SSM {self.status} (exit code {self.response_code}){detail}"


def run_on_nodes(
    ssm: Any,
    document_name: str,
    instance_ids: Sequence[str],
    parameters: dict[str, list[str]],
    comment: str,
    timeout_seconds: float,
    sleep: Sleep = time.sleep,
    clock: Clock = time.monotonic,
) -> dict[str, Invocation]:
    """Sends the document to the nodes (in batches of 50) and waits for every node's answer."""
    pending: dict[str, str] = {}  # instance id -> command id
    results: dict[str, Invocation] = {}

    def send(batch: list[str]) -> None:
        command = ssm.send_command(
            DocumentName=document_name,
            DocumentVersion=DOCUMENT_VERSION,
            InstanceIds=batch,
            Parameters=parameters,
            Comment=comment[:100],  # SSM: Comment is at most 100 characters
            TimeoutSeconds=max(30, int(timeout_seconds)),  # delivery timeout: an offline node fails fast
        )["Command"]
        pending.update({instance_id: command["CommandId"] for instance_id in batch})

    for start in range(0, len(instance_ids), SEND_BATCH):
        batch = list(instance_ids[start : start + SEND_BATCH])
        try:
            send(batch)
        except botocore.exceptions.ClientError as e:
            if _error_code(e) != "InvalidInstanceId":
                raise
            # One instance SSM cannot address (terminated since it was looked up, or its agent is not
            # registered) fails the whole batch: send to each alone, so the others are still reached.
            for instance_id in batch:
                try:
                    send([instance_id])
                except botocore.exceptions.ClientError as alone:
                    if _error_code(alone) != "InvalidInstanceId":
                        raise
                    message = alone.response.get("Error", {}).get("Message", "")
                    results[instance_id] = Invocation(
                        instance_id, "InvalidInstanceId", None, "",
                        f"SSM cannot address the instance (InvalidInstanceId: {message or 'no detail'})",
                    )
    deadline = clock() + timeout_seconds
    while pending:
        for instance_id, command_id in list(pending.items()):
            try:
                answer = ssm.get_command_invocation(CommandId=command_id, InstanceId=instance_id)
            except botocore.exceptions.ClientError as e:
                if _error_code(e) == "InvocationDoesNotExist":
                    continue  # SSM has not registered the invocation yet
                raise
            if answer["Status"] in TERMINAL_STATUSES:
                results[instance_id] = Invocation(
                    instance_id=instance_id,
                    status=answer["Status"],
                    response_code=answer.get("ResponseCode"),
                    stdout=answer.get("StandardOutputContent", ""),
                    stderr=answer.get("StandardErrorContent", ""),
                )
                del pending[instance_id]
        if pending:
            if clock() >= deadline:
                for instance_id in pending:
                    results[instance_id] = Invocation(
                        instance_id, "NoAnswer", None, "", f"no answer within {timeout_seconds:.0f} s"
                    )
                break
            sleep(POLL_SECONDS)
    return results


def _error_code(error: botocore.exceptions.ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))
