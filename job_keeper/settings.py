"""What a job keeper round is given and what it returns: the stack's names (the Lambda function's environment),
the AWS clients, why the round runs, and what it did."""

from __future__ import annotations

from collections.abc import Mapping
from dataclasses import dataclass
from typing import Any


@dataclass(frozen=True)
class KeeperSettings:
    """What the keeper needs to know about its stack (the Lambda function's environment)."""

    table_name: str
    document_name: str
    group_name: str
    alarm_topic_arn: str
    stack_name: str
    instance_type: str
    capacity_mode: str
    capacity_reservation_id: str = ""

    ENVIRONMENT = {
        "table_name": "JOB_TABLE_NAME",
        "document_name": "JOB_DOCUMENT_NAME",
        "group_name": "AUTO_SCALING_GROUP_NAME",
        "alarm_topic_arn": "ALARM_TOPIC_ARN",
        "stack_name": "STACK_NAME",
        "instance_type": "INSTANCE_TYPE",
        "capacity_mode": "CAPACITY_MODE",
        "capacity_reservation_id": "CAPACITY_RESERVATION_ID",
    }

    @classmethod
    def from_environment(cls, environ: Mapping[str, str]) -> KeeperSettings:
        optional = {"capacity_reservation_id"}
        missing = [
            name for field, name in cls.ENVIRONMENT.items() if field not in optional and not environ.get(name)
        ]
        if missing:
            raise ValueError(f"the job keeper's environment lacks {', '.join(missing)} (set by the stack)")
        return cls(**{field: environ.get(name, "") for field, name in cls.ENVIRONMENT.items()})


@dataclass(frozen=True)
class Trigger:
    """Why this round runs: the schedule, an Auto Scaling event, or a Capacity Block expiration warning."""

    kind: str  # schedule | autoscaling | capacity-block-expiring | manual
    detail: str = ""  # the instance of an Auto Scaling event; the reservation of an expiration warning
    block_end: str = ""  # the expiration warning's end date, as EC2 sent it


MANUAL = Trigger("manual")  # a round run by hand (tests, a console invocation)


@dataclass(frozen=True)
class Outcome:
    """What one round did, for the function's log and the tests."""

    job_id: str | None
    action: str  # idle | observed | restarting | waiting | started | succeeded | failed | cancelled | ...
    state: str | None
    detail: str = ""


@dataclass
class Clients:
    dynamodb: Any
    ssm: Any
    ec2: Any
    autoscaling: Any
    sns: Any
