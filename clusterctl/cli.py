"""clusterctl's command line: argparse, global options, and the one place errors become exit codes."""

from __future__ import annotations

import argparse
import datetime
import math
import sys
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from typing import TextIO

import botocore.exceptions

from cluster_constructs.instance_types import INSTANCE_TYPES, UnknownInstanceType
from clusterctl import commands, job_commands, plan_command, regional_commands, top_view
from clusterctl.aws import (
    EXIT_CODES_HELP,
    EXIT_FAILED,
    EXIT_USAGE,
    AwsContext,
    build_context,
    describe_aws_error,
    one_line,
)
from clusterctl.stack import DEFAULT_STACK_NAME
from node_bootstrap.jobs import MAX_CANCEL_TIMEOUT_SECONDS, STOP_GRACE_SECONDS


@dataclass
class Runtime:
    """What a command touches outside itself; tests replace any of it."""

    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    confirm: Callable[[str], str] = input
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC)
    context: AwsContext | None = None  # built from --region/--profile when None


def _positive_int(text: str) -> int:
    value = int(text)
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be 1 or more")
    return value


def _non_negative_int(text: str) -> int:
    value = int(text)
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: must be 0 or more")
    return value


_positive_float = plan_command.positive_float


def _non_negative_hours(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:  # false for nan: float() accepts "nan" and "inf"
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: a number of hours >= 0")
    return value


def _sizes_mib(text: str) -> str:
    """Comma-separated whole MiB, as training.commcheck --sizes-mib takes them (checked here, before any
    node runs it)."""
    parts = text.split(",")
    if not all(p.isascii() and p.isdigit() and 1 <= int(p) <= 65536 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: comma-separated MiB of 1-65536, e.g. 64,1024")
    return ",".join(str(int(p)) for p in parts)


def _utc_time(text: str) -> datetime.datetime:
    try:
        value = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected an ISO 8601 date or time, e.g. 2026-12-01 or 2026-12-01T11:30:00Z"
        ) from None
    return value if value.tzinfo else value.replace(tzinfo=datetime.UTC)


def _instance_type(text: str) -> str:
    if text not in INSTANCE_TYPES:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: {', '.join(sorted(INSTANCE_TYPES))}")
    return text


def _add_global_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """Global options work before or after the command: the subcommands repeat them with SUPPRESS defaults
    so that a value given before the command is not reset by the subcommand's default."""

    def default(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument("--region", default=default(None), help="AWS region (default: the profile's)")
    parser.add_argument("--profile", default=default(None), help="AWS named profile")
    parser.add_argument(
        "--stack",
        default=default(DEFAULT_STACK_NAME),
        help=f"CloudFormation stack name (default {DEFAULT_STACK_NAME})",
    )
    parser.add_argument("--json", action="store_true", default=default(False), help="print JSON")
    parser.add_argument(
        "--debug", action="store_true", default=default(False), help="print the traceback of an error"
    )


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    _add_global_options(common, suppress=True)
    parser = argparse.ArgumentParser(
        prog="clusterctl",
        description="Plan and operate the P5 training cluster: plan (memory, nodes, time, cost per instance "
        "type), quota and capacity (offerings and prices across regions), nodes, jobs (submit, status, logs, "
        "cancel), cost, and a live view (top).",
        epilog=EXIT_CODES_HELP,
    )
    _add_global_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str, **kwargs: object) -> argparse.ArgumentParser:
        return sub.add_parser(name, parents=[common], help=help_text, description=help_text, **kwargs)

    plan_command.add_parser(add)

    quota = add(
        "quota", "Does the request fit the On-Demand P-instance vCPU quota (L-417A185B)? Exit 1 if not."
    )
    quota.add_argument("--instance-type", type=_instance_type, default="p5.48xlarge")
    quota.add_argument("--nodes", type=_positive_int, required=True)
    quota.set_defaults(handler=commands.quota)

    capacity = add("capacity", "Capacity Blocks for ML and capacity reservations.")
    capacity_sub = capacity.add_subparsers(dest="capacity_command", required=True, metavar="ACTION")
    offerings = capacity_sub.add_parser(
        "offerings",
        parents=[common],
        help="list Capacity Block offerings with their price, cheapest first (--regions: several regions at once)",
    )
    offerings.add_argument("--instance-type", type=_instance_type, default="p5.48xlarge")
    offerings.add_argument("--nodes", type=_positive_int, required=True)
    offerings.add_argument(
        "--hours",
        type=_positive_int,
        required=True,
        help="block length: whole days up to 14 days, then whole weeks up to 182 days",
    )
    offerings.add_argument("--start", type=_utc_time, help="earliest start (ISO 8601, UTC if no zone)")
    offerings.add_argument("--end", type=_utc_time, help="latest end (ISO 8601, UTC if no zone)")
    offerings.add_argument(
        "--regions",
        metavar="REGION,...",
        help="ask these regions in parallel (e.g. us-east-1,us-west-2,eu-north-1); a region that fails is a "
        "warning, not the end (default: --region only)",
    )
    offerings.set_defaults(handler=regional_commands.capacity_offerings)
    prices = capacity_sub.add_parser(
        "prices",
        parents=[common],
        help="current Spot price per AZ (EC2 Spot price history) and the on-demand price per region (AWS Price "
        "List API, else the catalog's, labelled)",
    )
    prices.add_argument("--instance-type", type=_instance_type, default="p5.48xlarge")
    prices.add_argument(
        "--regions", metavar="REGION,...", help="regions to ask in parallel (default: --region)"
    )
    prices.set_defaults(handler=regional_commands.capacity_prices)
    purchase = capacity_sub.add_parser(
        "purchase",
        parents=[common],
        help="buy a Capacity Block offering (asks first) and print the cdk deploy settings for it",
    )
    purchase.add_argument("offering_id", metavar="OFFERING_ID", help="cb-... from `capacity offerings`")
    purchase.add_argument("--yes", action="store_true", help="do not ask for confirmation")
    purchase.set_defaults(handler=commands.capacity_purchase)
    reservations = capacity_sub.add_parser(
        "list", parents=[common], help="capacity reservations (ODCRs) and Capacity Blocks: state, AZ, end"
    )
    reservations.set_defaults(handler=commands.capacity_list)

    nodes = add(
        "nodes", "The cluster's nodes: id, private IP, AZ, lifecycle, health and bootstrap readiness."
    )
    nodes.set_defaults(handler=commands.nodes)

    submit = add(
        "submit",
        "Start a training job on the ready nodes (torchrun, c10d rendezvous on the first "
        "node by private IP) and print its job id. Refuses when nodes are missing or not ready, and while "
        "another job is active: a cluster runs one job at a time.",
        epilog="Before any node is touched the job's record is written to the stack's job table (stack output "
        "JobTableName): the config file's content (for a path in the bundle; an absolute path on the nodes is "
        "recorded as a path), the --set items, the nodes, the rendezvous host, state starting; the same write "
        "takes the cluster's one-job lock. If some nodes fail to start the job, it is recorded as failed (the "
        "lock is given back) and stopped where it started. A stack deployed before the job table is refused: "
        "redeploy it. Several jobs at once: deploy several stacks (--stack).",
    )
    submit.add_argument("--config", required=True, help="training TOML, e.g. training/configs/llama3-8b.toml")
    submit.add_argument("--nodes", type=_positive_int, help="nodes to use (default: the stack's NodeCount)")
    submit.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="training config override, repeatable (e.g. --set optim.lr=3e-4)",
    )
    submit.add_argument(
        "--max-restarts",
        type=int,
        default=3,
        help="torchrun --max-restarts: whole-job restarts after a failure (default 3)",
    )
    submit.add_argument(
        "--resume-from",
        metavar="JOB",
        default="",
        help="start from the newest complete checkpoint of an earlier job (its /fsx/checkpoints/JOB); the new "
        "job saves only to its own directory. Without it a job starts fresh (each job has its own directory).",
    )
    submit.set_defaults(handler=job_commands.submit)

    commcheck = add(
        "commcheck",
        "Check NCCL all_reduce bandwidth across the ready nodes before a costly run: a job of "
        "`python -m training.commcheck` (torchrun, one process per GPU), submitted like `submit`. "
        "Prints the job id; read the result with `clusterctl status JOB` (busbw) and `clusterctl logs JOB`.",
        epilog="busbw is nccl-tests' bus bandwidth, algbw x 2(n-1)/n for n ranks. Reference over EFA: "
        "2 x p5.48xlarge about 440-480 GB/s for 1-16 GiB messages, about 350 GB/s at 4-16 nodes. Far less, "
        "or `Socket` in status's NETWORK column, means NCCL is not on EFA. The job fails (exit 1 on the "
        "nodes, state failed) when --min-busbw-gbps is given and busbw at the largest size is below it.",
    )
    commcheck.add_argument("--nodes", type=_positive_int, help="nodes to use (default: the stack's NodeCount)")
    commcheck.add_argument(
        "--min-busbw-gbps",
        type=_positive_float,
        metavar="GBPS",
        help="fail the job when busbw at the largest size is below this, e.g. 400 for 2 p5 nodes, 300 for "
        "4-16 (default: no threshold)",
    )
    commcheck.add_argument(
        "--sizes-mib",
        type=_sizes_mib,
        metavar="N,N,...",
        help="message sizes per GPU in MiB (default on the nodes: 64,256,1024,4096,16384)",
    )
    commcheck.add_argument("--iters", type=_positive_int, help="timed all_reduce calls per size (default 20)")
    commcheck.add_argument(
        "--warmup-iters", type=_non_negative_int, help="untimed all_reduce calls per size first (default 5)"
    )
    commcheck.add_argument(
        "--dtype", choices=("bfloat16", "float32"), help="element type (default bfloat16)"
    )
    commcheck.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="torchrun --max-restarts (default 0: a failed check is an answer, not something to retry)",
    )
    commcheck.set_defaults(handler=job_commands.commcheck)

    jobs = add(
        "jobs",
        "The jobs in the stack's job table, newest first: state, attempt, nodes, start, last step, and the "
        "cost so far (each attempt's nodes x its hours x the catalog's on-demand price); then the active job.",
    )
    jobs.add_argument("--limit", type=_positive_int, default=20, help="show at most this many jobs (default 20)")
    jobs.set_defaults(handler=job_commands.jobs_list)

    status = add(
        "status",
        "The job's record (state, and every attempt: nodes, rendezvous host, start, end, reason, step reached, "
        "step resumed from, steps lost at the restart), then per node of its current attempt: running, "
        "succeeded, failed (exit code) or cancelled; last step and loss (for a commcheck: its all_reduce "
        "busbw); the network NCCL chose (Libfabric/efa is EFA, Socket is TCP).",
        epilog="The nodes' answers are copied into the job's record. A job not in the job table (older, or a "
        "stack without one) is found in SSM's command history (30 days). "
        "Exits 1, with a warning on stderr naming the nodes, when a job of more than one node has "
        "NCCL on TCP (Socket, or a libfabric provider other than efa) instead of EFA on any node; exits 1 when "
        "a node did not answer (state unknown); a job found in SSM's history exits 1 with one line when no "
        "node has it or all of its nodes are gone. Nodes the Auto Scaling group replaced are shown as gone "
        "(replaced) and not asked.",
    )
    status.add_argument("job_id", metavar="JOB")
    status.set_defaults(handler=job_commands.status)

    logs = add("logs", "A job's output from CloudWatch Logs, all nodes interleaved by time.")
    logs.add_argument("job_id", metavar="JOB")
    logs.add_argument("--node", metavar="INSTANCE_ID", help="only this node's log")
    logs.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until Ctrl-C")
    logs.set_defaults(handler=commands.logs)

    cancel = add(
        "cancel",
        "Record the job as cancelled (so it is never restarted, and the cluster takes the next job), then "
        "SIGTERM it on every node of its current attempt that is left (replaced nodes are shown as gone) so "
        "the trainer checkpoints, and kill what is left after the timeout.",
        epilog="A job that already ended (succeeded, failed, cancelled) is left alone: one line, exit 0, nothing "
        "sent. A job not in the job table is stopped on the nodes of its start command (SSM's history). "
        "Exits 1 when a node still reports the job running or did not answer.",
    )
    cancel.add_argument("job_id", metavar="JOB")
    cancel.add_argument(
        "--timeout-seconds",
        type=int,
        default=STOP_GRACE_SECONDS,
        help=f"seconds between SIGTERM and SIGKILL, 0-{MAX_CANCEL_TIMEOUT_SECONDS} (default %(default)s)",
    )
    cancel.set_defaults(handler=job_commands.cancel)

    cost = add(
        "cost",
        "Estimated on-demand cost from the instance catalog: for a plan (--instance-type, "
        "--nodes, --hours) or for a job so far (--job).",
    )
    cost.add_argument("--instance-type", type=_instance_type, default="p5.48xlarge")
    cost.add_argument("--nodes", type=_positive_int)
    cost.add_argument("--hours", type=_non_negative_hours, help="hours of the plan (a number >= 0)")
    cost.add_argument(
        "--job",
        metavar="JOB",
        help="a submitted job: its node-hours so far (from the job table: each attempt's nodes x its hours; for an "
        "older job: its nodes x the time since it started)",
    )
    cost.set_defaults(handler=commands.cost)

    top_view.add_parser(add)
    return parser


def main(argv: Sequence[str] | None = None, runtime: Runtime | None = None) -> int:
    runtime = runtime or Runtime()
    args = build_parser().parse_args(argv)
    try:
        if runtime.context is None:
            runtime.context = build_context(args.region, args.profile)
        return int(args.handler(args, runtime) or 0)
    except KeyboardInterrupt:
        print("clusterctl: interrupted", file=runtime.err)
        return 130
    except Exception as error:  # noqa: BLE001 - every error ends as one line unless --debug
        region = runtime.context.region if runtime.context else args.region
        if isinstance(error, UnknownInstanceType | botocore.exceptions.ParamValidationError):
            message, code = str(error), EXIT_USAGE
        else:
            mapped = describe_aws_error(error, region)
            message, code = (
                (mapped.args[0], mapped.exit_code)
                if mapped
                else (
                    f"unexpected {type(error).__name__}: {error} (rerun with --debug for the traceback)",
                    EXIT_FAILED,
                )
            )
        if args.debug:
            traceback.print_exc(file=runtime.err)
        print(f"clusterctl: error: {one_line(message)}", file=runtime.err)  # one line, whatever it says
        return code


if __name__ == "__main__":
    sys.exit(main())
