"""CapacityTarget: where the nodes' capacity comes from, in one of three modes kept apart.

- on-demand: a cluster placement group, nothing reserved.
- odcr: an On-Demand Capacity Reservation, created here (in the placement group) or an existing one; the Auto
  Scaling group targets it with `capacity-reservations-only`, so a full or expired reservation fails the launch
  instead of silently falling back to unreserved capacity.
- capacity-block: a Capacity Block for ML bought through the EC2 API (`clusterctl capacity purchase`; there is
  no CloudFormation resource for buying one). The launch template carries MarketType=capacity-block and the
  reservation id; no placement group (EC2 Auto Scaling User Guide, "Use Capacity Blocks for machine learning
  workloads").
"""

from __future__ import annotations

from aws_cdk import Stack
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ec2 as ec2
from constructs import Construct

from cluster_spec.settings import CapacityMode, CapacitySettings


class CapacityTarget(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: CapacitySettings,
        instance_type: str,
        node_count: int,
        availability_zone: str,
    ) -> None:
        super().__init__(scope, construct_id)
        self.settings = settings
        self.placement_group: ec2.CfnPlacementGroup | None = None
        self.reservation: ec2.CfnCapacityReservation | None = None

        if settings.uses_placement_group:
            # Cluster strategy: all nodes in one spine for the lowest EFA latency.
            self.placement_group = ec2.CfnPlacementGroup(self, "PlacementGroup", strategy="cluster")

        if settings.creates_reservation:
            end = settings.reservation_end
            self.reservation = ec2.CfnCapacityReservation(
                self,
                "Reservation",
                instance_type=instance_type,
                instance_platform="Linux/UNIX",
                availability_zone=availability_zone,
                instance_count=node_count,
                # Targeted: only launches that name this reservation use it, so nothing else eats the capacity.
                instance_match_criteria="targeted",
                tenancy="default",
                ebs_optimized=True,
                end_date_type="limited" if end else "unlimited",
                end_date=end.strftime("%Y-%m-%dT%H:%M:%SZ") if end else None,
                placement_group_arn=Stack.of(self).format_arn(
                    service="ec2", resource="placement-group", resource_name=self.placement_group.ref
                ),
            )

    @property
    def mode(self) -> CapacityMode:
        return self.settings.mode

    @property
    def placement_group_name(self) -> str | None:
        return self.placement_group.ref if self.placement_group else None

    @property
    def reservation_id(self) -> str | None:
        """The reservation the nodes launch into: the one created here, or the configured one."""
        if self.reservation is not None:
            return self.reservation.ref
        return self.settings.reservation_id

    def launch_template_market_options(self) -> ec2.CfnLaunchTemplate.InstanceMarketOptionsProperty | None:
        """LaunchTemplateData.InstanceMarketOptions: only Capacity Blocks need one."""
        if self.mode is CapacityMode.CAPACITY_BLOCK:
            return ec2.CfnLaunchTemplate.InstanceMarketOptionsProperty(market_type="capacity-block")
        return None

    def launch_template_reservation(
        self,
    ) -> ec2.CfnLaunchTemplate.CapacityReservationSpecificationProperty | None:
        """LaunchTemplateData.CapacityReservationSpecification: a Capacity Block is named in the launch template
        together with its market type."""
        if self.mode is CapacityMode.CAPACITY_BLOCK:
            return ec2.CfnLaunchTemplate.CapacityReservationSpecificationProperty(
                capacity_reservation_target=ec2.CfnLaunchTemplate.CapacityReservationTargetProperty(
                    capacity_reservation_id=self.reservation_id,
                ),
            )
        return None

    def auto_scaling_reservation(
        self,
    ) -> autoscaling.CfnAutoScalingGroup.CapacityReservationSpecificationProperty | None:
        """AutoScalingGroup.CapacityReservationSpecification: an ODCR is targeted by the group, reservations
        only (EC2 Auto Scaling User Guide, "Target Capacity Reservations from your Auto Scaling group")."""
        if self.mode is CapacityMode.ODCR:
            return autoscaling.CfnAutoScalingGroup.CapacityReservationSpecificationProperty(
                capacity_reservation_preference="capacity-reservations-only",
                capacity_reservation_target=autoscaling.CfnAutoScalingGroup.CapacityReservationTargetProperty(
                    capacity_reservation_ids=[self.reservation_id],
                ),
            )
        return None
