"""Protected mode: when nodes keep failing their bootstrap for the same reason, stop replacing them.

A systematic mistake (a wrong AMI, a missing permission, a file system that is not there) fails every node the
same way, and the group would replace each failed node with another that fails too: a night of P5 launches.
ParallelCluster's answer is "protected mode": after a number of consecutive bootstrap failures it stops
launching into the queue until an operator fixes the cause and restarts the fleet (ParallelCluster User Guide,
"Slurm cluster protected mode"). Here there is no head node, so each failing node does the bookkeeping itself,
on its own Auto Scaling group:

- it records its failure as a group tag `cluster:bootstrap-failure:<instance id>` = `<epoch s> <key> <reason>`
  (one key per instance, so nodes failing at the same moment never overwrite each other's record);
- it counts the failures since the last successful bootstrap (tag `cluster:bootstrap-last-success`), within
  the window, whose reason key equals its own (the failed step, and for the health gate the failed checks);
- at the threshold it suspends the group's ReplaceUnhealthy process (EC2 Auto Scaling User Guide, "Suspend
  and resume a process": unhealthy instances are then left alone instead of replaced), tags the group
  `cluster:protected` with the reason and publishes TrainingCluster/BootstrapProtectedMode=1, which alarms.
A node that boots cleanly records its success and publishes 0. Group tags are not propagated to instances.
Every call here is best effort: a failure to do the bookkeeping is logged and never blocks marking the node.
docs/operations.md ("Protected mode") says how to resume.
"""

from __future__ import annotations

import json
import logging
import time
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Callable

from node_bootstrap.config import BootstrapConfig
from node_bootstrap.imds import InstanceIdentity
from node_bootstrap.runner import CommandError, Runner

LOG = logging.getLogger("node_bootstrap")

FAILURE_TAG_PREFIX = "cluster:bootstrap-failure:"
LAST_SUCCESS_TAG = "cluster:bootstrap-last-success"
PROTECTED_TAG = "cluster:protected"
SUSPENDED_PROCESS = "ReplaceUnhealthy"
METRIC_NAMESPACE = "TrainingCluster"
PROTECTED_MODE_METRIC = "BootstrapProtectedMode"
MAX_TAG_VALUE_CHARS = 256  # Auto Scaling tag values hold at most 256 characters
KEEP_FAILURE_TAGS = 30  # a group holds at most 50 tags; the oldest failure records go first
AWS_TIMEOUT_S = 60.0


@dataclass(frozen=True)
class FailureRecord:
    instance_id: str
    epoch_s: int
    key: str
    reason: str


@dataclass(frozen=True)
class GroupState:
    failures: tuple[FailureRecord, ...]
    last_success_epoch_s: int
    protected: str | None  # the cluster:protected tag's value, when the group is already protected


@dataclass(frozen=True)
class Outcome:
    streak: int  # failures in a row for this key, this one included
    protected: bool  # the group is in protected mode now
    entered: bool  # this failure put it there


def record_failure(identity: InstanceIdentity, runner: Runner, config: BootstrapConfig, key: str, reason: str,
                   *, clock: Callable[[], float] = time.time) -> Outcome | None:
    """Record this node's failure and enter protected mode at the threshold; None when bookkeeping failed."""
    group = _Group(identity.region, config.auto_scaling_group_name, runner)
    now = int(clock())
    mine = FailureRecord(identity.instance_id, now, key, reason)
    try:
        group.put_tags({FAILURE_TAG_PREFIX + identity.instance_id: _failure_value(mine)})
        state = group.read()
        window_start = now - config.protected_mode_window_seconds
        since = max(window_start, state.last_success_epoch_s)
        others = [f for f in state.failures if f.instance_id != identity.instance_id]
        streak = 1 + sum(1 for f in others if f.key == key and f.epoch_s > since)
        group.prune([f for f in others if f.epoch_s <= since] + _excess(others, since))
        if state.protected is not None:
            LOG.error("protected mode: %s is already protected (%s); not replaced", group.name, state.protected)
            return Outcome(streak, True, False)
        if streak < config.protected_mode_failures:
            LOG.warning("protected mode: %d of %d failures in a row for %r within %d s", streak,
                        config.protected_mode_failures, key, config.protected_mode_window_seconds)
            return Outcome(streak, False, False)
        group.suspend_replacements()
        summary = f"{now} {streak} bootstrap failures in a row ({key}): {reason}"
        group.put_tags({PROTECTED_TAG: _clip(summary)})
        group.put_metric(1)
        LOG.error("protected mode: %d bootstrap failures in a row for %r: suspended %s of %s; see "
                  "docs/operations.md 'Protected mode' to resume", streak, key, SUSPENDED_PROCESS, group.name)
        return Outcome(streak, True, True)
    except CommandError as e:
        LOG.error("protected mode bookkeeping failed (%s); the node is still marked failed", e)
        return None


def record_success(identity: InstanceIdentity, runner: Runner, config: BootstrapConfig, *,
                   clock: Callable[[], float] = time.time) -> None:
    """Record a clean bootstrap: the failure streak ends and the protected-mode alarm returns to OK."""
    group = _Group(identity.region, config.auto_scaling_group_name, runner)
    try:
        group.put_tags({LAST_SUCCESS_TAG: f"{int(clock())} {identity.instance_id}"})
        group.put_metric(0)
    except CommandError as e:
        LOG.warning("could not record this bootstrap's success on %s: %s", group.name, e)


def parse_group_tags(tags: Iterable[dict]) -> GroupState:
    """The protected-mode tags of `aws autoscaling describe-tags` output (malformed values are skipped)."""
    failures, last_success, protected = [], 0, None
    for tag in tags:
        key, value = tag.get("Key", ""), tag.get("Value", "")
        if key.startswith(FAILURE_TAG_PREFIX):
            parts = value.split(" ", 2)
            if len(parts) >= 2 and parts[0].isdigit():
                failures.append(FailureRecord(key[len(FAILURE_TAG_PREFIX):], int(parts[0]), parts[1],
                                              parts[2] if len(parts) > 2 else ""))
        elif key == LAST_SUCCESS_TAG:
            first = value.split(" ", 1)[0]
            last_success = int(first) if first.isdigit() else 0
        elif key == PROTECTED_TAG:
            protected = value
    return GroupState(tuple(sorted(failures, key=lambda f: f.epoch_s)), last_success, protected)


def _failure_value(record: FailureRecord) -> str:
    return _clip(f"{record.epoch_s} {record.key} {' '.join(record.reason.split())}")


def _clip(text: str) -> str:
    return text if len(text) <= MAX_TAG_VALUE_CHARS else text[: MAX_TAG_VALUE_CHARS - 3] + "..."


def _excess(others: list[FailureRecord], since: int) -> list[FailureRecord]:
    """The oldest current records beyond KEEP_FAILURE_TAGS (the group's 50-tag limit)."""
    current = [f for f in others if f.epoch_s > since]
    return current[: max(0, len(current) - KEEP_FAILURE_TAGS)]


class _Group:
    """The aws CLI calls on one Auto Scaling group (all of them report a failure: past the deadline)."""

    def __init__(self, region: str, name: str, runner: Runner) -> None:
        self.region, self.name, self._runner = region, name, runner

    def _aws(self, *args: str, mutating: bool):
        return self._runner.run(("aws", *args, "--region", self.region), mutating=mutating,
                                timeout=AWS_TIMEOUT_S, past_deadline=True)

    def put_tags(self, tags: dict[str, str]) -> None:
        # JSON, not the shorthand: a reason may contain commas.
        body = [{"ResourceId": self.name, "ResourceType": "auto-scaling-group", "Key": k, "Value": v,
                 "PropagateAtLaunch": False} for k, v in tags.items()]
        self._aws("autoscaling", "create-or-update-tags", "--tags", json.dumps(body), mutating=True)

    def read(self) -> GroupState:
        result = self._aws("autoscaling", "describe-tags", "--filters",
                           f"Name=auto-scaling-group,Values={self.name}", "--output", "json", mutating=False)
        try:
            tags = json.loads(result.stdout).get("Tags", [])
        except (ValueError, AttributeError):
            tags = []
        return parse_group_tags(t for t in tags if isinstance(t, dict))

    def prune(self, records: list[FailureRecord]) -> None:
        if not records:
            return
        body = [{"ResourceId": self.name, "ResourceType": "auto-scaling-group",
                 "Key": FAILURE_TAG_PREFIX + r.instance_id} for r in records]
        self._aws("autoscaling", "delete-tags", "--tags", json.dumps(body), mutating=True)

    def suspend_replacements(self) -> None:
        self._aws("autoscaling", "suspend-processes", "--auto-scaling-group-name", self.name,
                  "--scaling-processes", SUSPENDED_PROCESS, mutating=True)

    def put_metric(self, value: int) -> None:
        self._aws("cloudwatch", "put-metric-data", "--namespace", METRIC_NAMESPACE, "--metric-name",
                  PROTECTED_MODE_METRIC, "--dimensions", f"AutoScalingGroupName={self.name}",
                  "--value", str(value), mutating=True)
