"""EventBridge events in the shapes AWS documents them (not moto's), for the job keeper's tests."""

from __future__ import annotations

import datetime

ACCOUNT = "123456789012"
REGION = "us-east-1"
STACK = "DrillStack"
GROUP = "DrillStack-nodes"


def _envelope(source: str, detail_type: str, detail: dict, resources: list[str]) -> dict:
    return {
        "version": "0",
        "id": "7bf73129-1428-4cd3-a780-95db273d1602",
        "detail-type": detail_type,
        "source": source,
        "account": ACCOUNT,
        "time": datetime.datetime.now(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ"),
        "region": REGION,
        "resources": resources,
        "detail": detail,
    }


def scheduled_event() -> dict:
    # EventBridge User Guide, "Creating a rule that runs on a schedule": source aws.events, detail {}
    return _envelope("aws.events", "Scheduled Event", {},
                     [f"arn:aws:events:{REGION}:{ACCOUNT}:rule/{STACK}-JobKeeperSchedule"])


def autoscaling_event(detail_type: str, instance_id: str) -> dict:
    # EC2 Auto Scaling User Guide, "Amazon EC2 Auto Scaling event reference"
    group_arn = (f"arn:aws:autoscaling:{REGION}:{ACCOUNT}:autoScalingGroup:"
                 f"0c9a3ef7-1b9f-4a0b-8b6f-2b0e1d3c4f5a:autoScalingGroupName/{GROUP}")
    return _envelope("aws.autoscaling", detail_type, {
        "StatusCode": "InProgress",
        "Description": f"{detail_type.split(' ')[2]}ing an EC2 instance: {instance_id}",
        "AutoScalingGroupName": GROUP,
        "ActivityId": "5e5e5e5e-0000-4000-8000-000000000001",
        "Details": {"Availability Zone": f"{REGION}a", "Subnet ID": "subnet-0123456789abcdef0"},
        "RequestId": "5e5e5e5e-0000-4000-8000-000000000001",
        "StatusMessage": "",
        "EndTime": "2026-11-23T10:00:00.000Z",
        "EC2InstanceId": instance_id,
        "StartTime": "2026-11-23T09:59:00.000Z",
        "Cause": "At 2026-11-23T09:59:00Z an instance was taken out of service in response to an EC2 "
                 "health check indicating it has been terminated or stopped.",
    }, [group_arn, f"arn:aws:ec2:{REGION}:{ACCOUNT}:instance/{instance_id}"])


def expiration_warning(reservation_id: str, end: str) -> dict:
    # EC2 User Guide, "Monitor Capacity Blocks using EventBridge"
    return _envelope("aws.ec2", "Capacity Block Expiration Warning",
                     {"capacity-reservation-id": reservation_id, "end-date": end},
                     [f"arn:aws:ec2:{REGION}:{ACCOUNT}:capacity-reservation/{reservation_id}"])
