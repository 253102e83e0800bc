"""`python3 -m node_bootstrap monitor [--once] [--dry-run] [--json] | --follow`: the node health monitor.

With --once (what the systemd timer runs) one round, then exit: 0 healthy (warnings included), 1 unhealthy.
Without it, a round every monitor.intervalSeconds until SIGTERM, for hosts without systemd. --dry-run runs
the read-only probes, prints the mutating commands it would run and saves no state, so the next real round
still sees the same new events. --follow (what the follower service runs) follows the kernel log and answers
a fatal Xid at once (follow.py); it returns only when the kernel log ends (exit 2; systemd restarts it).
"""

from __future__ import annotations

import json
import logging
import time
from typing import Callable

from node_bootstrap.config import NodeConfig
from node_bootstrap.host import Host
from node_bootstrap.imds import Imds, InstanceIdentity
from node_bootstrap.logs import MONITOR_LOG_FILE, setup_logging
from node_bootstrap.monitor.actions import Responder
from node_bootstrap.monitor.follow import follow_kernel_log, open_kernel_log_stream
from node_bootstrap.monitor.rounds import RoundOutcome, run_round
from node_bootstrap.runner import Runner

LOG = logging.getLogger("node_bootstrap")

EXIT_HEALTHY = 0
EXIT_UNHEALTHY = 1
EXIT_ERROR = 2  # usage, node config, or the log file cannot be opened


def run_monitor(args, config: NodeConfig, host: Host, runner: Runner, imds: Imds, *,
                print_fn: Callable[[str], None] = print, sleep: Callable[[float], None] = time.sleep,
                max_rounds: int | None = None) -> int:
    try:
        setup_logging(host, to_file=not args.dry_run, verbose=args.verbose, log_file=MONITOR_LOG_FILE,
                      to_stdout=not args.json)
    except OSError as e:
        print_fn(f"node_bootstrap: cannot open {MONITOR_LOG_FILE} under {host.root}: {e}")
        return EXIT_ERROR
    identity = _identity_for(imds, config, dry_run=args.dry_run)
    responder = Responder(config, host, runner, identity)
    if getattr(args, "follow", False):
        return _follow(host, runner, responder, print_fn)
    if args.once or args.dry_run:
        outcome = run_round(config, host, runner, responder, dry_run=args.dry_run)
        print_fn(_render(outcome, json_output=args.json, dry_run=args.dry_run))
        return EXIT_UNHEALTHY if outcome.unhealthy is not None else EXIT_HEALTHY
    if not config.monitor.enabled:
        print_fn("node_bootstrap: the monitor is off (monitor.intervalSeconds is 0); --once runs a round anyway")
        return EXIT_ERROR
    rounds = 0
    while max_rounds is None or rounds < max_rounds:
        run_round(config, host, runner, responder)
        rounds += 1
        if max_rounds is None or rounds < max_rounds:
            sleep(config.monitor.interval_seconds)
    return EXIT_HEALTHY


def _follow(host: Host, runner: Runner, responder: Responder, print_fn: Callable[[str], None]) -> int:
    try:
        stream = open_kernel_log_stream(host, runner)
    except OSError as e:
        LOG.error("monitor: cannot follow the kernel log: %s", e.strerror or e)
        return EXIT_ERROR
    try:
        follow_kernel_log(host, responder, stream)
    finally:
        stream.close()
    LOG.error("monitor: the kernel log (%s) ended: stopping (systemd starts the follower again)", stream.source)
    return EXIT_ERROR


def _identity_for(imds: Imds, config: NodeConfig, *, dry_run: bool) -> Callable[[], InstanceIdentity]:
    """IMDS is asked only when a response needs the instance id; a dry run off EC2 shows a placeholder."""
    def identity() -> InstanceIdentity:
        try:
            return imds.identity()
        except Exception:
            if dry_run:
                return InstanceIdentity("<instance-id>", config.region)
            raise
    return identity


def _render(outcome: RoundOutcome, *, json_output: bool, dry_run: bool) -> str:
    report = outcome.report
    if json_output:
        return json.dumps({
            "healthy": outcome.unhealthy is None,
            "checks": [{"name": c.name, "status": c.status, "detail": c.detail} for c in report.checks],
            "newXidEvents": [{"code": e.code, "pciBusId": e.pci_bus_id, "action": e.verdict.action,
                              "reason": e.verdict.reason} for e in report.new_xid_events],
            "unhealthy": None if outcome.unhealthy is None else {
                "reason": outcome.unhealthy.reason, "since": outcome.unhealthy.since,
                "done": list(outcome.unhealthy.done)},
            "dryRun": dry_run,
        }, indent=2)
    lines = [report.format_table(), ""]
    if outcome.unhealthy is None:
        lines.append(f"HEALTHY ({len(report.warnings)} warning(s))")
    else:
        lines.append(f"UNHEALTHY since {outcome.unhealthy.since}: {outcome.unhealthy.reason}")
        if dry_run:
            lines.append("(dry run: the commands above were printed, not run; no state was saved)")
        else:
            lines.append("responses done: " + (", ".join(outcome.unhealthy.done) or "none"))
    return "\n".join(lines)
