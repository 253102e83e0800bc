"""`clusterctl top` against moto's CloudWatch, with metrics put in the shapes the cluster publishes them: the
CloudWatch agent's roll-ups (derived from the agent config the stack renders), the EFA collector's and the
trainer's EMF records (their real lines, extracted as CloudWatch Logs does), and the Auto Scaling group's
metrics. Rendering is checked with rich's console capture."""

from __future__ import annotations

import dataclasses
import datetime
import io
import json

import boto3
import pytest
import torch
from emf_spec import extracted_metrics, parse_emf_line
from metric_contract import agent_published
from rich.console import Console

from cluster_constructs.cloudwatch_agent import render_agent_config
from cluster_constructs.job_keeper import JOB_TABLE_ACTIONS
from clusterctl.cli import Runtime, main
from clusterctl.job_table import LOCK_KEY, Attempt, JobRecord
from clusterctl.top import ClusterView, JobView, NodeView
from clusterctl.top_view import render
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


def trainer_data(monkeypatch, at: datetime.datetime, job_id: str = JOB) -> list[dict]:
    monkeypatch.setenv("CLUSTER_STACK_NAME", STACK)
    monkeypatch.setenv("CLUSTER_JOB_ID", job_id)
    monkeypatch.setattr("training.metrics.time.time", lambda: at.timestamp())
    err = io.StringIO()
    model = ThroughputModel(tokens_per_step=8 * 2048 * 16, world_size=16, flops_per_token=1e10,
                            peak_tflops_per_gpu=989.0)
    metrics = MetricsLogger(MetricsConfig(nvml=False), rank=0, world_size=1, device=torch.device("cpu"),
                            model=model, stdout=io.StringIO(), stderr=err)
    metrics.log_step(step=40, total_steps=100, loss=torch.tensor(2.25), lr=3e-4, grad_norm=torch.tensor(1.0),
                     step_time_s=2.0)
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


@pytest.fixture()
def busy_cluster(cluster, cli, tmp_path, monkeypatch, fakes):
    """Two hours after the group was created: node 0 trains at 95%, node 1 idles at 3% with EFA errors,
    node 2 has no metrics; job JOB, the job table's active job, running at step 40 of 100."""
    group = boto3.client("autoscaling", region_name="us-east-1").describe_auto_scaling_groups(
        AutoScalingGroupNames=[GROUP])["AutoScalingGroups"][0]
    created = group["CreatedTime"]
    now = created + datetime.timedelta(hours=2)
    cli.now = now
    sample = now - datetime.timedelta(minutes=3)
    busy, idle, silent = cluster.instance_ids
    data = agent_data(busy, sample, {"utilization_gpu": [95.0] * 8, "memory_used": [61_440.0] * 8,
                                     "memory_total": [81_559.0] * 8, "temperature_gpu": [60.0] * 7 + [88.0],
                                     "power_draw": [650.0] * 8})
    data += agent_data(idle, sample, {"utilization_gpu": [3.0] * 8, "memory_used": [512.0] * 8,
                                      "memory_total": [81_559.0] * 8, "temperature_gpu": [35.0] * 8,
                                      "power_draw": [90.0] * 8})
    data += efa_data(tmp_path, busy, sample, tx_bytes=300_000_000_000, errors=0)
    data += efa_data(tmp_path, idle, sample, tx_bytes=1_000, errors=4)
    data += trainer_data(monkeypatch, sample)
    data += in_service_data(created, 120, nodes=3)
    put(data)
    record_job(fakes, now)
    return cluster.instance_ids, now


COLUMNS = ("NODE", "STATE", "GPU", "MEM", "TEMP", "POWER", "EFA TX", "EFA RX", "ERR")


def table_rows(text: str) -> dict[str, dict[str, str]]:
    """The nodes table's rows by instance id: column -> cell text."""
    rows = {}
    for line in text.splitlines():
        if line.startswith("│ i-"):
            cells = [c.strip() for c in line.strip().strip("│").split("│")]
            rows[cells[0]] = dict(zip(COLUMNS, cells, strict=True))
    return rows


def test_once_prints_the_nodes_the_job_and_the_cost(cli, busy_cluster):
    (busy, idle, silent), _ = busy_cluster
    result = cli("top", "--once")
    assert result.code == 0, result.err
    rows = table_rows(result.out)
    assert set(rows) == {busy, idle, silent}
    assert rows[busy] == {"NODE": busy, "STATE": "InService", "GPU": "95%", "MEM": "60.0/80 GiB", "TEMP": "88 C",
                          "POWER": "650 W", "EFA TX": "40.0", "EFA RX": "20.0", "ERR": "0"}  # 300 GB/60 s
    assert (rows[idle]["GPU"], rows[idle]["ERR"], rows[idle]["EFA TX"]) == ("3%", "4", "0.0")
    assert [rows[silent][c] for c in COLUMNS[2:]] == ["-"] * 7
    text = result.out
    assert f"Job {JOB}" in text and "running, attempt 1 (restarts: 0 of at most 5)" in text
    assert "step 40/100 (40%)" in text and "loss 2.2500" in text
    assert "tokens/s 131,072" in text and "MFU 8.3%" in text and "ETA 0h02m" in text
    assert "cost so far ~$330.24" in text and "3/3 x p5.48xlarge in service" in text


def test_json_has_the_same_numbers(cli, busy_cluster):
    (busy, idle, silent), now = busy_cluster
    result = cli("top", "--json")
    assert result.code == 0, result.err
    view = json.loads(result.out)
    nodes = {n["instance_id"]: n for n in view["nodes"]}
    assert nodes[busy]["gpu_utilization_pct"] == 95.0 and nodes[busy]["gpu_temperature_c"] == 88.0
    assert nodes[busy]["gpu_memory_used_mib"] == 61_440.0 and nodes[busy]["gpu_power_w"] == 650.0
    assert nodes[busy]["efa_tx_gbps"] == pytest.approx(40.0) and nodes[busy]["efa_rx_gbps"] == pytest.approx(20.0)
    assert nodes[idle]["efa_error_events"] == 4 and nodes[idle]["gpu_utilization_pct"] == 3.0
    assert nodes[silent]["gpu_utilization_pct"] is None
    job = view["job"]
    assert job["job_id"] == JOB and job["step"] == 40 and job["run_steps"] == 100
    # 131 072 tok/s x 1e10 FLOP/tok / 16 GPUs = 81.92 TFLOP/s per GPU of a 989 TFLOP/s peak
    assert job["tokens_per_s"] == pytest.approx(131072.0) and job["mfu_pct"] == pytest.approx(100 * 81.92 / 989)
    assert job["eta_s"] == pytest.approx(120.0) and job["straggler_ratio"] == 1.0
    assert view["job_source"] == "job table" and view["ended_job"] is None
    assert (job["state"], job["attempt"], job["restarts"], job["max_job_restarts"], job["nodes"]) == (
        "running", 1, 0, 5, 2)
    assert job["attempt_started_at"] == (now - datetime.timedelta(hours=1)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert view["cost_usd"] == pytest.approx(3 * 2 * 55.04)
    assert view["notes"] == []


def test_without_a_job_or_gpu_metrics_it_says_so(cli, cluster):
    cli.now = datetime.datetime.now(datetime.UTC)
    result = cli("top", "--once")
    assert result.code == 0, result.err
    assert "no active job in the job table: the cluster takes the next submit" in result.out
    assert "no GPU metrics from any node in the last 15 minutes" in result.out


def test_the_tables_active_job_is_shown_even_when_another_job_has_a_newer_step(cli, busy_cluster, monkeypatch,
                                                                               fakes):
    _, now = busy_cluster
    other = "j-20261121-080000-cd34"  # e.g. run by hand outside clusterctl, or a stack sharing the namespace
    put(trainer_data(monkeypatch, now - datetime.timedelta(minutes=1), job_id=other))
    calls = api_calls(cli)
    result = cli("top", "--json")
    assert result.code == 0, result.err
    view = json.loads(result.out)
    assert view["job"]["job_id"] == JOB and view["job"]["state"] == "running"
    assert view["job"]["updated_at"] == (now - datetime.timedelta(minutes=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    # the table, not the metrics, names the job: two reads, no ListMetrics; the operator policy grants them
    assert [c for c in calls if c.startswith("dynamodb:")] == ["dynamodb:GetItem", "dynamodb:GetItem"]
    assert "monitoring:ListMetrics" not in calls
    assert {c for c in calls if c.startswith("dynamodb:")} <= set(JOB_TABLE_ACTIONS)


def test_a_restarting_job_shows_its_state_attempt_and_how_old_its_last_step_is(cli, busy_cluster, fakes):
    _, now = busy_cluster
    table = fakes.job_table()
    record = table.get(JOB)
    lost = "node i-0123456789abcdef0 is gone (terminated)"
    ended = dataclasses.replace(record.current, ended_at=now.strftime("%Y-%m-%dT%H:%M:%SZ"), end_reason=lost,
                                step_reached=40)
    table.save(dataclasses.replace(record, state="restarting", reason=lost, attempts=[ended]), now)
    result = cli("top", "--once")
    assert result.code == 0, result.err
    text = " ".join(result.out.split())  # rich wraps the panel's lines
    assert "restarting, attempt 1 (restarts: 0 of at most 5)" in text
    assert f"reason: {lost}" in text
    assert "the job keeper starts attempt 2 once 2 nodes are ready: no steps until then" in text
    last = (now - datetime.timedelta(minutes=3)).strftime("%Y-%m-%dT%H:%M:%SZ")
    assert f"last record {last} (3 min ago): attempt 1's, before it ended" in text and "step 40/100" in text


def test_a_new_attempt_says_its_last_step_record_is_the_previous_attempts(cli, busy_cluster, fakes):
    _, now = busy_cluster
    table = fakes.job_table()
    record = table.get(JOB)
    lost = "node i-0123456789abcdef0 is gone (terminated)"
    first = dataclasses.replace(record.current, ended_at=record.current.started_at, end_reason=lost,
                                step_reached=40)
    started = now - datetime.timedelta(minutes=1)
    second = Attempt(number=2, nodes=["i-3", "i-4"], rendezvous_host="10.42.1.9",
                     started_at=started.strftime("%Y-%m-%dT%H:%M:%SZ"), resumed_from_step=30)
    table.save(dataclasses.replace(record, state="starting", reason=lost, attempts=[first, second]), now)
    calls = api_calls(cli)
    result = cli("top", "--once")
    assert result.code == 0, result.err
    text = " ".join(result.out.split())
    assert "starting, attempt 2 (restarts: 1 of at most 5)" in text
    assert "attempt 2 resumed from the checkpoint at step 30" in text
    assert f"from before attempt 2 started at {started.strftime('%Y-%m-%dT%H:%M:%SZ')}" in text
    assert calls.count("dynamodb:GetItem") == 2


def test_no_active_job_even_when_a_job_has_a_recent_step(cli, busy_cluster, fakes):
    fakes.end_job(JOB, state="succeeded")  # gives the lock back; its step metrics are 3 minutes old
    result = cli("top", "--json")
    assert result.code == 0, result.err
    view = json.loads(result.out)
    assert view["job"] is None and view["ended_job"] is None and view["job_source"] == "job table"
    result = cli("top", "--once")
    assert "no active job in the job table" in result.out and f"Job {JOB}" not in result.out


def test_a_lock_left_behind_by_an_ended_job_shows_no_active_job_and_names_it(cli, busy_cluster, fakes):
    ended = fakes.end_job(JOB, state="failed", reason="exit 1 on every node")
    boto3.client("dynamodb", region_name="us-east-1").put_item(  # as a hand edit or a partial restore leaves it
        TableName=fakes.JOB_TABLE, Item={"pk": {"S": LOCK_KEY}, "jobId": {"S": JOB}})
    result = cli("top", "--once")
    assert result.code == 0, result.err
    text = " ".join(result.out.split())
    assert f"no active job (the last one, {JOB}, ended failed at {ended.ended_at})" in text
    view = json.loads(cli("top", "--json").out)
    assert view["job"] is None and view["ended_job"] == {"job_id": JOB, "state": "failed",
                                                         "ended_at": ended.ended_at}


def test_a_stack_without_the_job_table_shows_the_job_with_the_newest_step(cli, moto_aws, fakes, monkeypatch):
    fakes.deploy_fake_cluster(job_table=False)
    now = datetime.datetime.now(datetime.UTC).replace(microsecond=0)
    cli.now = now
    older = "j-20261120-101500-ef56"
    put(trainer_data(monkeypatch, now - datetime.timedelta(minutes=30), job_id=older))
    put(trainer_data(monkeypatch, now - datetime.timedelta(minutes=2)))
    calls = api_calls(cli)
    result = cli("top", "--json")
    assert result.code == 0, result.err
    view = json.loads(result.out)
    assert view["job_source"] == "metrics" and view["job"]["job_id"] == JOB and view["job"]["step"] == 40
    assert view["job"]["state"] is None and view["job"]["attempt"] is None
    assert "monitoring:ListMetrics" in calls and not [c for c in calls if c.startswith("dynamodb:")]
    result = cli("top", "--once")
    assert f"Job {JOB}" in result.out and "attempt" not in result.out
    assert "last record" in result.out and "(2 min ago)" in result.out


def test_a_stack_without_the_job_table_and_no_recent_step_says_so(cli, moto_aws, fakes):
    fakes.deploy_fake_cluster(job_table=False)
    cli.now = datetime.datetime.now(datetime.UTC)
    result = cli("top", "--once")
    assert result.code == 0, result.err
    assert "no job has reported a step in the last 3 hours" in result.out


def test_live_mode_refreshes_until_ctrl_c(cli, busy_cluster, monkeypatch):
    import clusterctl.top_view

    out = io.StringIO()
    sleeps, views = [], []
    collect = clusterctl.top_view.collect
    monkeypatch.setattr(clusterctl.top_view, "collect", lambda *a: views.append(collect(*a)) or views[-1])

    def sleep(seconds):
        sleeps.append(seconds)
        if len(sleeps) == 2:
            raise KeyboardInterrupt

    runtime = Runtime(out=out, err=io.StringIO(), sleep=sleep, context=cli.context)
    runtime.now = lambda: busy_cluster[1]
    assert main(["top", "--interval", "5"], runtime) == 0
    assert sleeps == [5.0, 5.0]
    assert len(views) == 2 and all(v.job.job_id == JOB for v in views)  # drawn, then refreshed once
    assert f"Job {JOB}" in out.getvalue()  # rich.live leaves the last view on a plain file


def test_interval_is_validated(cli):
    with pytest.raises(SystemExit) as exited:
        cli("top", "--interval", "0")
    assert exited.value.code == 2


# ----- rendering, without AWS ------------------------------------------------------------------------------
def view(**job_fields) -> ClusterView:
    at = datetime.datetime(2026, 11, 20, 23, 30, tzinfo=datetime.UTC)
    nodes = [
        NodeView("i-0aaaaaaaaaaaaaaa1", "InService", "ready", 97.0, 70_000.0, 81_559.0, 71.0, 690.0, 350.5, 349.0,
                 0.0),
        NodeView("i-0aaaaaaaaaaaaaaa2", "InService", "ready", 4.0, 1_024.0, 81_559.0, 86.0, 120.0, 0.0, 0.0, 2.0),
        NodeView("i-0aaaaaaaaaaaaaaa3", "Pending", "running", None, None, None, None, None, None, None, None),
    ]
    job = JobView(**{"job_id": "j-1", "step": 500, "run_steps": 2000, "loss": 3.1415, "tokens_per_s": 1.25e6,
                     "mfu_pct": 41.5, "step_time_max_s": 1.2, "step_time_median_s": 0.9, "straggler_ratio": 1.33,
                     "slowest_rank": 12, "eta_s": 1800.0, "updated_at": at, **job_fields})
    return ClusterView(stack_name="TrainingClusterStack", instance_type="p5.48xlarge", node_count=3,
                       collected_at=at, nodes=nodes, job=job, group_created_at=at - datetime.timedelta(hours=5),
                       cost_usd=825.6, usd_per_node_hour=55.04)


def test_render_lays_out_nodes_job_and_cost():
    console = Console(width=150, color_system=None)
    with console.capture() as capture:
        console.print(render(view()))
    text = capture.get()
    assert "TrainingClusterStack   2/3 x p5.48xlarge in service   as of 2026-11-20T23:30:00Z" in text
    assert "cost so far ~$825.60 since 2026-11-20T18:30:00Z (nodes in service x $55.04/h On-Demand" in text
    rows = table_rows(text)
    assert rows["i-0aaaaaaaaaaaaaaa1"] == {"NODE": "i-0aaaaaaaaaaaaaaa1", "STATE": "InService", "GPU": "97%",
                                           "MEM": "68.4/80 GiB", "TEMP": "71 C", "POWER": "690 W",
                                           "EFA TX": "350.5", "EFA RX": "349.0", "ERR": "0"}
    assert rows["i-0aaaaaaaaaaaaaaa3"]["STATE"] == "Pending/running"
    assert "step 500/2000 (25%)   loss 3.1415   ETA 0h30m" in text
    assert "tokens/s 1,250,000   MFU 41.5%" in text and "slowest/median x1.33 (rank 12)" in text


def test_render_marks_idle_gpus_hot_gpus_and_efa_errors_in_red():
    console = Console(width=150, force_terminal=True, color_system="standard")
    with console.capture() as capture:
        console.print(render(view()))
    idle = next(line for line in capture.get().splitlines() if "i-0aaaaaaaaaaaaaaa2" in line)
    red, reset = "\x1b[1;31m", "\x1b[0m"
    assert f"{red} 4%{reset}" in idle and f"{red}86 C{reset}" in idle and f"{red}  2{reset}" in idle
    busy = next(line for line in capture.get().splitlines() if "i-0aaaaaaaaaaaaaaa1" in line)
    assert red not in busy


def test_render_without_a_job():
    console = Console(width=150, color_system=None)
    with console.capture() as capture:
        console.print(render(ClusterView(**{**view().__dict__, "job": None})))
    assert "no job has reported a step in the last 3 hours" in capture.get()


def test_render_shows_the_state_in_bold_so_a_stale_step_is_not_read_as_a_hang():
    console = Console(width=150, force_terminal=True, color_system="standard")
    restarting = view(state="restarting", attempt=3, restarts=2, max_job_restarts=5, nodes=3,
                      reason="node i-0aaaaaaaaaaaaaaa2 is unhealthy (Xid 79)")
    with console.capture() as capture:
        console.print(render(ClusterView(**{**restarting.__dict__, "job_source": "job table"})))
    assert "\x1b[1;33mrestarting\x1b[0m, attempt 3 (restarts: 2 of at most 5)" in capture.get()
    assert "the job keeper starts attempt 4 once 3 nodes are ready" in capture.get()
    assert "last record 2026-11-20T23:30:00Z (under a minute ago)" in capture.get()
