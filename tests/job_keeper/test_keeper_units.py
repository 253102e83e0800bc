"""The job keeper's pieces that need no running job: the events it accepts, its environment, and the
Capacity Block end read from EC2 (Stubber: moto lacks DescribeCapacityReservations)."""

from __future__ import annotations

import datetime

import boto3
import pytest
from aws_events import autoscaling_event, expiration_warning, scheduled_event
from botocore.stub import Stubber

from job_keeper.handler import trigger_of
from job_keeper.keeper import Clients, Keeper, KeeperSettings, Trigger

ENVIRONMENT = {
    "JOB_TABLE_NAME": "t", "JOB_DOCUMENT_NAME": "d", "AUTO_SCALING_GROUP_NAME": "g",
    "ALARM_TOPIC_ARN": "arn:aws:sns:us-east-1:123456789012:alarms", "STACK_NAME": "S",
    "INSTANCE_TYPE": "p5.48xlarge", "CAPACITY_MODE": "capacity-block",
    "CAPACITY_RESERVATION_ID": "cr-0123456789abcdef0",
}


def test_the_events_the_rules_send_are_told_apart():
    assert trigger_of(scheduled_event()) == Trigger("schedule")
    assert trigger_of(autoscaling_event("EC2 Instance Terminate Successful", "i-0abc")) == Trigger(
        "autoscaling", "EC2 Instance Terminate Successful: i-0abc")
    assert trigger_of(expiration_warning("cr-1", "2026-11-24T10:00:00Z")) == Trigger(
        "capacity-block-expiring", "cr-1", "2026-11-24T10:00:00Z")
    other_spelling = dict(expiration_warning("cr-1", "x"), **{"detail-type": "Capacity Block Reservation "
                                                                            "Expiration Warning"})
    assert trigger_of(other_spelling).kind == "capacity-block-expiring"


def test_an_event_no_rule_sends_is_an_error_that_names_it():
    event = dict(scheduled_event(), source="aws.s3", **{"detail-type": "Object Created"})
    with pytest.raises(ValueError, match="unexpected event source='aws.s3' detail-type='Object Created'"):
        trigger_of(event)


def test_the_environment_is_read_and_a_missing_variable_is_named():
    settings = KeeperSettings.from_environment(ENVIRONMENT)
    assert (settings.table_name, settings.capacity_reservation_id) == ("t", "cr-0123456789abcdef0")
    assert KeeperSettings.from_environment({**ENVIRONMENT, "CAPACITY_RESERVATION_ID": ""}).capacity_reservation_id == ""
    missing = {k: v for k, v in ENVIRONMENT.items() if k not in ("JOB_TABLE_NAME", "ALARM_TOPIC_ARN")}
    with pytest.raises(ValueError, match="lacks JOB_TABLE_NAME, ALARM_TOPIC_ARN"):
        KeeperSettings.from_environment(missing)


def keeper_at(now: datetime.datetime, ec2) -> Keeper:
    clients = Clients(dynamodb=None, ssm=None, ec2=ec2, autoscaling=None, sns=None)
    return Keeper(KeeperSettings.from_environment(ENVIRONMENT), clients, now=lambda: now)


@pytest.mark.parametrize("minutes_left, ending", [(41, False), (40, True), (5, True)])
def test_a_block_ending_within_40_minutes_stops_the_job(minutes_left, ending):
    now = datetime.datetime(2026, 11, 23, 10, 0, tzinfo=datetime.UTC)
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(ec2) as stub:  # validates the request against EC2's service model
        stub.add_response(
            "describe_capacity_reservations",
            {"CapacityReservations": [{"CapacityReservationId": "cr-0123456789abcdef0",
                                       "EndDate": now + datetime.timedelta(minutes=minutes_left)}]},
            {"CapacityReservationIds": ["cr-0123456789abcdef0"]})
        why = keeper_at(now, ec2)._block_ending(Trigger("schedule"))
    assert bool(why) is ending
    if ending:
        assert why == "Capacity Block cr-0123456789abcdef0 ends at " + (
            now + datetime.timedelta(minutes=minutes_left)).strftime("%Y-%m-%dT%H:%M:%SZ")


def test_another_blocks_warning_is_not_ours():
    now = datetime.datetime(2026, 11, 23, 10, 0, tzinfo=datetime.UTC)
    ec2 = boto3.client("ec2", region_name="us-east-1", aws_access_key_id="x", aws_secret_access_key="x")
    with Stubber(ec2) as stub:
        stub.add_response("describe_capacity_reservations", {"CapacityReservations": [
            {"CapacityReservationId": "cr-0123456789abcdef0", "EndDate": now + datetime.timedelta(days=2)}]},
            {"CapacityReservationIds": ["cr-0123456789abcdef0"]})
        assert keeper_at(now, ec2)._block_ending(Trigger("capacity-block-expiring", "cr-other", "x")) == ""
    assert "EC2's expiration warning" in keeper_at(now, None)._block_ending(
        Trigger("capacity-block-expiring", "cr-0123456789abcdef0", "2026-11-23T10:40:00Z"))
