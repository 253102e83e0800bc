"""Commands that ask several regions at once: `capacity offerings --regions` and `capacity prices`. Each
region is asked in parallel (clusterctl.regions); a region that fails is a warning line on stderr and an
entry in the JSON's "errors", and the command still prints what the other regions answered. Exit status: 0
when any region answered, else the first region's error code."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING, Any

from clusterctl import capacity, commands, pricing
from clusterctl.aws import EXIT_ENDPOINT, ClusterctlError
from clusterctl.regions import RegionResult, across_regions, exit_code_of, parse_regions, regional_client
from clusterctl.render import format_table, format_time, format_usd, to_json

if TYPE_CHECKING:
    from clusterctl.cli import Runtime


def capacity_offerings(args: argparse.Namespace, runtime: Runtime) -> int:
    """Without --regions: the single-region listing of clusterctl.commands; with it, every region at once."""
    if not args.regions:
        return commands.capacity_offerings(args, runtime)
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
        _print(runtime, to_json({
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
            _print(runtime, format_table(
                ("REGION", "OFFERING", "AZ", "START", "END", "HOURS", "INSTANCES", "UPFRONT FEE", "PER INSTANCE-HOUR"),
                rows,
            ))
        _print(runtime, f"{len(rows)} offerings of {args.nodes} x {args.instance_type} for {args.hours} h in "
                        f"{', '.join(answered) or 'no region'} (cheapest first); buy one in its region with: "
                        "clusterctl --region REGION capacity purchase OFFERING")
    _warn_errors(runtime, results)
    return exit_code_of(results)


def capacity_prices(args: argparse.Namespace, runtime: Runtime) -> int:
    assert runtime.context is not None
    context = runtime.context
    if not args.regions and not context.region:
        raise ClusterctlError("no AWS region: pass --regions (or --region, or set AWS_REGION)", EXIT_ENDPOINT)
    regions = parse_regions(args.regions or context.region)
    now = runtime.now()
    spot = across_regions(
        context, "ec2", regions, lambda ec2, region: pricing.current_spot_prices(ec2, args.instance_type, now)
    )
    on_demand = pricing.on_demand_prices(
        regional_client(context, "pricing", pricing.PRICING_API_REGION), args.instance_type, regions
    )
    if args.json:
        _print(runtime, to_json({
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
        _print(runtime, format_table(
            ("REGION", "AZ", "SPOT $/H", "SPOT SINCE", "ON-DEMAND $/H", "ON-DEMAND SOURCE"),
            [row for r in spot for row in _price_rows(r, on_demand[r.region])],
        ))
        for note in dict.fromkeys(p.note for p in on_demand.values() if p.note):
            _print(runtime, f"on-demand: {note}")
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


def _print(runtime: Runtime, text: str) -> None:
    print(text, file=runtime.out, flush=True)
