"""`clusterctl top`: collect the cluster's view from CloudWatch and the job table (clusterctl.watch.collect),
render it (clusterctl.watch.view) once or live, refreshed every --interval seconds."""

from __future__ import annotations

import argparse
import dataclasses

from rich.console import Console
from rich.live import Live

from cluster_aws.stack_outputs import read_stack_outputs
from clusterctl.arguments import AddCommand
from clusterctl.render import to_json
from clusterctl.runtime import Runtime
from clusterctl.watch.collect import collect
from clusterctl.watch.view import PLAIN_WIDTH, render

DEFAULT_INTERVAL_S = 15.0


def make_console(runtime: Runtime) -> Console:
    terminal = hasattr(runtime.out, "isatty") and runtime.out.isatty()
    return Console(file=runtime.out, width=None if terminal else PLAIN_WIDTH, force_terminal=terminal or None)


def top(args: argparse.Namespace, runtime: Runtime) -> int:
    context = runtime.context
    assert context is not None
    outputs = read_stack_outputs(context.client("cloudformation"), args.stack, context.region)
    view = collect(context.client, outputs, runtime.now())
    if args.json:
        print(to_json(dataclasses.asdict(view)), file=runtime.out, flush=True)
        return 0
    console = make_console(runtime)
    if args.once:
        console.print(render(view))
        return 0
    try:
        with Live(render(view), console=console, auto_refresh=False, transient=False) as live:
            while True:
                runtime.sleep(args.interval)
                live.update(render(collect(context.client, outputs, runtime.now())), refresh=True)
    except KeyboardInterrupt:  # Ctrl-C is how a live view ends
        return 0


def interval(text: str) -> float:
    value = float(text)
    if not 1 <= value <= 3600:
        raise argparse.ArgumentTypeError(f"{text}: allowed: 1 to 3600 seconds")
    return value


def add_parsers(add: AddCommand) -> None:
    """Register `top` with cli.build_parser's `add` helper."""
    parser = add(
        "top",
        "A live view of the cluster from CloudWatch: per node GPU utilization, memory, temperature, power and "
        "EFA throughput; the active job's state and attempt, step, loss, tokens/s, MFU and ETA; the estimated "
        "cost so far.",
        epilog="Data comes from the nodes' CloudWatch agent and EMF metrics (docs/observability.md), at the "
        "stack's metrics interval (output MetricsIntervalSeconds): a refresh faster than that only repeats. "
        "The job is the one the job table names active (stack output JobTableName; on a stack deployed before "
        "it: the job with the newest step metric in the last 3 hours). Each refresh is a few GetMetricData "
        "calls, billed per metric asked for, and two DynamoDB GetItem reads.",
        example="clusterctl top --interval 30",
    )
    parser.add_argument("--once", action="store_true", help="print one snapshot and exit (for scripts)")
    parser.add_argument("--interval", type=interval, default=DEFAULT_INTERVAL_S, metavar="SECONDS",
                        help="seconds between refreshes (default %(default)s)")
    parser.set_defaults(handler=top)
