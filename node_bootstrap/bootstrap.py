"""The boot sequence, written once: each step probes, plans and acts; any failure is made visible.

Order and why:
  logging   first, so the CloudWatch agent ships the log of every later step, failures included
  scratch   instance-store NVMe as one fast scratch directory
  lustre    FSx for Lustre at /fsx: training data and checkpoints
  health    the gate: GPUs, ECC, row remapping, Xid, EFA against the catalog
  jobuser   the unprivileged user jobs run as, in the GPU and EFA devices' groups, owning /scratch
  training  the training package importable in the DLAMI's PyTorch, and the job environment file
  signal    cluster:bootstrap=ready
A failure in any step stops the sequence, is logged with its reason, tags the instance failed with that
reason and marks it Unhealthy in its Auto Scaling group (unless `signal` is skipped or this is a dry run).
"""

from __future__ import annotations

import logging
from collections.abc import Sequence
from dataclasses import dataclass, field
from typing import Callable

from node_bootstrap.cloudwatch import plan_logging
from node_bootstrap.config import NodeConfig
from node_bootstrap.health import plan_health
from node_bootstrap.host import Host
from node_bootstrap.imds import Imds, ImdsError, InstanceIdentity
from node_bootstrap.job_user import plan_job_user
from node_bootstrap.lustre import plan_lustre
from node_bootstrap.plan import StepError, StepPlan, execute_plan
from node_bootstrap.readiness import build_reason, plan_ready, signal_failure
from node_bootstrap.runner import CommandError, Runner
from node_bootstrap.scratch import plan_scratch
from node_bootstrap.training_env import plan_training

LOG = logging.getLogger("node_bootstrap")

STEPS = ("logging", "scratch", "lustre", "health", "jobuser", "training", "signal")

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


def _planners(node: Node) -> dict[str, Callable[[], StepPlan]]:
    c, h, r = node.config, node.host, node.runner
    return {
        "logging": lambda: plan_logging(c, h, r),
        "scratch": lambda: plan_scratch(c, h, r),
        "lustre": lambda: plan_lustre(c, h, r, sleep=node.sleep),
        "health": lambda: plan_health(c.expected, c.instance_type, r),
        "jobuser": lambda: plan_job_user(c, h, r),
        "training": lambda: plan_training(c, h, r),
        "signal": lambda: plan_ready(node.identity(), r),
    }


def run_bootstrap(node: Node, steps: Sequence[str]) -> int:
    """Run `steps` in order; returns one of the EXIT_* codes."""
    planners = _planners(node)
    LOG.info("node_bootstrap %s: steps %s%s", node.config.instance_type, ", ".join(steps),
             " (dry run: nothing is changed)" if node.dry_run else "")
    current = "startup"
    try:
        for current in steps:
            LOG.info("== %s", current)
            execute_plan(planners[current](), node.runner, dry_run=node.dry_run, print_fn=node.print_fn)
    except (StepError, CommandError, OSError) as e:
        reason = f"{current}: {e}"
    except Exception as e:  # a bug must still leave a visible, replaceable node, not a silent one
        LOG.exception("unexpected error in step %s", current)
        reason = f"{current}: unexpected {type(e).__name__}: {e}"
    else:
        LOG.info("bootstrap %s", "plan complete (dry run)" if node.dry_run else "complete: node is ready")
        return EXIT_OK
    LOG.error("bootstrap failed in step %s", reason)
    return _signal_failure(node, steps, reason)


def _signal_failure(node: Node, steps: Sequence[str], reason: str) -> int:
    if "signal" not in steps:
        LOG.error("not tagging the instance failed: the signal step is skipped")
        return EXIT_FAILED
    if node.dry_run:
        node.print_fn(f"[signal] would tag the instance cluster:bootstrap=failed "
                      f"(reason {build_reason(reason)!r}) and mark it Unhealthy")
        return EXIT_FAILED
    try:
        identity = node.identity()
        signal_failure(identity, node.runner, reason)
    except (StepError, CommandError) as e:
        LOG.error("could not mark the instance failed and Unhealthy: %s", e)
        return EXIT_FAILED
    LOG.error("tagged %s cluster:bootstrap=failed and marked it Unhealthy: its Auto Scaling group will "
              "replace it", identity.instance_id)
    return EXIT_FAILED_SIGNALLED
