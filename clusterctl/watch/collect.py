"""`clusterctl top`: what the cluster is doing now, from CloudWatch: per node GPU utilization, memory,
temperature, power and EFA throughput; the active job's state and attempt, step, loss, tokens/s, MFU and ETA,
and its newest held-out loss ([validation]); the cost so far.

Reads the same metrics as the dashboard (cluster_spec/metrics.py): the CloudWatch agent's per-node
roll-ups, the EFA collector's and the trainer's EMF metrics, and the Auto Scaling group's metrics. Which job to
show comes from the job table (stack output JobTableName, cluster_jobs/table.py): the job its lock names, with
the record's state and attempt, so a job that the keeper is restarting shows as restarting, not as a step that
stopped moving. A stack deployed before the job table has none: there the job is the one whose Step metric is the
newest in the last 3 hours.

Per refresh: DescribeAutoScalingGroups (twice: the group, and its members) and DescribeInstances for the nodes;
one GetMetricData call for the nodes and one for the job (up to 500 queries each); to find the job, two
strongly consistent DynamoDB GetItem calls (the lock, then the job's record: one read of the record's size,
rounded up to 4 KB, each), or without a job table a ListMetrics call and a GetMetricData call; and a GetMetricData
call for the cost since the group was created. GetMetricData is billed per metric requested (CloudWatch pricing):
a 2-node cluster refreshed every 15 s asks for about 130 000 metrics a day; `--interval` trades freshness for
that. The table is never scanned here: a Scan reads every job ever recorded, so `top` does not name the job
before the active one (`clusterctl jobs` does).
"""

from __future__ import annotations

import dataclasses
import datetime
import math
from collections.abc import Callable, Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from cluster_aws.errors import EXIT_STACK, ClusterctlError
from cluster_aws.nodes import Node, list_nodes
from cluster_aws.stack_outputs import StackOutputs
from cluster_jobs.goodput import Goodput, job_goodput
from cluster_jobs.table import ACTIVE_STATES, JobRecord, JobTable, parse_time
from cluster_spec import metrics as cm
from instance_catalog.instance_types import get_instance_type

WINDOW = datetime.timedelta(minutes=15)  # the newest datapoint within this is "now"
JOB_WINDOW = datetime.timedelta(hours=3)  # a job with no step record for this long is not running
PERIOD_S = 60
MAX_QUERIES = 500  # GetMetricData's limit per call


@dataclass(frozen=True)
class NodeView:
    instance_id: str
    lifecycle: str
    bootstrap: str | None
    gpu_utilization_pct: float | None  # mean of the node's GPUs
    gpu_memory_used_mib: float | None  # mean per GPU
    gpu_memory_total_mib: float | None
    gpu_temperature_c: float | None  # hottest GPU
    gpu_power_w: float | None  # mean per GPU
    efa_tx_gbps: float | None  # all EFA devices
    efa_rx_gbps: float | None
    efa_error_events: float | None  # in the last minute with data


@dataclass(frozen=True)
class JobView:
    job_id: str
    step: int | None
    run_steps: int | None
    loss: float | None
    tokens_per_s: float | None
    mfu_pct: float | None
    step_time_max_s: float | None
    step_time_median_s: float | None
    straggler_ratio: float | None
    slowest_rank: int | None
    eta_s: float | None
    updated_at: datetime.datetime | None  # the newest step record's time
    # The newest held-out loss ([validation]) and its perplexity, from the last step record that evaluated it;
    # None: the job has no [validation], or has not reached its first evaluation
    val_loss: float | None = None
    val_perplexity: float | None = None
    # The job table's record (all None on a stack deployed before the job table: the job was found by its metrics)
    state: str | None = None  # starting, running or restarting (job_table.ACTIVE_STATES)
    attempt: int | None = None  # 1: the submit; each restart on a new node set adds one
    restarts: int | None = None
    max_job_restarts: int | None = None
    reason: str | None = None  # why the job is in its state: while restarting, the fault that ended the attempt
    nodes: int | None = None  # the job's node count: a restart waits until that many nodes are ready
    attempt_started_at: datetime.datetime | None = None  # a step record before this is an earlier attempt's
    resumed_from_step: int | None = None  # the checkpoint step this attempt resumed from; None: not reported yet
    resumed_from_tier: str | None = None  # its checkpoint tier: "local" or "durable"
    goodput: Goodput | None = None  # the record's time since the submit by category (cluster_jobs/goodput.py)


@dataclass(frozen=True)
class EndedJob:
    """The job the table's lock still names although its record has ended (a lock left behind; the next submit
    gives it back)."""

    job_id: str
    state: str
    ended_at: datetime.datetime | None


JOB_FROM_TABLE = "job table"  # ClusterView.job_source: the job table's lock names the job
JOB_FROM_METRICS = "metrics"  # a stack without a job table: the newest Step metric in the last 3 hours


@dataclass(frozen=True)
class ClusterView:
    stack_name: str
    instance_type: str
    node_count: int  # every node the group holds: a job's and the spares
    collected_at: datetime.datetime
    nodes: list[NodeView]
    job: JobView | None
    group_created_at: datetime.datetime | None
    cost_usd: float | None  # estimated On-Demand cost since the group was created
    usd_per_node_hour: float
    notes: list[str] = field(default_factory=list)
    job_source: str = JOB_FROM_METRICS  # where `job` was found: JOB_FROM_TABLE or JOB_FROM_METRICS
    spare_nodes: int = 0  # of node_count, the hot spares (the spareNodes setting)
    ended_job: EndedJob | None = None  # no active job, but the lock names this ended one


# ----- GetMetricData ---------------------------------------------------------------------------------------
@dataclass(frozen=True)
class Query:
    key: str  # our name for the answer
    namespace: str
    name: str
    dimensions: dict[str, str]
    stat: str
    period_s: int = PERIOD_S
    complete_only: bool = False  # a Sum over a period still being filled would read low


def get_latest(cloudwatch: Any, queries: Sequence[Query], start: datetime.datetime,
               end: datetime.datetime) -> dict[str, tuple[datetime.datetime, float]]:
    """The newest datapoint of every query that has one in [start, end) (for `complete_only` queries: the
    newest whose period has ended)."""
    latest: dict[str, tuple[datetime.datetime, float]] = {}
    complete = {q.key: datetime.timedelta(seconds=q.period_s) for q in queries if q.complete_only}
    for key, timestamps, values in _get_metric_data(cloudwatch, queries, start, end):
        points = [(t, v) for t, v in zip(timestamps, values, strict=True) if not math.isnan(v)
                  and (key not in complete or t + complete[key] <= end)]
        if points:
            latest[key] = max(points, key=lambda p: p[0])
    return latest


def _get_metric_data(cloudwatch: Any, queries: Sequence[Query], start: datetime.datetime,
                     end: datetime.datetime) -> Iterable[tuple[str, list[datetime.datetime], list[float]]]:
    for offset in range(0, len(queries), MAX_QUERIES):
        chunk = queries[offset:offset + MAX_QUERIES]
        ids = {f"q{i}": q.key for i, q in enumerate(chunk)}
        request = [
            {
                "Id": f"q{i}",
                "MetricStat": {
                    "Metric": {
                        "Namespace": q.namespace,
                        "MetricName": q.name,
                        "Dimensions": [{"Name": k, "Value": v} for k, v in q.dimensions.items()],
                    },
                    "Period": q.period_s,
                    "Stat": q.stat,
                },
            }
            for i, q in enumerate(chunk)
        ]
        token = None
        while True:
            kwargs = {"NextToken": token} if token else {}
            response = cloudwatch.get_metric_data(MetricDataQueries=request, StartTime=start, EndTime=end,
                                                  ScanBy="TimestampDescending", **kwargs)
            for result in response["MetricDataResults"]:
                yield ids[result["Id"]], list(result["Timestamps"]), [float(v) for v in result["Values"]]
            token = response.get("NextToken")
            if not token:
                break


# ----- what to ask for -------------------------------------------------------------------------------------
_GPU_METRICS = (  # key, metric, statistic
    ("gpu_utilization_pct", cm.GPU_UTILIZATION, "Average"),
    ("gpu_memory_used_mib", cm.GPU_MEMORY_USED, "Average"),
    ("gpu_memory_total_mib", cm.GPU_MEMORY_TOTAL, "Average"),
    ("gpu_temperature_c", cm.GPU_TEMPERATURE, "Maximum"),
    ("gpu_power_w", cm.GPU_POWER, "Average"),
)
_EFA_METRICS = (  # per-interval deltas: Sum over a whole period / the period is a rate
    ("efa_tx_bytes", cm.EFA_TX_BYTES),
    ("efa_rx_bytes", cm.EFA_RX_BYTES),
    ("efa_error_events", cm.EFA_ERROR_EVENTS),
)
_JOB_METRICS = (
    ("step", cm.STEP, "Maximum"),
    ("run_steps", cm.RUN_STEPS, "Maximum"),
    ("loss", cm.LOSS, "Average"),
    ("tokens_per_s", cm.TOKENS_PER_SECOND, "Average"),
    ("mfu_pct", cm.MFU, "Average"),
    ("step_time_max_s", cm.STEP_TIME_MAX, "Average"),
    ("step_time_median_s", cm.STEP_TIME_MEDIAN, "Average"),
    ("straggler_ratio", cm.STRAGGLER_RATIO, "Maximum"),
    ("slowest_rank", cm.SLOWEST_RANK, "Maximum"),
    ("eta_s", cm.ETA_SECONDS, "Minimum"),
    ("val_loss", cm.VALIDATION_LOSS, "Average"),  # only jobs with [validation] publish these two
    ("val_perplexity", cm.VALIDATION_PERPLEXITY, "Average"),
)


def node_views(cloudwatch: Any, group: str, nodes: Sequence[Node], now: datetime.datetime, *,
               interval_s: int = PERIOD_S) -> list[NodeView]:
    """`interval_s`: the nodes' metrics interval; EFA byte counts are summed over whole periods of at least
    that length (a shorter period would hold no sample, or a partial one)."""
    efa_period_s = max(PERIOD_S, interval_s)
    queries = []
    for n in nodes:
        dims = {cm.GROUP: group, cm.INSTANCE: n.instance_id}
        queries += [Query(f"{n.instance_id}/{key}", cm.AGENT_NAMESPACE, name, dims, stat)
                    for key, name, stat in _GPU_METRICS]
        queries += [Query(f"{n.instance_id}/{key}", cm.TRAINING_NAMESPACE, name, dims, "Sum", efa_period_s,
                          complete_only=True) for key, name in _EFA_METRICS]
    latest = get_latest(cloudwatch, queries, now - WINDOW, now) if queries else {}

    def value(node: Node, key: str) -> float | None:
        found = latest.get(f"{node.instance_id}/{key}")
        return found[1] if found else None

    def gbps(node: Node, key: str) -> float | None:
        total = value(node, key)
        return None if total is None else total * 8 / 1e9 / efa_period_s

    return [
        NodeView(
            instance_id=n.instance_id,
            lifecycle=n.lifecycle_state,
            bootstrap=n.bootstrap,
            gpu_utilization_pct=value(n, "gpu_utilization_pct"),
            gpu_memory_used_mib=value(n, "gpu_memory_used_mib"),
            gpu_memory_total_mib=value(n, "gpu_memory_total_mib"),
            gpu_temperature_c=value(n, "gpu_temperature_c"),
            gpu_power_w=value(n, "gpu_power_w"),
            efa_tx_gbps=gbps(n, "efa_tx_bytes"),
            efa_rx_gbps=gbps(n, "efa_rx_bytes"),
            efa_error_events=value(n, "efa_error_events"),
        )
        for n in nodes
    ]


def find_running_job(cloudwatch: Any, cluster: str, now: datetime.datetime) -> str | None:
    """The job whose step record is the newest in the last 3 hours (one job runs at a time per cluster)."""
    job_ids: list[str] = []
    paginator = cloudwatch.get_paginator("list_metrics")
    for page in paginator.paginate(Namespace=cm.TRAINING_NAMESPACE, MetricName=cm.STEP,
                                   Dimensions=[{"Name": cm.CLUSTER, "Value": cluster}], RecentlyActive="PT3H"):
        for metric in page["Metrics"]:
            dims = {d["Name"]: d["Value"] for d in metric.get("Dimensions", [])}
            if set(dims) == {cm.CLUSTER, cm.JOB}:
                job_ids.append(dims[cm.JOB])
    if not job_ids:
        return None
    queries = [Query(job, cm.TRAINING_NAMESPACE, cm.STEP, {cm.CLUSTER: cluster, cm.JOB: job}, "Maximum")
               for job in sorted(set(job_ids))]
    latest = get_latest(cloudwatch, queries, now - JOB_WINDOW, now)
    if not latest:
        return None
    return max(latest, key=lambda job: latest[job][0])


def job_view(cloudwatch: Any, cluster: str, job_id: str, now: datetime.datetime) -> JobView:
    dims = {cm.CLUSTER: cluster, cm.JOB: job_id}
    queries = [Query(key, cm.TRAINING_NAMESPACE, name, dims, stat) for key, name, stat in _JOB_METRICS]
    latest = get_latest(cloudwatch, queries, now - JOB_WINDOW, now)

    def value(key: str) -> float | None:
        return latest[key][1] if key in latest else None

    def whole(key: str) -> int | None:
        v = value(key)
        return None if v is None else int(round(v))

    updated = max((t for t, _ in latest.values()), default=None)
    return JobView(job_id=job_id, step=whole("step"), run_steps=whole("run_steps"), loss=value("loss"),
                   tokens_per_s=value("tokens_per_s"), mfu_pct=value("mfu_pct"),
                   step_time_max_s=value("step_time_max_s"), step_time_median_s=value("step_time_median_s"),
                   straggler_ratio=value("straggler_ratio"), slowest_rank=whole("slowest_rank"),
                   eta_s=value("eta_s"), updated_at=updated, val_loss=value("val_loss"),
                   val_perplexity=value("val_perplexity"))


def active_job(table: JobTable, cloudwatch: Any, cluster: str,
               now: datetime.datetime) -> tuple[JobView | None, EndedJob | None]:
    """The job the table's lock names, with its metrics and its record's state and attempt. (None, None): no
    job holds the lock (or its record is gone); (None, EndedJob): the lock names a job whose record has ended."""
    record = table.active()
    if record is None:
        return None, None
    if record.state not in ACTIVE_STATES:
        return None, EndedJob(record.job_id, record.state, parse_time(record.ended_at))
    return with_record(job_view(cloudwatch, cluster, record.job_id, now), record, now), None


def with_record(job: JobView, record: JobRecord, now: datetime.datetime | None = None) -> JobView:
    """`job` with its record's state, attempt and resume; with `now`, its goodput so far."""
    current = record.current
    return dataclasses.replace(
        job, state=record.state, attempt=record.attempt, restarts=record.restarts,
        max_job_restarts=record.max_job_restarts, reason=record.reason, nodes=record.nodes,
        attempt_started_at=parse_time(current.started_at) if current else None,
        resumed_from_step=current.resumed_from_step if current else None,
        resumed_from_tier=current.resumed_from_tier if current else None,
        goodput=job_goodput(record, now) if now is not None else None,
    )


def cost_since(cloudwatch: Any, group: str, created_at: datetime.datetime, now: datetime.datetime,
               usd_per_node_hour: float) -> float:
    """Node-hours in service since `created_at` (the group's GroupInServiceInstances average per period x the
    period) x the hourly price. 5-minute periods while CloudWatch keeps them (63 days), hourly after."""
    if now - created_at < datetime.timedelta(minutes=1):
        return 0.0  # nothing published yet, and GetMetricData refuses an empty time range
    period_s = 300 if now - created_at <= datetime.timedelta(days=63) else 3600
    query = Query("inservice", cm.AUTOSCALING_NAMESPACE, cm.GROUP_IN_SERVICE, {cm.GROUP: group}, "Average",
                  period_s)
    node_hours = 0.0
    for _, _, values in _get_metric_data(cloudwatch, [query], created_at, now):
        node_hours += sum(v for v in values if not math.isnan(v)) * period_s / 3600
    return node_hours * usd_per_node_hour


# ----- one snapshot ------------------------------------------------------------------------------------------
def collect(client: Callable[[str], Any], outputs: StackOutputs, now: datetime.datetime) -> ClusterView:
    cloudwatch = client("cloudwatch")
    group = outputs.auto_scaling_group_name
    groups = client("autoscaling").describe_auto_scaling_groups(AutoScalingGroupNames=[group])["AutoScalingGroups"]
    if not groups:
        raise ClusterctlError(f"Auto Scaling group {group} (stack output AutoScalingGroupName) does not exist",
                              EXIT_STACK)
    created_at = groups[0].get("CreatedTime")
    nodes = list_nodes(client("autoscaling"), client("ec2"), group)
    price = get_instance_type(outputs.instance_type).on_demand_usd_per_hour
    notes = []
    interval_s = int(outputs.outputs.get("MetricsIntervalSeconds", PERIOD_S))
    views = node_views(cloudwatch, group, nodes, now, interval_s=interval_s)
    if nodes and all(v.gpu_utilization_pct is None for v in views):
        notes.append("no GPU metrics from any node in the last 15 minutes: are the nodes still booting, or is "
                     "the CloudWatch agent stopped? (docs/troubleshooting.md, 'No metrics')")
    ended_job = None
    if outputs.job_table_name is not None:
        table = JobTable(client("dynamodb"), outputs.job_table_name)
        job, ended_job = active_job(table, cloudwatch, outputs.stack_name, now)
        source = JOB_FROM_TABLE
    else:  # a stack deployed before the job table
        job_id = find_running_job(cloudwatch, outputs.stack_name, now)
        job = job_view(cloudwatch, outputs.stack_name, job_id, now) if job_id else None
        source = JOB_FROM_METRICS
    cost = cost_since(cloudwatch, group, created_at, now, price) if created_at else None
    return ClusterView(stack_name=outputs.stack_name, instance_type=outputs.instance_type,
                       node_count=outputs.group_size, spare_nodes=outputs.spare_nodes, collected_at=now,
                       nodes=views, job=job,
                       group_created_at=created_at, cost_usd=cost, usd_per_node_hour=price, notes=notes,
                       job_source=source, ended_job=ended_job)
