"""`clusterctl top` against moto's CloudWatch, with metrics put in the shapes the cluster publishes them: the
CloudWatch agent's roll-ups (derived from the agent config the stack renders), the EFA collector's and the
trainer's EMF records (their real lines, extracted as CloudWatch Logs does), and the Auto Scaling group's
metrics (see top_support): the nodes, the job (the job table's active job, or on a stack without the table
the one with the newest step) and the cost, as text and JSON, and live mode. Rendering alone is in
test_top_render.py."""

from __future__ import annotations

import dataclasses
import datetime
import io
import json
import math

import boto3
import pytest
from top_support import (
    COLUMNS,
    GROUP,
    JOB,
    agent_data,
    api_calls,
    efa_data,
    in_service_data,
    put,
    record_job,
    table_rows,
    trainer_data,
)

from cluster_constructs.jobs import OPERATOR_TABLE_ACTIONS
from cluster_jobs.table import LOCK_KEY, Attempt
from clusterctl.cli import main
from clusterctl.runtime import Runtime


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


def test_a_job_with_validation_shows_its_newest_held_out_loss(cli, busy_cluster, monkeypatch):
    from training.validation import ValidationResult

    _, now = busy_cluster
    put(trainer_data(monkeypatch, now - datetime.timedelta(minutes=1),
                     validation=ValidationResult(step=40, loss=2.125, time_s=4.0)))
    result = cli("top", "--once")
    assert result.code == 0, result.err
    assert "validation loss 2.1250   perplexity 8.37" in result.out
    job = json.loads(cli("top", "--json").out)["job"]
    assert job["val_loss"] == 2.125 and job["val_perplexity"] == pytest.approx(math.exp(2.125))


def test_once_without_validation_shows_no_held_out_loss(cli, busy_cluster):
    result = cli("top", "--once")
    assert "validation loss" not in result.out
    assert json.loads(cli("top", "--json").out)["job"]["val_loss"] is None


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
    assert {c for c in calls if c.startswith("dynamodb:")} <= set(OPERATOR_TABLE_ACTIONS)


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
    import clusterctl.watch.command

    out = io.StringIO()
    sleeps, views = [], []
    collect = clusterctl.watch.command.collect
    monkeypatch.setattr(clusterctl.watch.command, "collect", lambda *a: views.append(collect(*a)) or views[-1])

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
