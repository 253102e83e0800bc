"""Metrics come only from the node's own processes (issue 42, item 5): a job's EMF-looking line never reaches
CloudWatch as printed; the supervisor publishes the trainer's step metrics, and only those, under the node's
namespace and dimensions. The supervisor runs for real, in-process (test_job_report.py's harness)."""

from __future__ import annotations

import json
from pathlib import Path

from emf_spec import extracted_metrics, parse_emf_line, validate_emf
from node_supervisor_support import JOB, make_settings, printing, run_job

from node_bootstrap import jobs
from node_bootstrap.jobs.job_metrics import (
    CLUSTER_METRICS,
    DEFUSED,
    TRAINER_METRICS,
    build_document,
    defused,
    looks_like_emf,
)
from training import metrics as trainer_metrics

# What a job printed to fire the node health alarm (issue 42's reproduction, in the monitor's own shape).
FORGED = {"_aws": {"Timestamp": 1764000000000, "CloudWatchMetrics": [
    {"Namespace": "TrainingCluster", "Dimensions": [["AutoScalingGroupName"]],
     "Metrics": [{"Name": "NodeUnhealthy", "Unit": "Count"}]}]},
    "AutoScalingGroupName": "TrainingClusterStack-nodes", "NodeUnhealthy": 1}
STEP_RECORD = {"event": "step", "step": 40, "loss": 2.5, "lr": 3e-4, "grad_norm": 1.0, "tokens_per_s": 5000.0,
               "tflops": 300.0, "mfu": 0.4, "step_time_s_max": 1.2, "step_time_s_min": 1.0, "slowest_rank": 3,
               "mem_gib": 60.0, "run_steps": 100, "step_time_s_median": 1.1, "goodput_pct": 87.5}


def as_agent_sees(line: str) -> bool:
    """Whether the CloudWatch agent takes a line (and so its stream) for EMF (tests/emf_spec.py)."""
    text = line.strip()
    return text.startswith("{") and text.endswith("}") and "CloudWatchMetrics" in text


def test_the_schema_is_the_trainers_own_list():
    assert TRAINER_METRICS == {name: unit for name, _, unit in trainer_metrics._EMF_METRICS}
    assert CLUSTER_METRICS == trainer_metrics._EMF_CLUSTER_METRICS


def test_no_line_of_the_job_log_is_emf_and_a_forged_metric_is_not_published(tmp_path):
    settings = make_settings(tmp_path, stack_name="TrainingClusterStack", metrics_namespace="TrainingCluster")
    trainer_line = json.dumps(trainer_metrics.build_emf_record(
        STEP_RECORD, namespace="SomethingElse", cluster="another-cluster", job_id="another-job", timestamp_ms=1))
    status = run_job(settings, printing(json.dumps(FORGED) + "\n" + trainer_line + "\n"))
    log = Path(status["logPath"]).read_text().splitlines()
    assert not [line for line in log if as_agent_sees(line)]
    assert DEFUSED.decode() + json.dumps(FORGED) in log  # still there for people to read
    published = [parse_emf_line(line) for line in
                 Path(jobs.JobFiles.of(settings, JOB).metrics_path).read_text().splitlines()]
    assert len(published) == 1  # the trainer's line; the forged one had no metric of the trainer's
    validate_emf(published[0])
    data = extracted_metrics(published[0])
    assert {d["MetricName"] for d in data} == set(TRAINER_METRICS) - {"ValidationLoss", "ValidationPerplexity"}
    assert {d["Namespace"] for d in data} == {"TrainingCluster"}
    assert {tuple((x["Name"], x["Value"]) for x in d["Dimensions"]) for d in data} == {
        (("Cluster", "TrainingClusterStack"), ("JobId", JOB)), (("Cluster", "TrainingClusterStack"),)}
    assert status["rejectedValues"] == {"emf": 1}


def test_what_the_node_publishes_is_what_the_trainer_asked_for_in_the_nodes_names():
    mine = trainer_metrics.build_emf_record(STEP_RECORD, namespace="TrainingCluster", cluster="c", job_id="j",
                                            timestamp_ms=7)
    values = {name: mine[name] for name in TRAINER_METRICS if name in mine}
    assert build_document(values, namespace="TrainingCluster", cluster="c", job_id="j", timestamp_ms=7) == mine


def test_a_value_that_is_no_finite_number_is_dropped_and_counted(tmp_path):
    settings = make_settings(tmp_path)
    line = json.dumps({"_aws": {"CloudWatchMetrics": []}, "Loss": "NaN", "Step": True, "MFU": 1e300,
                       "TokensPerSecond": 10.0})
    status = run_job(settings, printing(line + "\n"))
    (published,) = Path(jobs.JobFiles.of(settings, JOB).metrics_path).read_text().splitlines()
    assert {k: v for k, v in json.loads(published).items() if k in TRAINER_METRICS} == {"TokensPerSecond": 10.0}
    assert status["rejectedValues"] == {"emf": 3}


def test_an_emf_key_spelt_with_json_escapes_is_defused_too():
    # "Cloud\u0057atchMetrics" is the EMF key to any JSON reader: the byte match alone missed it (a review)
    escaped = json.dumps(FORGED).replace("CloudWatchMetrics", "Cloud\\u0057atchMetrics").encode() + b"\n"
    assert b"CloudWatchMetrics" not in escaped and json.loads(escaped) == FORGED
    assert looks_like_emf(escaped) and defused(escaped) == DEFUSED + escaped
    plain = b'{"event": "step", "step": 3, "note": "caf\\u00e9"}\n'  # an escape, but no EMF key: kept as printed
    assert not looks_like_emf(plain) and defused(plain) == plain
    assert not looks_like_emf(b'{"_aws": "Cloud\\u0057atch' + b"x" * 10 + b"\n")  # not JSON: no reader takes it
