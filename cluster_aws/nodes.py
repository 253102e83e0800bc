"""The cluster's nodes: the Auto Scaling group's view (lifecycle, health) joined with EC2's (private IP, AZ,
the bootstrap readiness tag of docs/architecture.md section 4)."""

from __future__ import annotations

import datetime
import ipaddress
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

from cluster_aws.errors import EXIT_FAILED, EXIT_STACK, ClusterctlError

# The EC2 states SSM can send a command to; SendCommand to an instance shutting down or terminated fails the
# whole call with InvalidInstanceId (SSM API reference, InvalidInstanceId: "Valid states are: Running, Pending,
# Stopped, and Stopping. Invalid states are: Shutting-down and Terminated.").
SSM_ADDRESSABLE_STATES = ("pending", "running", "stopping", "stopped")
FILTER_VALUES_MAX = 200  # values per filter in one DescribeInstances call

BOOTSTRAP_TAG = "cluster:bootstrap"  # running | ready | failed, set by the node's user-data
BOOTSTRAP_REASON_TAG = "cluster:bootstrap-reason"
HEALTH_TAG = "cluster:health"  # unhealthy, set by the node health monitor (node_bootstrap/monitor/)
HEALTH_REASON_TAG = "cluster:health-reason"


@dataclass(frozen=True)
class Node:
    instance_id: str
    private_ip: str | None
    availability_zone: str | None
    lifecycle_state: str  # Auto Scaling: Pending, InService, Terminating, ...
    health_status: str  # Auto Scaling: Healthy or Unhealthy
    bootstrap: str | None  # the cluster:bootstrap tag, None before user-data has run
    bootstrap_reason: str | None
    launch_time: datetime.datetime | None
    health_monitor: str | None = None  # the cluster:health tag: None while the monitor finds nothing fatal
    health_monitor_reason: str | None = None

    @property
    def ready(self) -> bool:
        """Readiness for jobs: in service, healthy, and bootstrapped (docs/architecture.md section 4)."""
        return self.not_ready_reason is None

    @property
    def not_ready_reason(self) -> str | None:
        if self.lifecycle_state != "InService":
            return f"lifecycle {self.lifecycle_state}"
        if self.health_monitor == "unhealthy":  # before Auto Scaling has acted on it
            reason = "node health monitor: unhealthy"
            return f"{reason}: {self.health_monitor_reason}" if self.health_monitor_reason else reason
        if self.health_status != "Healthy":
            return f"health {self.health_status}"
        if self.bootstrap != "ready":
            reason = f"bootstrap {self.bootstrap or 'not started'}"
            return f"{reason}: {self.bootstrap_reason}" if self.bootstrap_reason else reason
        if not self.private_ip:
            return "no private IP"
        return None


def _ip_order(node: Node) -> tuple[int, str]:
    return (int(ipaddress.ip_address(node.private_ip)) if node.private_ip else 1 << 128, node.instance_id)


def list_nodes(autoscaling: Any, ec2: Any, group_name: str) -> list[Node]:
    """Every instance of the group, ordered by private IP (the first ready one hosts the rendezvous)."""
    groups = autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[group_name])["AutoScalingGroups"]
    if not groups:
        raise ClusterctlError(
            f"Auto Scaling group {group_name} (stack output AutoScalingGroupName) does not exist", EXIT_STACK
        )
    members = {i["InstanceId"]: i for i in groups[0].get("Instances", [])}
    details: dict[str, dict[str, Any]] = {}
    if members:
        paginator = ec2.get_paginator("describe_instances")
        for page in paginator.paginate(InstanceIds=sorted(members)):
            for reservation in page["Reservations"]:
                for instance in reservation["Instances"]:
                    details[instance["InstanceId"]] = instance
    nodes = []
    for instance_id, member in members.items():
        instance = details.get(instance_id, {})
        tags = {t["Key"]: t["Value"] for t in instance.get("Tags", [])}
        nodes.append(
            Node(
                instance_id=instance_id,
                private_ip=instance.get("PrivateIpAddress"),
                availability_zone=member.get("AvailabilityZone")
                or instance.get("Placement", {}).get("AvailabilityZone"),
                lifecycle_state=member["LifecycleState"],
                health_status=member["HealthStatus"],
                bootstrap=tags.get(BOOTSTRAP_TAG),
                bootstrap_reason=tags.get(BOOTSTRAP_REASON_TAG),
                launch_time=instance.get("LaunchTime"),
                health_monitor=tags.get(HEALTH_TAG),
                health_monitor_reason=tags.get(HEALTH_REASON_TAG),
            )
        )
    return sorted(nodes, key=_ip_order)


def select_job_nodes(nodes: Sequence[Node], count: int, last: Sequence[str] = ()) -> list[Node]:
    """The first `count` ready nodes by private IP, the instances in `last` after every other (the nodes a hang
    was on: taken only when the job needs them), or a refusal that says which nodes are not ready."""
    if count < 1:
        raise ClusterctlError(f"--nodes={count}: allowed: 1 or more", EXIT_FAILED)
    if not nodes:
        raise ClusterctlError(
            "the cluster has no nodes: is the Auto Scaling group scaled to 0, or are the "
            "instances still launching? (clusterctl nodes)"
        )
    ready = [n for n in nodes if n.ready]
    if len(ready) < count:
        problems = "; ".join(f"{n.instance_id}: {n.not_ready_reason}" for n in nodes if not n.ready)
        detail = f" (not ready: {problems})" if problems else ""
        raise ClusterctlError(f"{count} nodes asked, {len(ready)} of {len(nodes)} ready{detail}")
    return sorted(ready, key=lambda n: n.instance_id in last)[:count]  # a stable sort: by IP within each part


def instance_states(ec2: Any, instance_ids: Sequence[str]) -> dict[str, str]:
    """EC2's state name for each instance it still knows (pending, running, ..., terminated: a terminated
    instance stays visible for about an hour). An id EC2 no longer knows is absent. Asked through a filter,
    not InstanceIds, which fails the whole call on one unknown id."""
    states: dict[str, str] = {}
    ids = sorted(set(instance_ids))
    paginator = ec2.get_paginator("describe_instances")
    for start in range(0, len(ids), FILTER_VALUES_MAX):
        chunk = ids[start : start + FILTER_VALUES_MAX]
        for page in paginator.paginate(Filters=[{"Name": "instance-id", "Values": chunk}]):
            for reservation in page["Reservations"]:
                for instance in reservation["Instances"]:
                    states[instance["InstanceId"]] = instance["State"]["Name"]
    return states


def split_addressable(ec2: Any, instance_ids: Sequence[str]) -> tuple[list[str], dict[str, str]]:
    """(the instances SSM can still send a command to, {every other instance: why it is gone}): a node the
    Auto Scaling group replaced is shutting down, terminated, or no longer known to EC2 at all."""
    states = instance_states(ec2, instance_ids)
    addressable = [i for i in instance_ids if states.get(i) in SSM_ADDRESSABLE_STATES]
    gone = {
        i: f"instance {states[i]}" if i in states else "instance no longer exists"
        for i in instance_ids
        if states.get(i) not in SSM_ADDRESSABLE_STATES
    }
    return addressable, gone
