"""Cost estimates from the instance catalog's on-demand price (us-east-1 Linux; see
instance_catalog/instance_types.py). They are estimates: prices differ by region, and a Capacity Block's
price is its upfront fee (`clusterctl capacity offerings` shows it)."""

from __future__ import annotations

import datetime
from dataclasses import dataclass

from instance_catalog.instance_types import get_instance_type

SECONDS_PER_HOUR = 3600.0


@dataclass(frozen=True)
class CostEstimate:
    instance_type: str
    nodes: int
    hours: float
    usd_per_instance_hour: float

    @property
    def usd_per_hour(self) -> float:
        return self.nodes * self.usd_per_instance_hour

    @property
    def total_usd(self) -> float:
        return self.usd_per_hour * self.hours

    @property
    def gpu_hours(self) -> float:
        return self.nodes * self.hours * get_instance_type(self.instance_type).gpu_count


def estimate_cost(instance_type: str, nodes: int, hours: float) -> CostEstimate:
    entry = get_instance_type(instance_type)
    if nodes < 1:
        raise ValueError(f"nodes={nodes}: allowed: 1 or more")
    if hours < 0:
        raise ValueError(f"hours={hours}: allowed: 0 or more")
    return CostEstimate(
        instance_type=entry.name, nodes=nodes, hours=hours, usd_per_instance_hour=entry.on_demand_usd_per_hour
    )


def cost_so_far(
    instance_type: str, nodes: int, started_at: datetime.datetime, now: datetime.datetime
) -> CostEstimate:
    """What a job's nodes have cost since it started (the nodes bill whether or not a job runs)."""
    hours = max(0.0, (now - started_at).total_seconds() / SECONDS_PER_HOUR)
    return estimate_cost(instance_type, nodes, hours)
