"""`quota` and `capacity` (purchase, list; offerings and prices are in clusterctl.capacity.regional): each
reads its arguments, calls the AWS-facing modules beside it and prints a table or JSON."""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from cluster_aws.errors import EXIT_FAILED, EXIT_OK
from clusterctl.arguments import AddCommand, HelpFormatter, instance_type, positive_int, utc_time, with_example
from clusterctl.capacity import offerings as capacity
from clusterctl.capacity import quota as quotas
from clusterctl.capacity import regional
from clusterctl.render import deploy_command, format_table, format_time, format_usd, to_json
from clusterctl.runtime import say

if TYPE_CHECKING:
    from clusterctl.runtime import Runtime


def quota(args: argparse.Namespace, runtime: Runtime) -> int:
    context = runtime.context
    assert context is not None
    report = quotas.check_quota(
        context.client("ec2"), context.client("service-quotas"), args.instance_type, args.nodes
    )
    if args.json:
        say(
            runtime,
            to_json(
                {
                    "instanceType": report.instance_type,
                    "nodes": report.nodes,
                    "quotaVcpus": report.quota_vcpus,
                    "usedVcpus": report.used_vcpus,
                    "requestedVcpus": report.requested_vcpus,
                    "neededVcpus": report.needed_vcpus,
                    "fits": report.fits,
                }
            ),
        )
    else:
        say(runtime, "\n".join(report.summary()))
    return EXIT_OK if report.fits else EXIT_FAILED


def capacity_purchase(args: argparse.Namespace, runtime: Runtime) -> int:
    assert runtime.context is not None
    capacity.validate_offering_id(args.offering_id)  # before any call
    offering = capacity.find_offering(
        runtime.context.client("ec2"), args.offering_id, args.instance_type, args.nodes, args.hours, args.start,
        args.end, runtime.context.region or "this region",
    )
    if not args.yes:
        question = (
            f"Buy Capacity Block {offering.offering_id}: {offering.instance_count} x {offering.instance_type} in "
            f"{offering.availability_zone}, {format_time(offering.start)} to {format_time(offering.end)} "
            f"({offering.duration_hours} h), upfront {format_usd(offering.upfront_fee)} {offering.currency}? The fee "
            "is charged now and a purchase cannot be cancelled. Type 'yes' to buy: "
        )
        try:
            answer = runtime.confirm(question)
        except EOFError:  # stdin closed (a script, `< /dev/null`): no one said yes
            answer = ""
            print(file=runtime.out)  # end the prompt's line
        if answer.strip().lower() != "yes":
            say(runtime, "not bought")
            return EXIT_FAILED
    reservation = capacity.purchase_block(runtime.context.client("ec2"), offering.offering_id)
    settings = capacity.deploy_context(reservation, runtime.context.region or "")
    if args.json:
        say(runtime, to_json({"offering": offering, "reservation": reservation, "cdkContext": settings}))
        return EXIT_OK
    say(
        runtime,
        f"bought {reservation.reservation_id}: {reservation.total_instances} x "
        f"{reservation.instance_type} in {reservation.availability_zone}, "
        f"{format_time(reservation.start)} to {format_time(reservation.end)} ({reservation.state}), upfront "
        f"{format_usd(offering.upfront_fee)} {offering.currency}",
    )
    say(runtime, "deploy the cluster on it with:")
    say(runtime, "  " + deploy_command(args.stack, settings))
    return EXIT_OK


def capacity_list(args: argparse.Namespace, runtime: Runtime) -> int:
    assert runtime.context is not None
    reservations = capacity.list_reservations(runtime.context.client("ec2"))
    if args.json:
        say(runtime, to_json(reservations))
        return EXIT_OK
    rows = [
        (
            r.reservation_id,
            r.kind,
            r.instance_type,
            r.availability_zone,
            r.state,
            f"{r.available_instances}/{r.total_instances}",
            format_time(r.start),
            format_time(r.end) or "no end",
        )
        for r in reservations
    ]
    say(
        runtime,
        format_table(("RESERVATION", "KIND", "TYPE", "AZ", "STATE", "AVAILABLE", "START", "END"), rows)
        if rows
        else "no capacity reservations or Capacity Blocks in this region",
    )
    return EXIT_OK


def add_parsers(add: AddCommand, common: argparse.ArgumentParser) -> None:
    """`quota` and `capacity` (offerings, prices, purchase, list); `common` holds the global options."""
    quota_parser = add(
        "quota", "Does the request fit the On-Demand P-instance vCPU quota (L-417A185B)? Exit 1 if not.",
        example="clusterctl quota --instance-type p5.48xlarge --nodes 4",
    )
    quota_parser.add_argument("--instance-type", type=instance_type, default="p5.48xlarge",
                              help="a catalog instance type (default %(default)s)")
    quota_parser.add_argument("--nodes", type=positive_int, required=True,
                              help="nodes to run at once (required; no default)")
    quota_parser.set_defaults(handler=quota)

    capacity_parser = add(
        "capacity", "Capacity Blocks for ML and capacity reservations: offerings, prices, purchase, list.",
        example="clusterctl capacity offerings --nodes 4 --hours 168",
    )
    capacity_sub = capacity_parser.add_subparsers(dest="capacity_command", required=True, metavar="ACTION")

    def add_action(name: str, help_text: str, example: str, description: str = "") -> argparse.ArgumentParser:
        return capacity_sub.add_parser(name, parents=[common], help=help_text, description=description or help_text,
                                       epilog=with_example(None, example), formatter_class=HelpFormatter)

    offerings_parser = add_action(
        "offerings",
        "list Capacity Block offerings with their price, cheapest first (--regions: several regions at once)",
        "clusterctl capacity offerings --nodes 4 --hours 168 --regions us-east-1,us-west-2",
        description="Capacity Block offerings for --nodes instances of --instance-type for --hours, with their "
        "upfront fee and price per instance-hour, cheapest first; buy one with `capacity purchase`.",
    )
    offerings_parser.add_argument("--instance-type", type=instance_type, default="p5.48xlarge",
                                  help="a catalog instance type (default %(default)s)")
    offerings_parser.add_argument("--nodes", type=positive_int, required=True,
                                  help="instances in the block (required; no default)")
    offerings_parser.add_argument(
        "--hours",
        type=positive_int,
        required=True,
        help="block length: whole days up to 14 days, then whole weeks up to 182 days (required; no default)",
    )
    offerings_parser.add_argument("--start", type=utc_time,
                                  help="earliest start (ISO 8601, UTC if no zone; default: any)")
    offerings_parser.add_argument("--end", type=utc_time, help="latest end (ISO 8601, UTC if no zone; default: any)")
    offerings_parser.add_argument(
        "--regions",
        metavar="REGION,...",
        help="ask these regions in parallel (e.g. us-east-1,us-west-2,eu-north-1); a region that fails is a "
        "warning, not the end (default: --region only)",
    )
    offerings_parser.set_defaults(handler=regional.capacity_offerings)
    prices_parser = add_action(
        "prices",
        "current Spot price per AZ (EC2 Spot price history) and the on-demand price per region (AWS Price "
        "List API, else the catalog's, labelled)",
        "clusterctl capacity prices --instance-type p5.48xlarge --regions us-east-1,us-west-2",
    )
    prices_parser.add_argument("--instance-type", type=instance_type, default="p5.48xlarge",
                               help="a catalog instance type (default %(default)s)")
    prices_parser.add_argument(
        "--regions", metavar="REGION,...", help="regions to ask in parallel (default: --region)"
    )
    prices_parser.set_defaults(handler=regional.capacity_prices)
    purchase_parser = add_action(
        "purchase",
        "buy a Capacity Block offering (shows what it buys and asks first) and print the cdk deploy settings",
        "clusterctl capacity purchase cb-0123456789abcdef0 --nodes 4 --hours 168",
        description="Buy a Capacity Block offering: it is looked up with the same --instance-type, --nodes, --hours "
        "(and --start, --end) that `capacity offerings` listed it with, so the prompt shows the instance type and "
        "count, the AZ, the start and end and the upfront fee before anything is bought.",
    )
    purchase_parser.add_argument("offering_id", metavar="OFFERING_ID", help="cb-... from `capacity offerings`")
    purchase_parser.add_argument("--instance-type", type=instance_type, default="p5.48xlarge",
                                 help="as listed by `capacity offerings` (default p5.48xlarge)")
    purchase_parser.add_argument("--nodes", type=positive_int, required=True,
                                 help="the offering's instance count, as listed by `capacity offerings`")
    purchase_parser.add_argument("--hours", type=positive_int, required=True,
                                 help="the offering's length in hours, as listed by `capacity offerings`")
    purchase_parser.add_argument("--start", type=utc_time,
                                 help="the --start `capacity offerings` was given, if any (default: none)")
    purchase_parser.add_argument("--end", type=utc_time,
                                 help="the --end `capacity offerings` was given, if any (default: none)")
    purchase_parser.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    purchase_parser.set_defaults(handler=capacity_purchase)
    reservations_parser = add_action(
        "list", "capacity reservations (ODCRs) and Capacity Blocks: state, AZ, end", "clusterctl capacity list"
    )
    reservations_parser.set_defaults(handler=capacity_list)
