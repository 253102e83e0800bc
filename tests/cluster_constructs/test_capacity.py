"""CapacityTarget: the three capacity modes stay apart."""

from aws_cdk.assertions import Match, Template
from cdk_support import bare_stack, build_settings, resources_of

from cluster_constructs.capacity import CapacityTarget


def _capacity(**overrides):
    settings = build_settings(**overrides)
    stack = bare_stack()
    target = CapacityTarget(
        stack,
        "Capacity",
        settings=settings.capacity,
        instance_type=settings.compute.instance_type.name,
        node_count=settings.compute.node_count,
        availability_zone=settings.network.availability_zone,
    )
    return stack, target, Template.from_stack(stack)


def test_on_demand_uses_a_cluster_placement_group_and_no_reservation():
    stack, target, template = _capacity()
    template.has_resource_properties("AWS::EC2::PlacementGroup", {"Strategy": "cluster"})
    template.resource_count_is("AWS::EC2::CapacityReservation", 0)
    assert target.reservation_id is None
    assert target.launch_template_market_options() is None
    assert target.launch_template_reservation() is None
    assert target.auto_scaling_reservation() is None


def test_odcr_is_created_targeted_in_the_placement_group():
    stack, target, template = _capacity(
        capacityMode="odcr", nodeCount="4", reservationEndDate="2027-02-01T08:00:00Z"
    )
    template.has_resource_properties(
        "AWS::EC2::CapacityReservation",
        {
            "InstanceType": "p5.48xlarge",
            "InstancePlatform": "Linux/UNIX",
            "AvailabilityZone": "us-east-1a",
            "InstanceCount": 4,
            "InstanceMatchCriteria": "targeted",
            "EndDateType": "limited",
            "EndDate": "2027-02-01T08:00:00Z",
            "PlacementGroupArn": Match.any_value(),
        },
    )
    spec = stack.resolve(target.auto_scaling_reservation())
    assert spec["capacityReservationPreference"] == "capacity-reservations-only"
    (reservation_id,) = spec["capacityReservationTarget"]["capacityReservationIds"]
    assert reservation_id == stack.resolve(target.reservation.ref)


def test_odcr_without_end_date_is_unlimited():
    _, _, template = _capacity(capacityMode="odcr")
    (reservation,) = resources_of(template, "AWS::EC2::CapacityReservation")
    assert reservation["EndDateType"] == "unlimited" and "EndDate" not in reservation


def test_existing_odcr_is_targeted_without_placement_group():
    stack, target, template = _capacity(capacityMode="odcr", capacityReservationId="cr-0123456789abcdef0")
    template.resource_count_is("AWS::EC2::PlacementGroup", 0)
    template.resource_count_is("AWS::EC2::CapacityReservation", 0)
    spec = stack.resolve(target.auto_scaling_reservation())
    assert spec["capacityReservationTarget"]["capacityReservationIds"] == ["cr-0123456789abcdef0"]
    assert target.launch_template_market_options() is None


def test_capacity_block_goes_into_the_launch_template_without_placement_group():
    stack, target, template = _capacity(
        capacityMode="capacity-block",
        capacityReservationId="cr-0fedcba9876543210",
        reservationEndDate="2027-01-12T11:30:00Z",
    )
    template.resource_count_is("AWS::EC2::PlacementGroup", 0)
    template.resource_count_is("AWS::EC2::CapacityReservation", 0)
    assert stack.resolve(target.launch_template_market_options()) == {"marketType": "capacity-block"}
    assert stack.resolve(target.launch_template_reservation()) == {
        "capacityReservationTarget": {"capacityReservationId": "cr-0fedcba9876543210"}
    }
    assert target.auto_scaling_reservation() is None
