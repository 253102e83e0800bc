"""The trainer's CloudWatch Embedded Metric Format (EMF) step records: valid by the EMF specification, named as
the dashboard and alarms read them, written by rank 0 only, and the stdout JSON lines left as they were."""

from __future__ import annotations

import io
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
from emf_spec import extracted_metrics, parse_emf_line
from preloaded_ranks import run_preloaded

from training.errors import ConfigError
from training.metrics import MetricsConfig, MetricsLogger, ThroughputModel, build_emf_record

REPO = Path(__file__).resolve().parents[2]
H100 = ThroughputModel(tokens_per_step=8 * 2048 * 8, world_size=8, flops_per_token=1e10,
                       peak_tflops_per_gpu=989.0)
JOB_ENV = {"CLUSTER_STACK_NAME": "TrainingClusterStack", "CLUSTER_JOB_ID": "j-20261120-231502-ab12"}


def emf_lines(text: str) -> list[dict]:
    return [parse_emf_line(line) for line in text.splitlines() if line.startswith('{"_aws"')]


def log_one_step(monkeypatch, cfg: MetricsConfig, env: dict[str, str], **step) -> tuple[dict, str, str]:
    for key in JOB_ENV:
        monkeypatch.delenv(key, raising=False)
    for key, value in env.items():
        monkeypatch.setenv(key, value)
    out, err = io.StringIO(), io.StringIO()
    metrics = MetricsLogger(cfg, rank=0, world_size=1, device=torch.device("cpu"), model=H100, stdout=out,
                            stderr=err)
    args = {"step": 40, "total_steps": 100, "loss": torch.tensor(2.5), "lr": 3e-4,
            "grad_norm": torch.tensor(0.5), "step_time_s": 2.0, **step}
    record = metrics.log_step(**args)
    return record, out.getvalue(), err.getvalue()


def test_a_job_writes_one_valid_emf_line_per_logged_step(monkeypatch):
    record, out, err = log_one_step(monkeypatch, MetricsConfig(nvml=False), JOB_ENV)
    (document,) = emf_lines(err)
    assert document["Cluster"] == "TrainingClusterStack" and document["JobId"] == "j-20261120-231502-ab12"
    assert document["Step"] == 40 and document["RunSteps"] == 100 and document["Loss"] == 2.5
    assert document["TokensPerSecond"] == pytest.approx(65536.0)
    assert document["MFU"] == pytest.approx(100 * 81.92 / 989.0)  # percent
    assert document["StepTimeMax"] == document["StepTimeMedian"] == document["StepTimeMin"] == 2.0
    assert document["StragglerRatio"] == 1.0 and document["SlowestRank"] == 0
    assert document["EtaSeconds"] == pytest.approx(60 * 2.0)
    directives = document["_aws"]["CloudWatchMetrics"]
    assert [d["Dimensions"] for d in directives] == [[["Cluster", "JobId"]], [["Cluster"]]]
    assert {m["Name"] for m in directives[1]["Metrics"]} == {"TokensPerSecond", "MFU", "StragglerRatio"}
    units = {m["Name"]: m["Unit"] for m in directives[0]["Metrics"]}
    assert units["TokensPerSecond"] == "Count/Second" and units["StepTimeMax"] == "Seconds"
    assert units["MFU"] == "Percent"
    # stdout: exactly the JSON step line, as before
    assert json.loads(out) == record and "_aws" not in out


def test_no_emf_outside_a_job_unless_asked(monkeypatch):
    _, _, err = log_one_step(monkeypatch, MetricsConfig(nvml=False), {})
    assert emf_lines(err) == []
    _, _, err = log_one_step(monkeypatch, MetricsConfig(nvml=False, emf="off"), JOB_ENV)
    assert emf_lines(err) == []
    _, _, err = log_one_step(monkeypatch, MetricsConfig(nvml=False, emf="on"), {})
    (document,) = emf_lines(err)
    assert (document["Cluster"], document["JobId"]) == ("local", "local")


def test_a_diverged_loss_is_left_out_of_the_emf_record(monkeypatch):
    _, out, err = log_one_step(monkeypatch, MetricsConfig(nvml=False), JOB_ENV, loss=torch.tensor(float("nan")),
                               grad_norm=torch.tensor(float("inf")))
    (document,) = emf_lines(err)  # still valid: no NaN anywhere
    assert "Loss" not in document and "GradNorm" not in document
    assert all(m["Name"] not in ("Loss", "GradNorm") for m in document["_aws"]["CloudWatchMetrics"][0]["Metrics"])
    assert json.loads(out)["loss"] is None


def test_the_straggler_ratio_is_the_slowest_rank_over_the_median():
    record = {"step": 5, "run_steps": 10, "loss": 1.0, "lr": 1e-3, "grad_norm": 1.0, "tokens_per_s": 10.0,
              "tflops": 1.0, "mfu": None, "step_time_s_max": 1.5, "step_time_s_median": 1.0,
              "step_time_s_min": 0.9, "slowest_rank": 3, "mem_gib": 1.0}
    document = build_emf_record(record, namespace="TrainingCluster", cluster="c", job_id="j",
                                timestamp_ms=1_790_000_000_000)
    assert document["StragglerRatio"] == 1.5 and document["SlowestRank"] == 3 and "MFU" not in document
    assert document["EtaSeconds"] == 7.5
    by_dims = {(d["MetricName"], tuple(x["Name"] for x in d["Dimensions"])) for d in extracted_metrics(document)}
    assert ("StragglerRatio", ("Cluster",)) in by_dims and ("Loss", ("Cluster", "JobId")) in by_dims
    assert ("Loss", ("Cluster",)) not in by_dims


def test_emf_mode_is_validated():
    with pytest.raises(ConfigError, match=r"metrics.emf='sometimes': allowed: auto, on, off"):
        MetricsConfig(emf="sometimes").validate()


# ---------------------------------------------------------------------------------------------------------
def _env(**extra: str) -> dict[str, str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return env


def test_a_step_that_evaluated_the_held_out_loss_adds_it_and_its_perplexity(monkeypatch):
    from training.validation import ValidationResult

    record, out, err = log_one_step(monkeypatch, MetricsConfig(nvml=False), JOB_ENV,
                                    validation=ValidationResult(step=40, loss=2.25, time_s=3.0))
    (document,) = emf_lines(err)
    assert document["ValidationLoss"] == 2.25 and document["ValidationPerplexity"] == pytest.approx(9.487735836)
    units = {m["Name"]: m["Unit"] for m in document["_aws"]["CloudWatchMetrics"][0]["Metrics"]}
    assert units["ValidationLoss"] == units["ValidationPerplexity"] == "None"
    job_metrics = {(d["MetricName"], tuple(x["Name"] for x in d["Dimensions"])) for d in extracted_metrics(document)}
    assert ("ValidationLoss", ("Cluster", "JobId")) in job_metrics
    assert ("ValidationLoss", ("Cluster",)) not in job_metrics  # no alarm watches it
    assert json.loads(out)["val_loss"] == record["val_loss"] == 2.25
    # a step without an evaluation has neither; a perplexity past a float's range is left out, the loss stays
    _, _, err = log_one_step(monkeypatch, MetricsConfig(nvml=False), JOB_ENV)
    (document,) = emf_lines(err)
    assert "ValidationLoss" not in document and "ValidationPerplexity" not in document
    _, _, err = log_one_step(monkeypatch, MetricsConfig(nvml=False), JOB_ENV,
                             validation=ValidationResult(step=40, loss=800.0, time_s=3.0))
    (document,) = emf_lines(err)
    assert document["ValidationLoss"] == 800.0 and "ValidationPerplexity" not in document


@pytest.mark.slow
def test_the_tiny_cpu_training_writes_emf_lines_in_a_job():
    # the README's `python -m training` (tiny-cpu.toml), shortened, as the job supervisor runs it
    proc = run_preloaded(["-m", "training", "--set", "run.steps=20", "--set", "run.log_interval_steps=10"],
                         cwd=REPO, env=_env(**JOB_ENV), timeout=300)
    assert proc.returncode == 0, proc.stderr
    steps = [json.loads(line) for line in proc.stdout.splitlines() if '"event": "step"' in line]
    assert [s["step"] for s in steps] == [1, 10, 20] and all(s["event"] == "step" for s in steps)
    documents = emf_lines(proc.stderr)
    assert [d["Step"] for d in documents] == [1, 10, 20]
    assert [d["Loss"] for d in documents] == pytest.approx([s["loss"] for s in steps])
    assert documents[-1]["EtaSeconds"] == 0 and documents[0]["RunSteps"] == 20
    assert {d["JobId"] for d in documents} == {"j-20261120-231502-ab12"}


@pytest.mark.slow
def test_under_torchrun_only_rank_0_writes_emf_and_lines_stay_whole():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2", "-m", "training",
           "--set", "run.steps=4", "--set", "run.log_interval_steps=2", "--set", "run.seq_len=32",
           "--set", "run.micro_batch_size=4"]
    # stdout and stderr into one pipe, as the job supervisor tees them into the job log
    proc = subprocess.run(cmd, cwd=REPO, env=_env(**JOB_ENV), text=True, stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, timeout=300)
    assert proc.returncode == 0, proc.stdout
    documents = emf_lines(proc.stdout)  # every EMF line parses whole: nothing interleaved into it
    assert [d["Step"] for d in documents] == [1, 2, 4]
    assert all(d["SlowestRank"] in (0, 1) for d in documents)
    assert proc.stdout.count('"CloudWatchMetrics"') == 3
