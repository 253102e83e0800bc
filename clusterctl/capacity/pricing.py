"""Where capacity is cheapest: current Spot prices per Availability Zone (EC2 DescribeSpotPriceHistory) and
on-demand prices per region from the AWS Price List Query API, or the instance catalog's price, labelled as
such, where the caller may not read the Price List.

- Spot: with StartTime = EndTime = now, DescribeSpotPriceHistory "also returns the last price change before
  the start time, which is the effective price as of the start time" (EC2 API reference): one current price
  per AZ that offers the type as Spot.
- On-demand: the Price List Query API is served from a few regions only (the SDKs' service documentation
  lists https://api.pricing.us-east-1.amazonaws.com and https://api.pricing.ap-south-1.amazonaws.com); one
  GetProducts call in us-east-1 answers for every region. Linux, shared tenancy, no pre-installed software,
  capacitystatus "Used" (plain on-demand, not a reservation's line). It needs pricing:GetProducts (the
  stack's operator policy grants it); without it the catalog's us-east-1 list price stands in, labelled.
"""

from __future__ import annotations

import datetime
import json
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from clusterctl.capacity.regions import describe_region_error
from instance_catalog.instance_types import get_instance_type

PRICING_API_REGION = "us-east-1"
SPOT_PRODUCT = "Linux/UNIX"  # the DLAMI's platform
CATALOG_PRICE_REGION = "us-east-1"  # instance_catalog/instance_types.py: us-east-1 Linux list prices
_ON_DEMAND_FILTERS = {
    "operatingSystem": "Linux",
    "tenancy": "Shared",
    "preInstalledSw": "NA",
    "capacitystatus": "Used",
    "licenseModel": "No License required",
}


@dataclass(frozen=True)
class SpotPrice:
    availability_zone: str
    usd_per_hour: float
    since: datetime.datetime  # when this price took effect


@dataclass(frozen=True)
class OnDemandPrice:
    usd_per_hour: float | None  # None: the Price List has no on-demand Linux price for the type there
    source: str  # "price-list" or "catalog"
    note: str  # why the catalog, or what the Price List said; "" when plain


def current_spot_prices(ec2: Any, instance_type: str, now: datetime.datetime) -> list[SpotPrice]:
    """The Spot price in effect now in each AZ of the client's region that offers `instance_type` as Spot."""
    latest: dict[str, SpotPrice] = {}
    paginator = ec2.get_paginator("describe_spot_price_history")
    for page in paginator.paginate(
        InstanceTypes=[instance_type], ProductDescriptions=[SPOT_PRODUCT], StartTime=now, EndTime=now
    ):
        for item in page.get("SpotPriceHistory", []):
            price = SpotPrice(item["AvailabilityZone"], float(item["SpotPrice"]), item["Timestamp"])
            known = latest.get(price.availability_zone)
            if known is None or price.since > known.since:
                latest[price.availability_zone] = price
    return sorted(latest.values(), key=lambda p: (p.usd_per_hour, p.availability_zone))


def on_demand_prices(pricing: Any, instance_type: str, regions: Sequence[str]) -> dict[str, OnDemandPrice]:
    """Per region: the Price List's on-demand Linux price, or the catalog's (labelled) when the Price List
    cannot be read."""
    try:
        found = _price_list(pricing, instance_type)
    except Exception as error:  # noqa: BLE001 - AWS errors fall back to the catalog; others re-raise below
        message, _ = describe_region_error(error, PRICING_API_REGION)  # re-raises what is not an AWS error
        return {region: catalog_price(instance_type, region, f"Price List API unavailable: {message}")
                for region in regions}
    return {
        region: (
            OnDemandPrice(found[region], "price-list", "")
            if region in found
            else OnDemandPrice(None, "price-list", "no on-demand Linux price in the Price List for this region")
        )
        for region in regions
    }


def catalog_price(instance_type: str, region: str, why: str) -> OnDemandPrice:
    price = get_instance_type(instance_type).on_demand_usd_per_hour
    where = (
        f"catalog ({CATALOG_PRICE_REGION} list price)"
        if region == CATALOG_PRICE_REGION
        else f"catalog ({CATALOG_PRICE_REGION} list price; {region}'s may differ)"
    )
    return OnDemandPrice(price, "catalog", f"{where}: {why}")


def _price_list(pricing: Any, instance_type: str) -> dict[str, float]:
    """regionCode -> USD per hour, from GetProducts for the type (every region in one paginated answer)."""
    filters = [{"Type": "TERM_MATCH", "Field": "instanceType", "Value": instance_type}] + [
        {"Type": "TERM_MATCH", "Field": field, "Value": value} for field, value in _ON_DEMAND_FILTERS.items()
    ]
    prices: dict[str, float] = {}
    for page in pricing.get_paginator("get_products").paginate(ServiceCode="AmazonEC2", Filters=filters):
        for item in page.get("PriceList", []):
            product = json.loads(item) if isinstance(item, str) else item  # JSON text per the service model
            region = product.get("product", {}).get("attributes", {}).get("regionCode")
            price = _hourly_usd(product)
            if region and price is not None:
                prices[region] = price
    return prices


def _hourly_usd(product: dict[str, Any]) -> float | None:
    for term in product.get("terms", {}).get("OnDemand", {}).values():
        for dimension in term.get("priceDimensions", {}).values():
            usd = dimension.get("pricePerUnit", {}).get("USD")
            if dimension.get("unit") == "Hrs" and usd is not None and float(usd) > 0:
                return float(usd)
    return None
