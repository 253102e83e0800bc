"""The boot sequence, written once: each step probes, plans and acts; any failure is made visible.

Order and why:
  logging   first, so the CloudWatch agent ships the log of every later step, failures included
  scratch   instance-store NVMe as one fast scratch directory
  lustre    FSx for Lustre at /fsx: training data and checkpoints
  packages  the training lock (torchao) from the bundle's wheels, layered on the DLAMI's PyTorch
  health    the gate: GPUs, ECC, row remapping, Xid, EFA against the catalog, FP8 on every GPU, and (once the
            job user exists) its metadata block
  jobuser   the unprivileged user jobs run as, in the GPU and EFA devices' groups; /scratch and its home root's
  imdsblock the job user's traffic to the instance metadata service rejected (no node credentials for jobs),
            again at every boot, verified by connecting as that user
  training  the training package importable in the DLAMI's PyTorch, and the job environment file
  monitor   the node health monitor's first round, then its systemd timer (monitor/service.py)
  signal    cluster:bootstrap=ready
Only what makes the node unusable is fatal. A failure in `logging` (the CloudWatch agent) is logged and
reported on the ready node's `cluster:bootstrap-reason` tag; a failure in any other step stops the sequence,
is logged with its reason, counts towards protected mode (protection.py), tags the instance failed with that
reason and marks it Unhealthy in its Auto Scaling group (unless `signal` is skipped or this is a dry run).

The whole sequence has one deadline (node config bootstrap.deadlineSeconds): commands and retry sleeps are cut
to the time left, and a watchdog thread marks the node failed, naming the step it was stuck in, and ends the
process if the deadline passes anyway (deadline.py).
"""

from __future__ import annotations

import logging
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable

from node_bootstrap import protection
from node_bootstrap.cloudwatch import plan_logging
from node_bootstrap.config import NodeConfig
from node_bootstrap.deadline import DeadlineExceeded, Watchdog
from node_bootstrap.errors import StepError
from node_bootstrap.fp8_check import Fp8Probe
from node_bootstrap.health import HealthGateFailed, plan_health
from node_bootstrap.host import Host
from node_bootstrap.imds import Imds, ImdsError, InstanceIdentity
from node_bootstrap.imds_block import MetadataProbe, plan_imds_block
from node_bootstrap.job_user import plan_job_user
from node_bootstrap.lustre import plan_lustre
from node_bootstrap.monitor.rounds import run_round
from node_bootstrap.monitor.service import plan_monitor, require_healthy
from node_bootstrap.packages import plan_packages
from node_bootstrap.plan import StepPlan, execute_plan
from node_bootstrap.readiness import build_reason, plan_ready, signal_failure
from node_bootstrap.runner import CommandError, Runner
from node_bootstrap.scratch import plan_scratch
from node_bootstrap.training_env import plan_training

LOG = logging.getLogger("node_bootstrap")

STEPS = ("logging", "scratch", "lustre", "packages", "health", "jobuser", "imdsblock", "training", "monitor",
         "signal")
SIGNALLED_MARKER = "/var/lib/cluster/bootstrap-signalled"  # user_data.sh reads it: do not signal again
# Steps whose failure leaves the node usable: logged and reported, never a reason to replace a healthy P5.
NONFATAL_STEPS = frozenset({"logging"})

EXIT_OK = 0
EXIT_FAILED = 1  # failed, and the instance was not (or could not be) tagged and marked Unhealthy
EXIT_USAGE = 2  # bad arguments or node config
EXIT_FAILED_SIGNALLED = 3  # failed, tagged failed and marked Unhealthy: user-data must not signal again


@dataclass
class Node:
    """Everything the steps share: the config, the file system under the root, the command seam, IMDS."""

    config: NodeConfig
    host: Host
    runner: Runner
    imds: Imds
    sleep: Callable[[float], None]
    dry_run: bool = False
    print_fn: Callable[[str], None] = print
    exit_fn: Callable[[int], None] = os._exit  # how the watchdog ends a process stuck past the deadline
    _identity: InstanceIdentity | None = field(default=None, repr=False)

    def identity(self) -> InstanceIdentity:
        if self._identity is None:
            try:
                self._identity = self.imds.identity()
            except ImdsError as e:
                raise StepError(f"cannot identify this instance: {e}") from None
        return self._identity


def select_steps(only: Sequence[str] = (), skip: Sequence[str] = ()) -> list[str]:
    """STEPS in their fixed order, restricted by --only and --skip (unknown names raise ValueError)."""
    for name in list(only) + list(skip):
        if name not in STEPS:
            raise ValueError(f"unknown step {name!r}; allowed: {', '.join(STEPS)}")
    return [s for s in STEPS if (not only or s in only) and s not in skip]


def _planners(node: Node, warnings: list[str]) -> dict[str, Callable[[], StepPlan]]:
    c, h, r = node.config, node.host, node.runner
    return {
        "logging": lambda: plan_logging(c, h, r, sleep=node.sleep),
        "scratch": lambda: plan_scratch(c, h, r),
        "lustre": lambda: plan_lustre(c, h, r, sleep=node.sleep),
        "packages": lambda: plan_packages(c, h, r),
        "health": lambda: plan_health(c.expected, c.instance_type, r, Fp8Probe.for_node(c, h),
                                      MetadataProbe.for_node(c, h)),
        "jobuser": lambda: plan_job_user(c, h, r),
        "imdsblock": lambda: plan_imds_block(c, h, r),
        "training": lambda: plan_training(c, h, r),
        "monitor": lambda: plan_monitor(c, h, r, first_round=lambda: require_healthy(
            run_round(c, h, r, responder=None, dry_run=node.dry_run))),
        "signal": lambda: plan_ready(node.identity(), r, warnings=warnings,
                                     on_ready=lambda: protection.record_success(node.identity(), r, c.bootstrap)),
    }


def run_bootstrap(node: Node, steps: Sequence[str]) -> int:
    """Run `steps` in order under the deadline; returns one of the EXIT_* codes."""
    warnings: list[str] = []
    planners = _planners(node, warnings)
    LOG.info("node_bootstrap %s: steps %s%s", node.config.instance_type, ", ".join(steps),
             " (dry run: nothing is changed)" if node.dry_run else "")
    state = {"step": "startup"}
    signalled = threading.Lock()  # the watchdog and the main thread must not both signal

    def on_deadline(what: str) -> None:
        if not signalled.acquire(blocking=False):
            return
        seconds = node.config.bootstrap.deadline_seconds
        reason = f"deadline: the bootstrap did not finish within {seconds} s (stuck in {what})"
        LOG.error("bootstrap failed: %s", reason)
        node.exit_fn(_signal_failure(node, steps, reason, f"deadline:{state['step']}"))

    watchdog = None
    if not node.dry_run:
        watchdog = Watchdog(node.config.bootstrap.deadline_seconds, on_deadline,
                            what=lambda: f"step {state['step']}").start()
    try:
        reason, key = _run_steps(node, steps, planners, state, warnings,
                                 stop=watchdog.fired if watchdog is not None else None)
    finally:
        if watchdog is not None:
            watchdog.stop()
    if reason is None:
        if warnings:
            LOG.warning("bootstrap complete with warnings: %s", "; ".join(warnings))
        LOG.info("bootstrap %s", "plan complete (dry run)" if node.dry_run else "complete: node is ready")
        return EXIT_OK
    if not signalled.acquire(blocking=False):  # the watchdog got there first and is ending the process
        return EXIT_FAILED_SIGNALLED
    LOG.error("bootstrap failed in step %s", reason)
    return _signal_failure(node, steps, reason, key)


def _run_steps(node: Node, steps: Sequence[str], planners, state: dict, warnings: list[str],
               stop: threading.Event | None = None):
    """(None, None) when every fatal step succeeded, else (reason, protected-mode key) of the first failure.

    `stop` is the watchdog's: once it fired, no further step runs (the node is already marked failed)."""
    for step in steps:
        if stop is not None and stop.is_set():
            return f"deadline: stopped before step {step}", "deadline:" + state["step"]
        state["step"] = step
        LOG.info("== %s", step)
        try:
            execute_plan(planners[step](), node.runner, dry_run=node.dry_run, print_fn=node.print_fn)
        except (StepError, CommandError, OSError) as e:
            if step in NONFATAL_STEPS:
                LOG.warning("%s failed, the node stays usable: %s", step, e)
                warnings.append(f"{step}: {e}")
                continue
            return f"{step}: {e}", failure_key(step, e)
        except Exception as e:  # a bug must still leave a visible, replaceable node, not a silent one
            LOG.exception("unexpected error in step %s", step)
            return f"{step}: unexpected {type(e).__name__}: {e}", f"{step}:bug"
    return None, None


def failure_key(step: str, error: Exception) -> str:
    """What makes two failures "the same reason" for protected mode: the step, and the gate's failed checks."""
    if isinstance(error, HealthGateFailed):
        return "health:" + ",".join(sorted(c.name for c in error.report.failures))
    if isinstance(error, DeadlineExceeded):
        return "deadline:" + step
    return step


def _signal_failure(node: Node, steps: Sequence[str], reason: str, key: str) -> int:
    if "signal" not in steps:
        LOG.error("not tagging the instance failed: the signal step is skipped")
        return EXIT_FAILED
    if node.dry_run:
        node.print_fn(f"[signal] would tag the instance cluster:bootstrap=failed "
                      f"(reason {build_reason(reason)!r}) and mark it Unhealthy")
        return EXIT_FAILED
    try:
        identity = node.identity()
        # Protected mode first: the group must stop replacing before this node is marked Unhealthy.
        protection.record_failure(identity, node.runner, node.config.bootstrap, key, reason)
        signal_failure(identity, node.runner, reason)
    except (StepError, CommandError) as e:
        LOG.error("could not mark the instance failed and Unhealthy: %s", e)
        return EXIT_FAILED
    try:
        node.host.write_text(SIGNALLED_MARKER, build_reason(reason) + "\n")
    except OSError as e:  # the shim may then signal a second time: harmless, the reason tag is overwritten
        LOG.warning("could not write %s: %s", SIGNALLED_MARKER, e)
    LOG.error("tagged %s cluster:bootstrap=failed and marked it Unhealthy: its Auto Scaling group will "
              "replace it unless it is in protected mode", identity.instance_id)
    return EXIT_FAILED_SIGNALLED
