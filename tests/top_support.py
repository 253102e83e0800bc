"""Fakes for the `clusterctl top` tests: metrics put into moto's CloudWatch in the shapes the cluster publishes
them (the CloudWatch agent's roll-ups, derived from the agent config the stack renders; the EFA collector's and
the trainer's EMF records, their real lines extracted as CloudWatch Logs does; the Auto Scaling group's
metrics), jobs in the job table, the AWS calls a command makes, and the rows of the nodes table top prints."""

from __future__ import annotations

import dataclasses
import datetime
import io

import boto3
import torch
from emf_spec import extracted_metrics, parse_emf_line
from metric_contract import agent_published

from cluster_constructs.cloudwatch_agent import render_agent_config
from cluster_jobs.table import Attempt, JobRecord
from node_bootstrap.config import MetricsConfig as NodeMetricsConfig
from node_bootstrap.efa_metrics import Collector
from training.metrics import MetricsConfig, MetricsLogger, ThroughputModel

GROUP = "TrainingClusterStack-nodes"
STACK = "TrainingClusterStack"
JOB = "j-20261120-231502-ab12"
AGENT_CONFIG = render_agent_config(log_group_name="/training-cluster/TrainingClusterStack", interval_seconds=60,
                                   disk_mount_points=("/", "/scratch", "/fsx"))


def put(data: list[dict]) -> None:
    cloudwatch = boto3.client("cloudwatch", region_name="us-east-1")
    by_namespace: dict[str, list[dict]] = {}
    for d in data:
        datum = {k: v for k, v in d.items() if k not in ("Namespace", "TimestampMs")}
        datum["Timestamp"] = datetime.datetime.fromtimestamp(d["TimestampMs"] / 1000, datetime.UTC)
        by_namespace.setdefault(d["Namespace"], []).append(datum)
    for namespace, items in by_namespace.items():
        for i in range(0, len(items), 500):
            cloudwatch.put_metric_data(Namespace=namespace, MetricData=items[i:i + 500])


def agent_data(instance_id: str, at: datetime.datetime, per_gpu: dict[str, list[float]]) -> list[dict]:
    """What one node's agent publishes for `per_gpu` (measurement name -> 8 values): every roll-up of the
    agent config that its GPU metrics carry, one value per GPU (CloudWatch aggregates them)."""
    values = {f"nvidia_smi_{m}": v for m, v in per_gpu.items()}
    dims_of = {GROUP: GROUP, "AutoScalingGroupName": GROUP, "InstanceId": instance_id}
    data = []
    for namespace, name, dims in agent_published(AGENT_CONFIG):
        if name not in values:
            continue
        assert dims <= {"AutoScalingGroupName", "InstanceId", "index"}  # the originals are dropped
        for index, value in enumerate(values[name]):
            dimension_values = {**dims_of, "index": str(index)}
            data.append({"Namespace": namespace, "MetricName": name, "Value": value,
                         "Dimensions": [{"Name": k, "Value": dimension_values[k]} for k in sorted(dims)],
                         "TimestampMs": int(at.timestamp() * 1000)})
    return data


def efa_data(tmp_path, instance_id: str, at: datetime.datetime, tx_bytes: int, errors: int) -> list[dict]:
    counters = tmp_path / instance_id / "sys/class/infiniband/rdmap79s0/ports/1/hw_counters"
    counters.mkdir(parents=True)
    for name in ("tx_bytes", "rx_bytes", "retrans_timeout_events"):
        (counters / name).write_text("0\n")
    times = iter([at.timestamp() - 60, at.timestamp()])
    metrics = NodeMetricsConfig(interval_seconds=60, namespace="TrainingCluster", auto_scaling_group_name=GROUP,
                                efa_metrics_dir="/var/log/cluster/metrics")
    collector = Collector(metrics, instance_id, root=str(tmp_path / instance_id), clock=lambda: next(times))
    collector.sample()
    (counters / "tx_bytes").write_text(f"{tx_bytes}\n")
    (counters / "rx_bytes").write_text(f"{tx_bytes // 2}\n")
    (counters / "retrans_timeout_events").write_text(f"{errors}\n")
    return [d for line in collector.sample() for d in extracted_metrics(parse_emf_line(line))]


def trainer_data(monkeypatch, at: datetime.datetime, job_id: str = JOB, validation=None) -> list[dict]:
    """Rank 0's EMF step record at step 40 of 100, as CloudWatch extracts it; ``validation``: a
    training.validation.ValidationResult evaluated after that step."""
    monkeypatch.setenv("CLUSTER_STACK_NAME", STACK)
    monkeypatch.setenv("CLUSTER_JOB_ID", job_id)
    monkeypatch.setattr("training.metrics.time.time", lambda: at.timestamp())
    err = io.StringIO()
    model = ThroughputModel(tokens_per_step=8 * 2048 * 16, world_size=16, flops_per_token=1e10,
                            peak_tflops_per_gpu=989.0)
    metrics = MetricsLogger(MetricsConfig(nvml=False), rank=0, world_size=1, device=torch.device("cpu"),
                            model=model, stdout=io.StringIO(), stderr=err)
    metrics.log_step(step=40, total_steps=100, loss=torch.tensor(2.25), lr=3e-4, grad_norm=torch.tensor(1.0),
                     step_time_s=2.0, validation=validation)
    lines = [line for line in err.getvalue().splitlines() if line.startswith('{"_aws"')]
    return [d for line in lines for d in extracted_metrics(parse_emf_line(line))]


def in_service_data(start: datetime.datetime, minutes: int, nodes: int) -> list[dict]:
    return [{"Namespace": "AWS/AutoScaling", "MetricName": "GroupInServiceInstances", "Value": float(nodes),
             "Dimensions": [{"Name": "AutoScalingGroupName", "Value": GROUP}],
             "TimestampMs": int((start + datetime.timedelta(minutes=m)).timestamp() * 1000)}
            for m in range(minutes)]


def record_job(fakes, now: datetime.datetime, state: str = "running", job_id: str = JOB,
               attempts: list[Attempt] | None = None, **changes) -> JobRecord:
    """A job as submit and the keeper leave it in the job table, written through the table's own operations
    (create takes the lock; a final state gives it back)."""
    table = fakes.job_table()
    started = (now - datetime.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    attempts = attempts or [Attempt(number=1, nodes=["i-1", "i-2"], rendezvous_host="10.42.1.4", started_at=started)]
    record = JobRecord(
        job_id=job_id, module="training", config="/fsx/configs/1b.toml", config_text="", overrides=[],
        resume_from="", nodes=2, gpus_per_node=8, max_restarts=3, max_job_restarts=fakes.MAX_JOB_RESTARTS,
        instance_type="p5.48xlarge", checkpoint_dir=f"/fsx/checkpoints/{job_id}", state="starting",
        created_at=started, updated_at=started, attempts=attempts,
    )
    created = table.create(record)
    return table.save(dataclasses.replace(created, state=state, **changes), now)


def api_calls(cli) -> list[str]:
    """Every AWS API call clusterctl makes through the CLI's session, as service:Operation (IAM's names)."""
    calls: list[str] = []
    cli.context.session.events.register(
        "before-call", lambda model, **_: calls.append(f"{model.service_model.signing_name}:{model.name}"))
    return calls


COLUMNS = ("NODE", "STATE", "GPU", "MEM", "TEMP", "POWER", "EFA TX", "EFA RX", "ERR")


def table_rows(text: str) -> dict[str, dict[str, str]]:
    """The nodes table's rows by instance id: column -> cell text."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("│ i-"):
            cells = [c.strip() for c in line.strip().strip("│").split("│")]
            rows[cells[0]] = dict(zip(COLUMNS, cells, strict=True))
    return rows
