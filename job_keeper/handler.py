"""The job keeper's AWS Lambda entry point: `job_keeper.handler.handler`.

EventBridge invokes it every minute (a "Scheduled Event") and on the Auto Scaling group's instance launch
and terminate events, and in capacity-block mode on the Capacity Block's expiration warning (the rules are in
cluster_constructs/job_keeper.py). Each invocation runs one reconcile round (job_keeper/keeper.py); the
event only says why the round runs. The function's reserved concurrency is 1, so rounds never overlap.

The events' shapes are AWS's: "Scheduled Event" from aws.events (EventBridge User Guide, "Creating a rule
that runs on a schedule"), "EC2 Instance Launch Successful" / "EC2 Instance Terminate Successful" /
"EC2 Instance Launch Unsuccessful" from aws.autoscaling (EC2 Auto Scaling User Guide, "Amazon EC2 Auto
Scaling event reference"), and "Capacity Block Expiration Warning" from aws.ec2 (EC2 User Guide, "Monitor
Capacity Blocks using EventBridge", which also spells it "Capacity Block Reservation Expiration Warning").
"""

from __future__ import annotations

import json
import logging
import os
from collections.abc import Mapping
from typing import Any

import boto3

from job_keeper.keeper import Clients, Keeper, KeeperSettings, Trigger

LOG = logging.getLogger("job_keeper.keeper")
AUTOSCALING_EVENTS = (
    "EC2 Instance Launch Successful",
    "EC2 Instance Terminate Successful",
    "EC2 Instance Launch Unsuccessful",
)
EXPIRATION_WARNINGS = ("Capacity Block Expiration Warning", "Capacity Block Reservation Expiration Warning")


def trigger_of(event: Mapping[str, Any]) -> Trigger:
    """What the EventBridge event says about why this round runs; ValueError for an event the rules
    never send (a misrouted rule should show in the function's errors, not pass silently)."""
    source = event.get("source")
    detail_type = event.get("detail-type") or event.get("detail_type")
    detail = event.get("detail") or {}
    if source == "aws.events" and detail_type == "Scheduled Event":
        return Trigger("schedule")
    if source == "aws.autoscaling" and detail_type in AUTOSCALING_EVENTS:
        return Trigger("autoscaling", f"{detail_type}: {detail.get('EC2InstanceId', '?')}")
    if source == "aws.ec2" and detail_type in EXPIRATION_WARNINGS:
        return Trigger("capacity-block-expiring", str(detail.get("capacity-reservation-id", "")),
                       str(detail.get("end-date", "")))
    raise ValueError(f"job keeper: unexpected event source={source!r} detail-type={detail_type!r}")


def make_keeper(environ: Mapping[str, str] = os.environ, session: Any = None) -> Keeper:
    settings = KeeperSettings.from_environment(environ)
    session = session or boto3.Session()
    clients = Clients(*(session.client(name) for name in ("dynamodb", "ssm", "ec2", "autoscaling", "sns")))
    return Keeper(settings, clients)


def handler(event: Mapping[str, Any], context: Any = None, *, keeper: Keeper | None = None) -> dict[str, Any]:
    trigger = trigger_of(event)
    outcome = (keeper or make_keeper()).reconcile(trigger)
    result = {"trigger": trigger.kind, "triggerDetail": trigger.detail, "jobId": outcome.job_id,
              "action": outcome.action, "state": outcome.state, "detail": outcome.detail}
    print(json.dumps(result, sort_keys=True), flush=True)  # one line per round in the function's log group
    if outcome.action == "error":
        # After the result line: the invocation fails, so the function's Errors metric counts it and
        # JobKeeperErrorsAlarm fires when a record keeps failing (cluster_constructs/observability.py).
        raise RoundFailed(f"job keeper: job {outcome.job_id}: {outcome.detail}")
    return result


class RoundFailed(RuntimeError):
    """A round that could not read or save a job's record (Keeper._cannot_handle logged which and why)."""
