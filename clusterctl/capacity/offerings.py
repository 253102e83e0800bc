"""Capacity Blocks for ML (offerings, purchase) and the account's reservations (ODCRs and blocks).

Blocks are bought through the EC2 API (no CloudFormation resource buys one); after a purchase the stack is
deployed against the block with the `-c` settings `deploy_context` prints.
"""

from __future__ import annotations

import datetime
import re
from dataclasses import dataclass
from typing import Any

from cluster_aws.errors import EXIT_USAGE, ClusterctlError
from instance_catalog.instance_types import get_instance_type

INSTANCE_PLATFORM = "Linux/UNIX"  # the DLAMI's platform; a block only serves instances of its platform
HOURS_PER_DAY = 24
# EC2 API reference, DescribeCapacityBlockOfferings CapacityDurationHours: "1-day increments up to 14 days,
# and 7-day increments up to 182 days".
MAX_DAILY_INCREMENT_DAYS = 14
MAX_DURATION_DAYS = 182
# EC2 ids are a prefix and 17 lowercase hexadecimal-like characters; AWS's own examples of Capacity Block offering
# ids use letters beyond f (cb-0123456789abcdefg), so any lowercase letter or digit is taken.
OFFERING_ID = re.compile(r"cb-[0-9a-z]{17}")


@dataclass(frozen=True)
class Offering:
    offering_id: str
    instance_type: str
    availability_zone: str
    instance_count: int
    start: datetime.datetime
    end: datetime.datetime
    duration_hours: int
    upfront_fee: float  # the whole block's price, paid at purchase
    currency: str

    @property
    def price_per_instance_hour(self) -> float:
        return self.upfront_fee / (self.instance_count * self.duration_hours)


@dataclass(frozen=True)
class Reservation:
    reservation_id: str
    kind: str  # "capacity-block" or "odcr"
    instance_type: str
    availability_zone: str
    state: str  # ODCR: active, expired, cancelled, pending, failed; blocks also scheduled, payment-pending...
    total_instances: int
    available_instances: int
    start: datetime.datetime | None
    end: datetime.datetime | None  # None: an ODCR without an end date


def validate_duration_hours(hours: int) -> None:
    days, remainder = divmod(hours, HOURS_PER_DAY)
    ok = (
        remainder == 0
        and 1 <= days <= MAX_DURATION_DAYS
        and (days <= MAX_DAILY_INCREMENT_DAYS or days % 7 == 0)
    )
    if not ok:
        raise ClusterctlError(
            f"--hours={hours}: allowed: whole days (multiples of 24) up to {MAX_DAILY_INCREMENT_DAYS * 24}, "
            f"then whole weeks (multiples of 168) up to {MAX_DURATION_DAYS * 24}",
            EXIT_USAGE,
        )


def list_offerings(
    ec2: Any,
    instance_type: str,
    nodes: int,
    hours: int,
    start: datetime.datetime | None = None,
    end: datetime.datetime | None = None,
) -> list[Offering]:
    """Offerings for `nodes` instances for `hours`, starting within [start, end] if given; cheapest first."""
    get_instance_type(instance_type)  # an unknown type fails with the allowed names before any call
    validate_duration_hours(hours)
    request: dict[str, Any] = {
        "InstanceType": instance_type,
        "InstanceCount": nodes,
        "CapacityDurationHours": hours,
    }
    if start is not None:
        request["StartDateRange"] = start
    if end is not None:
        request["EndDateRange"] = end
    offerings = []
    for page in ec2.get_paginator("describe_capacity_block_offerings").paginate(**request):
        for item in page.get("CapacityBlockOfferings", []):
            offerings.append(
                Offering(
                    offering_id=item["CapacityBlockOfferingId"],
                    instance_type=item["InstanceType"],
                    availability_zone=item["AvailabilityZone"],
                    instance_count=item["InstanceCount"],
                    start=item["StartDate"],
                    end=item["EndDate"],
                    duration_hours=item["CapacityBlockDurationHours"],
                    upfront_fee=float(item["UpfrontFee"]),
                    currency=item.get("CurrencyCode", "USD"),
                )
            )
    return sorted(offerings, key=lambda o: (o.upfront_fee, o.start))


def validate_offering_id(offering_id: str) -> None:
    if not OFFERING_ID.fullmatch(offering_id):
        raise ClusterctlError(
            f"offering id {offering_id!r}: expected cb-... (cb- and 17 letters or digits) from `clusterctl capacity "
            "offerings`", EXIT_USAGE
        )


def find_offering(ec2: Any, offering_id: str, instance_type: str, nodes: int, hours: int,
                  start: datetime.datetime | None, end: datetime.datetime | None, region: str) -> Offering:
    """The offering `offering_id` among those listed for the same request (EC2 has no call that describes one
    offering by its id), so a purchase can show what it buys."""
    for offering in list_offerings(ec2, instance_type, nodes, hours, start, end):
        if offering.offering_id == offering_id:
            return offering
    raise ClusterctlError(
        f"offering {offering_id}: not among the Capacity Block offerings for {nodes} x {instance_type} for {hours} h "
        f"in {region} now (sold, expired, or listed with other --instance-type/--nodes/--hours/--start/--end): "
        "list them again with `clusterctl capacity offerings`"
    )


def purchase_block(ec2: Any, offering_id: str) -> Reservation:
    validate_offering_id(offering_id)
    response = ec2.purchase_capacity_block(
        CapacityBlockOfferingId=offering_id, InstancePlatform=INSTANCE_PLATFORM
    )
    return _reservation(response["CapacityReservation"])


def list_reservations(ec2: Any) -> list[Reservation]:
    reservations = []
    for page in ec2.get_paginator("describe_capacity_reservations").paginate():
        reservations += [_reservation(item) for item in page.get("CapacityReservations", [])]
    return sorted(
        reservations,
        key=lambda r: (
            r.end is None,
            r.end or datetime.datetime.max.replace(tzinfo=datetime.UTC),
            r.reservation_id,
        ),
    )


def _reservation(item: dict[str, Any]) -> Reservation:
    return Reservation(
        reservation_id=item["CapacityReservationId"],
        kind="capacity-block" if item.get("ReservationType") == "capacity-block" else "odcr",
        instance_type=item["InstanceType"],
        availability_zone=item["AvailabilityZone"],
        state=item["State"],
        total_instances=item.get("TotalInstanceCount", 0),
        available_instances=item.get("AvailableInstanceCount", 0),
        start=item.get("StartDate"),
        end=item.get("EndDate"),
    )


def deploy_context(reservation: Reservation, region: str) -> list[str]:
    """The `cdk deploy` context settings (cluster_spec/context.py SETTING_KEYS) that run the cluster on this block."""
    settings = [
        ("region", region),
        ("availabilityZone", reservation.availability_zone),
        ("instanceType", reservation.instance_type),
        ("nodeCount", str(reservation.total_instances)),
        ("capacityMode", "capacity-block"),
        ("capacityReservationId", reservation.reservation_id),
        ("reservationInstanceCount", str(reservation.total_instances)),
    ]
    if reservation.start is not None:
        settings.append(("reservationStartDate", _iso(reservation.start)))
    if reservation.end is not None:
        settings.append(("reservationEndDate", _iso(reservation.end)))
    return [f"-c {key}={value}" for key, value in settings]


def _iso(value: datetime.datetime) -> str:
    return value.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")
