"""`clusterctl logs`: a job's log from CloudWatch Logs, all nodes interleaved by time. One stream per node,
`jobs/<job id>/<instance id>` (docs/architecture.md section 5), shipped by the CloudWatch agent from the job
log file on each node. Jobs outlive SSM's 48 h limit and its output truncation, so this, not SSM, is where a
job's output is read."""

from __future__ import annotations

import argparse
import datetime
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from typing import Any

from cluster_aws.errors import EXIT_OK, ClusterctlError
from cluster_jobs.request import validate_job_id
from clusterctl.render import format_time, terminal_safe
from clusterctl.runtime import Runtime, say, stack_outputs

MAX_STREAMS_PER_CALL = 100  # FilterLogEvents takes at most 100 logStreamNames
FOLLOW_POLL_SECONDS = 5.0


@dataclass(frozen=True)
class LogLine:
    timestamp: datetime.datetime
    instance_id: str
    message: str


def stream_prefix(job_id: str, instance_id: str | None = None) -> str:
    return f"jobs/{job_id}/{instance_id}" if instance_id else f"jobs/{job_id}/"


def job_streams(logs: Any, log_group: str, job_id: str, instance_id: str | None = None) -> list[str]:
    names = []
    paginator = logs.get_paginator("describe_log_streams")
    for page in paginator.paginate(
        logGroupName=log_group, logStreamNamePrefix=stream_prefix(job_id, instance_id)
    ):
        names += [s["logStreamName"] for s in page.get("logStreams", [])]
    # A prefix "jobs/J/i-1" also matches "jobs/J/i-10...": keep exact instance matches only.
    return sorted(n for n in names if instance_id is None or n == stream_prefix(job_id, instance_id))


def _fetch(logs: Any, log_group: str, streams: list[str], start_ms: int | None) -> list[dict[str, Any]]:
    events: list[dict[str, Any]] = []
    for i in range(0, len(streams), MAX_STREAMS_PER_CALL):
        request: dict[str, Any] = {
            "logGroupName": log_group,
            "logStreamNames": streams[i : i + MAX_STREAMS_PER_CALL],
        }
        if start_ms is not None:
            request["startTime"] = start_ms
        for page in logs.get_paginator("filter_log_events").paginate(**request):
            events += page.get("events", [])
    return sorted(events, key=lambda e: (e["timestamp"], e["logStreamName"], e.get("eventId", "")))


def iter_job_log(
    logs: Any,
    log_group: str,
    job_id: str,
    instance_id: str | None = None,
    follow: bool = False,
    sleep: Callable[[float], None] = time.sleep,
) -> Iterator[LogLine]:
    """The job's log lines in time order; with `follow`, keeps polling for new lines (until interrupted)."""
    seen: set[str] = set()
    start_ms: int | None = None
    while True:
        streams = job_streams(logs, log_group, job_id, instance_id)
        if not streams and not follow:
            where = f" from {instance_id}" if instance_id else ""
            raise ClusterctlError(
                f"no log for job {job_id}{where} in {log_group}: the CloudWatch agent ships a job's log "
                "within a minute of its start; check the job id (clusterctl status)"
            )
        for event in _fetch(logs, log_group, streams, start_ms) if streams else []:
            key = event.get("eventId") or f"{event['logStreamName']}/{event['timestamp']}/{event['message']}"
            if key in seen:
                continue  # startTime is inclusive: the last poll's final millisecond comes back
            seen.add(key)
            start_ms = max(start_ms or 0, event["timestamp"])
            yield LogLine(
                timestamp=datetime.datetime.fromtimestamp(event["timestamp"] / 1000, tz=datetime.UTC),
                instance_id=event["logStreamName"].rsplit("/", 1)[-1],
                message=event["message"].rstrip("\n"),
            )
        if not follow:
            return
        sleep(FOLLOW_POLL_SECONDS)


def logs(args: argparse.Namespace, runtime: Runtime) -> int:
    assert runtime.context is not None
    validate_job_id(args.job_id)
    outputs = stack_outputs(args, runtime)
    lines = iter_job_log(
        runtime.context.client("logs"),
        outputs.log_group_name,
        args.job_id,
        args.node,
        args.follow,
        runtime.sleep,
    )
    try:
        for line in lines:
            # The job wrote the message: its escape sequences are shown, not run by the operator's terminal.
            say(runtime, f"{format_time(line.timestamp)} [{terminal_safe(line.instance_id)}] "
                         f"{terminal_safe(line.message)}")
    except KeyboardInterrupt:
        if not args.follow:
            raise
    return EXIT_OK
