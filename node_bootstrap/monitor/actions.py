"""What an unhealthy node does about itself, and the metric every round publishes.

The responses, in this order, each at most once per node (state.py records which are done; one that fails,
say a throttled API call, is retried next round):
1. stop-job: SIGTERM to each running job's supervisor (systemd: to the unit's main process), which forwards
   it to torchrun, so the trainer's peers on the other nodes see the failure now rather than at their
   collective timeout. A `stop-request.json` next to the job's status says why, and the supervisor records
   it. Local and instant, so it goes first.
2. tag: `cluster:health=unhealthy` and `cluster:health-reason` (one line, <= 256 characters) on the instance.
3. log: the finding as one JSON event straight into the node's CloudWatch Logs stream `<instance id>/health`
   (PutLogEvents needs no sequence token since 2023): the CloudWatch agent ships the monitor's log file to
   the same stream, but the node may be gone before the agent's next flush.
4. health: `aws autoscaling set-instance-health --health-status Unhealthy --no-should-respect-grace-period`
   (a node found bad inside the group's grace period is replaced now, not after it). Last, because the group
   may terminate the instance seconds later.
Every round publishes TrainingCluster/NodeHealthWarnings (the warning checks) and NodeUnhealthy (0 or 1)
with the group's name as dimension.
"""

from __future__ import annotations

import json
import logging
import os
import time
from typing import Callable

from node_bootstrap.config import NodeConfig
from node_bootstrap.host import Host
from node_bootstrap.imds import ImdsError, InstanceIdentity
from node_bootstrap.jobs.control import process_alive
from node_bootstrap.jobs.spec import STOP_REQUEST_FILE, read_json, utc_now, write_json_atomic
from node_bootstrap.monitor.state import Unhealthy
from node_bootstrap.readiness import build_reason
from node_bootstrap.runner import Runner

LOG = logging.getLogger("node_bootstrap")

STOP_JOB, TAG, LOG_EVENT, HEALTH = "stop-job", "tag", "log", "health"
RESPONSES = (STOP_JOB, TAG, LOG_EVENT, HEALTH)
TAG_HEALTH = "cluster:health"
TAG_HEALTH_REASON = "cluster:health-reason"
HEALTH_STREAM = "{instance_id}/health"  # the CloudWatch agent expands {instance_id}; so does this module
METRIC_NAMESPACE = "TrainingCluster"
WARNINGS_METRIC = "NodeHealthWarnings"
UNHEALTHY_METRIC = "NodeUnhealthy"
AWS_TIMEOUT_S = 60.0


class Responder:
    """Carries out the responses through the runner (mutating calls are printed in a dry run)."""

    def __init__(self, config: NodeConfig, host: Host, runner: Runner,
                 identity: Callable[[], InstanceIdentity], *, clock: Callable[[], float] = time.time) -> None:
        self.config = config
        self.host = host
        self.runner = runner
        self._identity = identity
        self._clock = clock

    def respond(self, unhealthy: Unhealthy) -> None:
        """Run every response not yet done, in order; each success is added to `unhealthy.done`."""
        for name in RESPONSES:
            if name in unhealthy.done:
                continue
            try:
                ok = getattr(self, "_" + name.replace("-", "_"))(unhealthy)
            except ImdsError as e:
                LOG.error("monitor: %s: cannot identify this instance: %s; retrying next round", name, e)
                ok = False
            if ok:
                unhealthy.done.append(name)

    def publish_metrics(self, warnings: int, unhealthy: bool) -> None:
        dimensions = [{"Name": "AutoScalingGroupName", "Value": self.config.bootstrap.auto_scaling_group_name}]
        data = [
            {"MetricName": WARNINGS_METRIC, "Dimensions": dimensions, "Value": warnings, "Unit": "Count"},
            {"MetricName": UNHEALTHY_METRIC, "Dimensions": dimensions, "Value": int(unhealthy), "Unit": "Count"},
        ]
        result = self._aws("cloudwatch", "put-metric-data", "--namespace", METRIC_NAMESPACE,
                           "--metric-data", json.dumps(data))
        if not result.ok:
            LOG.warning("monitor: could not publish the health metrics: %s", result.describe_failure())

    # ----- the responses: each returns True when done -----

    def _stop_job(self, unhealthy: Unhealthy) -> bool:
        jobs = running_jobs(self.host, self.config.training.jobs_dir)
        if not jobs:
            LOG.info("monitor: no job runs on this node")
            return True
        done = True
        for job_id, status in jobs:
            request = {"by": "node health monitor", "reason": unhealthy.reason, "at": utc_now()}
            job_dir = os.path.join(self.host.path(self.config.training.jobs_dir), job_id)
            if not self.runner.dry_run:
                write_json_atomic(os.path.join(job_dir, STOP_REQUEST_FILE), request)
            if status.get("launcher") == "systemd":
                argv = ("systemctl", "kill", "--kill-whom=main", "--signal=SIGTERM", f"{status.get('unit')}.service")
            else:
                argv = ("kill", "-s", "TERM", str(status.get("supervisorPid")))
            result = self.runner.run(argv, mutating=True, check=False, timeout=AWS_TIMEOUT_S)
            if result.ok:
                LOG.error("monitor: sent SIGTERM to job %s (supervisor pid %s)", job_id, status.get("supervisorPid"))
            else:
                LOG.error("monitor: could not stop job %s: %s", job_id, result.describe_failure())
                done = False
        return done

    def _tag(self, unhealthy: Unhealthy) -> bool:
        identity = self._identity()
        tags = [{"Key": TAG_HEALTH, "Value": "unhealthy"}, {"Key": TAG_HEALTH_REASON, "Value": unhealthy.reason}]
        result = self._aws("ec2", "create-tags", "--resources", identity.instance_id, "--tags", json.dumps(tags))
        return self._logged(result, f"tagged {identity.instance_id} {TAG_HEALTH}=unhealthy", "tag the instance")

    def _log(self, unhealthy: Unhealthy) -> bool:
        identity = self._identity()
        group = self.config.logging.log_group_name
        stream = HEALTH_STREAM.format(instance_id=identity.instance_id)
        created = self._aws("logs", "create-log-stream", "--log-group-name", group, "--log-stream-name", stream)
        if not created.ok and "ResourceAlreadyExistsException" not in created.stderr:
            return self._logged(created, "", "create the log stream " + stream)
        event = {"event": "node-unhealthy", "instanceId": identity.instance_id, "reason": unhealthy.reason,
                 "since": unhealthy.since, "responses": list(unhealthy.done)}
        events = [{"timestamp": int(self._clock() * 1000), "message": json.dumps(event, sort_keys=True)}]
        result = self._aws("logs", "put-log-events", "--log-group-name", group, "--log-stream-name", stream,
                           "--log-events", json.dumps(events))
        return self._logged(result, f"wrote the finding to {group} {stream}", "write the finding to CloudWatch Logs")

    def _health(self, unhealthy: Unhealthy) -> bool:
        identity = self._identity()
        result = self._aws("autoscaling", "set-instance-health", "--instance-id", identity.instance_id,
                           "--health-status", "Unhealthy", "--no-should-respect-grace-period")
        return self._logged(result, f"marked {identity.instance_id} Unhealthy: its Auto Scaling group replaces it",
                            "mark the instance Unhealthy")

    # ----- helpers -----

    def _aws(self, service: str, operation: str, *args: str):
        return self.runner.run(("aws", service, operation, "--region", self.config.region, *args),
                               mutating=True, check=False, timeout=AWS_TIMEOUT_S)

    def _logged(self, result, success: str, what: str) -> bool:
        if result.ok:
            if not result.dry_run:
                LOG.error("monitor: %s", success)
            return True
        LOG.error("monitor: could not %s (retrying next round): %s", what, result.describe_failure())
        return False


def running_jobs(host: Host, jobs_dir: str) -> list[tuple[str, dict]]:
    """(job id, status) of each job whose supervisor runs on this node."""
    try:
        names = sorted(os.listdir(host.path(jobs_dir)))
    except OSError:
        return []
    found = []
    for job_id in names:
        status = read_json(os.path.join(host.path(jobs_dir), job_id, "status.json"))
        if status and status.get("state") == "running" and process_alive(status.get("supervisorPid"), job_id):
            found.append((job_id, status))
    return found


def unhealthy_reason(detail: str) -> str:
    """The one-line reason on the tag and in the log: what the monitor found, at most 256 characters."""
    return build_reason("health monitor: " + detail)

