"""One round of the monitor: read the state, check the node, remember, respond.

The order makes every round safe to kill at any point: the new kernel-log cursor and a new finding are saved
before any response runs, so a round that dies mid-response leaves the responses for the next round to
finish, and never reads the same Xid events twice; after the responses the state is saved again with what
was done.

The kernel-log follower (follow.py) may find a fatal Xid while a round runs its checks: the round reads the
state again under `state_lock` before it records and responds, so it keeps the follower's finding and does not
repeat the responses the follower already did.

A job whose supervisor found its hang on this node (node_bootstrap/jobs/hang_origin.py) leaves a check request:
the next round says in its log what it found after the hang and removes the request; a fault it finds makes
the node unhealthy like any round's (the job keeper has restarted the job without the node where it could).

`responder=None` is report-only (the bootstrap's first round: the boot sequence signals a failure itself);
a dry run saves nothing and prints the mutating commands it would run.
"""

from __future__ import annotations

import contextlib
import json
import logging
from dataclasses import dataclass

from node_bootstrap.config import NodeConfig
from node_bootstrap.health import FAIL, WARN
from node_bootstrap.host import Host
from node_bootstrap.imds_block import MetadataProbe, check_block_service, check_metadata_blocked
from node_bootstrap.jobs.spec import utc_now
from node_bootstrap.monitor.actions import RESPONSES, Responder, unhealthy_reason
from node_bootstrap.monitor.checks import RoundReport, run_round_checks
from node_bootstrap.monitor.kernel_log import KernelLogRead, read_new_kernel_log
from node_bootstrap.monitor.state import CHECK_REQUEST_PATH, MonitorState, Unhealthy, load_state, save_state, state_lock
from node_bootstrap.runner import Runner

LOG = logging.getLogger("node_bootstrap")


@dataclass(frozen=True)
class RoundOutcome:
    report: RoundReport
    unhealthy: Unhealthy | None  # this round's finding, or the earlier one the node is still under
    newly_unhealthy: bool  # this round found it

    @property
    def pending(self) -> list[str]:
        """Responses still to do (an unhealthy node only)."""
        if self.unhealthy is None:
            return []
        return [r for r in RESPONSES if r not in self.unhealthy.done]


def run_round(config: NodeConfig, host: Host, runner: Runner, responder: Responder | None, *,
              dry_run: bool = False) -> RoundOutcome:
    state = load_state(host)
    kernel_log = read_new_kernel_log(host, runner, state.kernel_log)
    report = run_round_checks(config.expected, runner, kernel_log)
    # the metadata block, every round (issue 42): a block gone since the boot (flushed, or its unit failed at a
    # later boot) makes the node unhealthy, as a hardware fault does
    report = report.with_checks(check_metadata_blocked(MetadataProbe.for_node(config, host), runner),
                                check_block_service(runner))
    _log_report(report)
    # a dry run writes nothing, not even the lock file
    with contextlib.nullcontext() if dry_run else state_lock(host):
        outcome = _record_and_respond(host, responder, report, kernel_log, state, dry_run=dry_run)
    if responder is not None:  # outside the lock: an API call the follower need not wait for
        responder.publish_metrics(len(report.warnings), unhealthy=outcome.unhealthy is not None)
    _answer_check_request(host, outcome)
    return outcome


def _answer_check_request(host: Host, outcome: RoundOutcome) -> None:
    """The check a hang on this node asked for (its supervisor's request, root's file): this round was it (a
    dry run's host removes nothing)."""
    try:
        request = json.loads(host.read_text(CHECK_REQUEST_PATH, default="null"))
    except (OSError, ValueError):
        request = {}
    if request is None:
        return
    if not isinstance(request, dict):
        request = {}
    asked = "job {} attempt {}: {} (at {})".format(*(str(request.get(k, "?"))[:300] for k in
                                                     ("jobId", "attempt", "evidence", "at")))
    if outcome.unhealthy is None:
        LOG.warning("monitor: the check a hang on this node asked for (%s): healthy, %d warning(s)", asked,
                    len(outcome.report.warnings))
    else:
        LOG.error("monitor: the check a hang on this node asked for (%s): UNHEALTHY: %s", asked,
                  outcome.unhealthy.reason)
    with contextlib.suppress(FileNotFoundError):
        host.remove(CHECK_REQUEST_PATH)


def _record_and_respond(host: Host, responder: Responder | None, report: RoundReport, kernel_log: KernelLogRead,
                        state_before: MonitorState, *, dry_run: bool) -> RoundOutcome:
    current = state_before if dry_run else load_state(host)  # what the follower may have recorded meanwhile
    new_state = MonitorState(kernel_log=kernel_log.cursor if kernel_log.ok else state_before.kernel_log,
                             unhealthy=current.unhealthy)
    newly = False
    if not report.healthy:
        if new_state.unhealthy is None:
            new_state.unhealthy = Unhealthy(unhealthy_reason(report.reason()), utc_now())
            newly = True
            LOG.error("monitor: node UNHEALTHY: %s", new_state.unhealthy.reason)
        else:
            LOG.error("monitor: still unhealthy (found %s: %s)", new_state.unhealthy.since,
                      new_state.unhealthy.reason)
    elif new_state.unhealthy is not None:
        LOG.error("monitor: checks pass now, but this node was found unhealthy at %s (%s): it stays "
                  "unhealthy until it is replaced", new_state.unhealthy.since, new_state.unhealthy.reason)
    outcome = RoundOutcome(report, new_state.unhealthy, newly)

    if responder is None:  # report only: the caller acts on the outcome
        if not dry_run and new_state.unhealthy is None:
            save_state(host, new_state)
        return outcome
    if not dry_run:
        save_state(host, new_state)
    if new_state.unhealthy is not None:
        pending = outcome.pending
        if pending:
            responder.respond(new_state.unhealthy)
        else:
            LOG.info("monitor: already reported: every response is done (%s)", ", ".join(RESPONSES))
    if not dry_run:
        save_state(host, new_state)
    return outcome


def _log_report(report: RoundReport) -> None:
    for check in report.checks:
        if check.status == FAIL:
            LOG.error("monitor: FAIL %s: %s", check.name, check.detail)
        elif check.status == WARN:
            LOG.warning("monitor: WARN %s: %s", check.name, check.detail)
        else:
            LOG.debug("monitor: ok %s: %s", check.name, check.detail)
    if report.healthy:
        LOG.info("monitor: round done: healthy, %d warning(s)", len(report.warnings))
