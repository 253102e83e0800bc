"""`python3 -m node_bootstrap {run,check,monitor}`: the boot sequence, the node-verification check, and the
node health monitor."""

from __future__ import annotations

import argparse
import os
import shlex
import sys
import time
from collections.abc import Sequence
from typing import Callable

from node_bootstrap.bootstrap import (
    EXIT_FAILED,
    EXIT_OK,
    EXIT_USAGE,
    STEPS,
    Node,
    run_bootstrap,
    select_steps,
)
from node_bootstrap.config import DEFAULT_CONFIG_PATH, ConfigError, NodeConfig, load_node_config
from node_bootstrap.deadline import Deadline
from node_bootstrap.fp8_check import Fp8Probe
from node_bootstrap.health import probe_commands, run_health_checks
from node_bootstrap.host import Host
from node_bootstrap.imds import Imds
from node_bootstrap.imds_block import MetadataProbe
from node_bootstrap.logs import LOG_FILE, MONITOR_LOG_FILE, setup_logging
from node_bootstrap.monitor.command import run_monitor
from node_bootstrap.monitor.state import STATE_PATH
from node_bootstrap.runner import Runner

DESCRIPTION = """\
Bootstrap and verify a GPU training node (stdlib only, Python >= 3.9).

  run      the boot sequence user-data runs: {}
  check    the health checks alone (GPUs, ECC, row remapping, Xid, EFA, the job user's metadata block):
           run it before a costly job
  monitor  the node health monitor: --once runs one round (what its systemd timer runs every
           monitor.intervalSeconds), --follow answers a fatal Xid in the kernel log at once; an
           unhealthy node stops its job, tags itself and is replaced
""".format(", ".join(STEPS))

RUN_EPILOG = f"""\
exit status: 0 ready (or dry-run plan complete); 1 failed, instance not marked (dry run, --skip signal, or
tagging failed); 2 usage or node-config error; 3 failed, instance tagged cluster:bootstrap=failed and marked
Unhealthy. Logs go to stdout and {LOG_FILE}."""

CHECK_EPILOG = "exit status: 0 healthy, 1 unhealthy, 2 usage or node-config error."

MONITOR_EPILOG = f"""\
exit status: 0 healthy (warnings included), 1 unhealthy (this round or an earlier one), 2 usage, node-config
or log-file error. Logs go to stdout and {MONITOR_LOG_FILE}; state is kept in {STATE_PATH}."""


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    common.add_argument("--config", default=DEFAULT_CONFIG_PATH, metavar="PATH",
                        help="node config JSON, a path on the node (default: %(default)s)")
    common.add_argument("--root", default="/", metavar="DIR",
                        help="treat DIR as the node's / for every file read or written (tests; default: /)")

    parser = argparse.ArgumentParser(prog="python3 -m node_bootstrap", description=DESCRIPTION,
                                     formatter_class=argparse.RawDescriptionHelpFormatter)
    sub = parser.add_subparsers(dest="command", metavar="{run,check,monitor}")
    sub.required = True

    run = sub.add_parser("run", parents=[common], help="run the boot sequence", epilog=RUN_EPILOG,
                         description=f"Run the boot sequence: {', '.join(STEPS)}. Each step checks before "
                                     "it acts, so running it again changes nothing.")
    run.add_argument("--only", action="append", default=[], choices=STEPS, metavar="STEP",
                     help=f"run only this step (repeatable); one of: {', '.join(STEPS)}")
    run.add_argument("--skip", action="append", default=[], choices=STEPS, metavar="STEP",
                     help="skip this step (repeatable); --skip signal sets no tag and no Unhealthy mark")
    run.add_argument("--dry-run", action="store_true",
                     help="print the plan (mutating commands and file changes) without executing it; "
                          "read-only probes still run, so the plan reflects this machine")
    run.add_argument("-v", "--verbose", action="store_true", help="also log every command run")

    check = sub.add_parser("check", parents=[common], help="run the health checks only", epilog=CHECK_EPILOG,
                           description="Check GPUs (count, memory, ECC, row remapping), Xid events since "
                                       "boot and EFA devices against the node config's expected counts, and "
                                       "that the job user cannot connect to the instance metadata service.")
    check.add_argument("--dry-run", action="store_true",
                       help="print the read-only commands the checks would run, without running them")
    check.add_argument("--json", action="store_true", help="print the report as JSON instead of a table")

    monitor = sub.add_parser(
        "monitor", parents=[common], help="the node health monitor", epilog=MONITOR_EPILOG,
        description="Check the node (GPUs, ECC, row remapping, new Xid events, EFA, throttling, NVLink) and, "
                    "when it is unhealthy, SIGTERM its job, tag it cluster:health=unhealthy, write the finding "
                    "to CloudWatch Logs and mark it Unhealthy in its Auto Scaling group; warnings are logged "
                    "and published as the TrainingCluster/NodeHealthWarnings metric.")
    monitor.add_argument("--once", action="store_true",
                         help="run one round and exit (what the systemd timer runs); without it, a round every "
                              "monitor.intervalSeconds until stopped")
    monitor.add_argument("--dry-run", action="store_true",
                         help="one round that prints what it would do: read-only probes run, mutating commands "
                              "are printed, no state is saved")
    monitor.add_argument("--json", action="store_true", help="print the round's report as JSON")
    monitor.add_argument("--follow", action="store_true",
                         help="follow the kernel log and answer a fatal Xid at once, without waiting for a "
                              "round (what the follower service runs); runs until stopped")
    monitor.add_argument("-v", "--verbose", action="store_true", help="also log every command run")
    return parser


def main(argv: Sequence[str] | None = None, *, make_runner: Callable[[bool], Runner] | None = None,
         imds: Imds | None = None, sleep: Callable[[float], None] = time.sleep) -> int:
    """Entry point; the keyword arguments are the seams tests use (command runner, IMDS, sleep)."""
    parser = build_parser()
    try:
        args = parser.parse_args(argv)
    except SystemExit as e:  # argparse exits 2 on bad usage and 0 for --help
        return int(e.code or 0)
    make_runner = make_runner or (lambda dry_run: Runner(dry_run=dry_run))
    host = Host(args.root, dry_run=args.dry_run)
    if not os.path.isabs(args.config):
        if host.root != "/":
            print(f"node_bootstrap: --config={args.config!r}: with --root it must be an absolute path on the node",
                  file=sys.stderr)
            return EXIT_USAGE
        args.config = os.path.abspath(args.config)  # relative to the working directory, as a user means it
    try:
        config = load_node_config(host.path(args.config))
    except ConfigError as e:
        print(f"node_bootstrap: {e}", file=sys.stderr)
        return EXIT_USAGE
    runner = make_runner(args.dry_run)
    if args.command == "check":
        return _check(args, config, host, runner)
    if args.command == "monitor" and args.follow and (args.once or args.dry_run or args.json):
        print("node_bootstrap: monitor --follow takes no --once, --dry-run or --json", file=sys.stderr)
        return EXIT_USAGE
    if args.command == "monitor":
        return run_monitor(args, config, host, runner, imds or Imds(), sleep=sleep)
    return _run(args, config, host, runner, imds or Imds(), sleep)


def _run(args, config: NodeConfig, host: Host, runner: Runner, imds: Imds, sleep) -> int:
    try:
        steps = select_steps(args.only, args.skip)
    except ValueError as e:
        print(f"node_bootstrap: {e}", file=sys.stderr)
        return EXIT_USAGE
    if not steps:
        print("node_bootstrap: --only/--skip leave no step to run", file=sys.stderr)
        return EXIT_USAGE
    try:
        setup_logging(host, to_file=not args.dry_run, verbose=args.verbose)
    except OSError as e:
        print(f"node_bootstrap: cannot open {LOG_FILE} under {args.root}: {e}", file=sys.stderr)
        return EXIT_FAILED
    if not args.dry_run:
        # One clock for the whole boot: every command's timeout and every retry sleep is cut to what is left.
        runner.deadline = Deadline(config.bootstrap.deadline_seconds)
    node = Node(config=config, host=host, runner=runner, imds=imds, sleep=sleep, dry_run=args.dry_run)
    return run_bootstrap(node, steps)


def _check(args, config: NodeConfig, host: Host, runner: Runner) -> int:
    if args.dry_run:
        print("check would run these read-only commands:")
        for argv in probe_commands(runner, Fp8Probe.for_node(config, host), MetadataProbe.for_node(config, host)):
            print(f"  $ {shlex.join(argv)}")
        return EXIT_OK
    report = run_health_checks(config.expected, config.instance_type, runner, Fp8Probe.for_node(config, host),
                               MetadataProbe.for_node(config, host))
    print(report.to_json() if args.json else report.format_table())
    return EXIT_OK if report.healthy else EXIT_FAILED


if __name__ == "__main__":  # pragma: no cover
    sys.exit(main())
