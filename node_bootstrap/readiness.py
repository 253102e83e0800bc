"""Step 5, signal: tell operators (and the Auto Scaling group) how the bootstrap went.

Success: tag the instance `cluster:bootstrap=ready` (and drop a stale failure reason). Failure: tag it
`failed` with `cluster:bootstrap-reason`, and mark it Unhealthy so the group replaces it. The instance is
usually still inside the group's health-check grace period while it bootstraps, and SetInstanceHealth respects
that period by default (Auto Scaling API reference, SetInstanceHealth, ShouldRespectGracePeriod), so the call
passes --no-should-respect-grace-period: a broken node should not sit out the grace period.
"""

from __future__ import annotations

import json
import logging
from collections.abc import Sequence
from typing import Callable

from node_bootstrap.errors import StepError
from node_bootstrap.imds import InstanceIdentity
from node_bootstrap.plan import StepPlan
from node_bootstrap.runner import Runner

LOG = logging.getLogger("node_bootstrap")

TAG_STATE = "cluster:bootstrap"
TAG_REASON = "cluster:bootstrap-reason"
MAX_TAG_VALUE_CHARS = 256  # EC2 tag values hold at most 256 Unicode characters
AWS_TIMEOUT_S = 60.0


def build_reason(text: str) -> str:
    """One line of at most 256 characters (an EC2 tag value)."""
    line = " ".join(text.split())
    if len(line) <= MAX_TAG_VALUE_CHARS:
        return line
    return line[: MAX_TAG_VALUE_CHARS - 3] + "..."


def read_tags(identity: InstanceIdentity, runner: Runner) -> dict[str, str]:
    result = runner.run(
        ["aws", "ec2", "describe-tags", "--region", identity.region,
         "--filters", "Name=resource-id,Values=" + identity.instance_id, "--output", "json"],
        mutating=False, check=False,
    )
    if not result.ok:
        raise StepError(f"cannot read this instance's tags: {result.describe_failure()}")
    try:
        tags = json.loads(result.stdout).get("Tags", [])
    except (ValueError, AttributeError):
        raise StepError("aws ec2 describe-tags printed something that is not its JSON output") from None
    return {t["Key"]: t.get("Value", "") for t in tags if isinstance(t, dict) and "Key" in t}


def plan_ready(identity: InstanceIdentity, runner: Runner, *, warnings: Sequence[str] = (),
               on_ready: Callable[[], None] | None = None) -> StepPlan:
    """Tag the node ready. `warnings` (non-fatal step failures) go on the reason tag of the ready node, so
    an operator sees that, say, its logs are not shipped; `on_ready` runs once the node is newly ready."""
    plan = StepPlan("signal")
    tags = read_tags(identity, runner)
    wanted_reason = build_reason("ready with warnings: " + "; ".join(warnings)) if warnings else None
    if tags.get(TAG_STATE) != "ready" or (wanted_reason and tags.get(TAG_REASON) != wanted_reason):
        wanted = {TAG_STATE: "ready", **({TAG_REASON: wanted_reason} if wanted_reason else {})}
        plan.add(f"tag {identity.instance_id} {TAG_STATE}=ready" + (" with its warnings" if warnings else ""),
                 argv=_create_tags(identity, wanted))
        if on_ready is not None and tags.get(TAG_STATE) != "ready":
            plan.add("record the successful bootstrap on the Auto Scaling group (ends a failure streak)",
                     apply=on_ready)
    if TAG_REASON in tags and not wanted_reason:
        plan.add(f"remove the stale {TAG_REASON} tag",
                 argv=("aws", "ec2", "delete-tags", "--region", identity.region,
                       "--resources", identity.instance_id, "--tags", "Key=" + TAG_REASON))
    if not plan.actions:
        plan.note(f"{identity.instance_id} is already tagged {TAG_STATE}=ready")
    return plan


def signal_failure(identity: InstanceIdentity, runner: Runner, reason: str) -> None:
    """Tag the instance failed with the reason and mark it Unhealthy; raises CommandError if either fails."""
    # past_deadline: reporting a failure must work after the bootstrap deadline, which may be the failure.
    runner.run(_create_tags(identity, {TAG_STATE: "failed", TAG_REASON: build_reason(reason)}), mutating=True,
               timeout=AWS_TIMEOUT_S, past_deadline=True)
    runner.run(
        ["aws", "autoscaling", "set-instance-health", "--region", identity.region,
         "--instance-id", identity.instance_id, "--health-status", "Unhealthy",
         "--no-should-respect-grace-period"],
        mutating=True, timeout=AWS_TIMEOUT_S, past_deadline=True,
    )


def _create_tags(identity: InstanceIdentity, tags: dict[str, str]):
    # JSON, not the Key=..,Value=.. shorthand: a reason may contain commas, which the shorthand splits on.
    tag_list = json.dumps([{"Key": k, "Value": v} for k, v in tags.items()])
    return ("aws", "ec2", "create-tags", "--region", identity.region, "--resources", identity.instance_id,
            "--tags", tag_list)
