"""`capacity offerings` (one region, or several with --regions) and `capacity prices`. With several, each
region is asked in parallel (clusterctl.capacity.regions); a region that fails is a warning line on stderr and an
entry in the JSON's "errors", and the command still prints what the other regions answered. Exit status: 0
when any region answered, else the first region's error code."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any

from cluster_aws.errors import EXIT_ENDPOINT, EXIT_OK, ClusterctlError
from clusterctl.capacity import offerings as capacity
from clusterctl.capacity import pricing
from clusterctl.capacity.regions import RegionResult, across_regions, exit_code_of, parse_regions, regional_client
from clusterctl.render import format_table, format_time, format_usd, to_json
from clusterctl.runtime import say

if TYPE_CHECKING:
    from clusterctl.runtime import Runtime


def capacity_offerings(args: argparse.Namespace, runtime: Runtime) -> int:
    """Without --regions: the single-region listing of clusterctl.capacity.commands; with it, every region at once."""
    if not args.regions:
        return _offerings_in_one_region(args, runtime)
    assert runtime.context is not None
    regions = parse_regions(args.regions)
    capacity.validate_duration_hours(args.hours)  # a usage error once, not once per region

    def offerings_in(ec2: Any, region: str) -> list[capacity.Offering]:
        return capacity.list_offerings(ec2, args.instance_type, args.nodes, args.hours, args.start, args.end)

    results = across_regions(runtime.context, "ec2", regions, offerings_in)
    found = sorted(
        ((r.region, o) for r in results if r.ok for o in r.value or []),
        key=lambda pair: (pair[1].upfront_fee, pair[1].start, pair[0]),
    )
    if args.json:
        say(runtime, to_json({
            # the single-region listing's fields (Offering), plus the region
            "offerings": [{"region": region, **dataclasses.asdict(o)} for region, o in found],
            "regions": {r.region: "ok" if r.ok else "error" for r in results},
            "errors": {r.region: r.error for r in results if not r.ok},
        }))
    else:
        rows = [
            (region, o.offering_id, o.availability_zone, format_time(o.start), format_time(o.end), o.duration_hours,
             o.instance_count, f"{format_usd(o.upfront_fee)} {o.currency}", format_usd(o.price_per_instance_hour))
            for region, o in found
        ]
        answered = [r.region for r in results if r.ok]
        if rows:
            say(runtime, format_table(
                ("REGION", "OFFERING", "AZ", "START", "END", "HOURS", "INSTANCES", "UPFRONT FEE", "PER INSTANCE-HOUR"),
                rows,
            ))
        say(runtime, f"{len(rows)} offerings of {args.nodes} x {args.instance_type} for {args.hours} h in "
                        f"{', '.join(answered) or 'no region'} (cheapest first); buy one in its region with: "
                        f"clusterctl --region REGION {purchase_command(args)}")
    _warn_errors(runtime, results)
    return exit_code_of(results)


def capacity_prices(args: argparse.Namespace, runtime: Runtime) -> int:
    assert runtime.context is not None
    context = runtime.context
    if not args.regions and not context.region:
        raise ClusterctlError(
            "no AWS region: pass --regions (or --region, or set AWS_REGION or AWS_DEFAULT_REGION)", EXIT_ENDPOINT
        )
    regions = parse_regions(args.regions or context.region)
    now = runtime.now()
    spot = across_regions(
        context, "ec2", regions, lambda ec2, region: pricing.current_spot_prices(ec2, args.instance_type, now)
    )
    on_demand = pricing.on_demand_prices(
        regional_client(context, "pricing", pricing.PRICING_API_REGION), args.instance_type, regions
    )
    if args.json:
        say(runtime, to_json({
            "instanceType": args.instance_type,
            "regions": [
                {
                    "region": r.region,
                    "onDemand": {"usdPerHour": on_demand[r.region].usd_per_hour,
                                 "source": on_demand[r.region].source, "note": on_demand[r.region].note or None},
                    "spot": None if not r.ok else [
                        {"availabilityZone": p.availability_zone, "usdPerHour": p.usd_per_hour, "since": p.since}
                        for p in r.value or []
                    ],
                    "error": r.error or None,
                }
                for r in spot
            ],
        }))
    else:
        say(runtime, format_table(
            ("REGION", "AZ", "SPOT $/H", "SPOT SINCE", "ON-DEMAND $/H", "ON-DEMAND SOURCE"),
            [row for r in spot for row in _price_rows(r, on_demand[r.region])],
        ))
        for note in dict.fromkeys(p.note for p in on_demand.values() if p.note):
            say(runtime, f"on-demand: {note}")
    _warn_errors(runtime, spot)
    return exit_code_of(spot)


def _price_rows(result: RegionResult[list[pricing.SpotPrice]], od: pricing.OnDemandPrice) -> list[tuple]:
    od_price = "-" if od.usd_per_hour is None else format_usd(od.usd_per_hour)
    od_source = "Price List API" if od.source == "price-list" else "catalog (see below)"
    if not result.ok:
        return [(result.region, "-", "error (see stderr)", "-", od_price, od_source)]
    if not result.value:
        return [(result.region, "-", "no Spot offer", "-", od_price, od_source)]
    return [
        (result.region, p.availability_zone, format_usd(p.usd_per_hour), format_time(p.since), od_price, od_source)
        for p in result.value
    ]


def _warn_errors(runtime: Runtime, results: list[RegionResult[Any]]) -> None:
    for r in results:
        if not r.ok:
            print(f"clusterctl: warning: {r.region}: {r.error}", file=runtime.err, flush=True)


def _offerings_in_one_region(args: argparse.Namespace, runtime: Runtime) -> int:
    assert runtime.context is not None
    offerings = capacity.list_offerings(
        runtime.context.client("ec2"), args.instance_type, args.nodes, args.hours, args.start, args.end
    )
    if args.json:
        say(runtime, to_json(offerings))
        return EXIT_OK
    if not offerings:
        say(
            runtime,
            f"no Capacity Block offering for {args.nodes} x {args.instance_type} for {args.hours} h "
            "in this window: try other dates, fewer nodes or another region",
        )
        return EXIT_OK
    rows = [
        (
            o.offering_id,
            o.availability_zone,
            format_time(o.start),
            format_time(o.end),
            o.duration_hours,
            o.instance_count,
            f"{format_usd(o.upfront_fee)} {o.currency}",
            format_usd(o.price_per_instance_hour),
        )
        for o in offerings
    ]
    say(
        runtime,
        format_table(
            ("OFFERING", "AZ", "START", "END", "HOURS", "INSTANCES", "UPFRONT FEE", "PER INSTANCE-HOUR"), rows
        ),
    )
    say(runtime, f"buy one with: clusterctl {purchase_command(args)}")
    return EXIT_OK


def purchase_command(args: argparse.Namespace) -> str:
    """`capacity purchase` with the request that listed the offerings: the purchase looks the offering up again."""
    window = "".join(f" --{name} {format_time(value)}" for name, value in (("start", args.start), ("end", args.end))
                     if value is not None)
    return (f"capacity purchase OFFERING --instance-type {args.instance_type} --nodes {args.nodes} "
            f"--hours {args.hours}{window}")
