"""training/goodput_line.py: the trainer's own goodput (its counted step seconds over its process's wall time),
in every step record, its EMF metric `Goodput` and the last step's progress line."""

from __future__ import annotations

import io
import json

import pytest
import torch

from training.goodput_line import TrainerGoodput
from training.metrics import MetricsConfig, MetricsLogger, ThroughputModel


class Clock:
    def __init__(self) -> None:
        self.now = 100.0

    def __call__(self) -> float:
        return self.now


def test_the_first_step_of_a_start_compiles_and_is_not_counted():
    clock = Clock()
    goodput = TrainerGoodput(started_s=100.0, clock=clock)
    goodput.add(41, 30.0, first_of_start=True)  # resumed from 40: the first step compiled for 30 s
    goodput.add(50, 2.0, first_of_start=False)  # 9 steps of 2 s since step 41
    goodput.add(60, 2.5, first_of_start=False)  # 10 of 2.5 s
    clock.now = 200.0
    assert goodput.step_s == pytest.approx(9 * 2.0 + 10 * 2.5)
    assert goodput.pct() == pytest.approx(43.0)
    assert goodput.line() == "goodput 43.0% (steps 43.0 s of 100.0 s in this process)"


def test_every_step_record_carries_it_and_the_last_progress_line_says_it(monkeypatch):
    monkeypatch.setenv("CLUSTER_STACK_NAME", "TrainingClusterStack")
    monkeypatch.setenv("CLUSTER_JOB_ID", "j-20261120-231502-ab12")
    out, err = io.StringIO(), io.StringIO()
    model = ThroughputModel(tokens_per_step=1024, world_size=1, flops_per_token=1e6, peak_tflops_per_gpu=None)
    metrics = MetricsLogger(MetricsConfig(nvml=False, emf="on"), rank=0, world_size=1, device=torch.device("cpu"),
                            model=model, stdout=out, stderr=err)
    clock = Clock()
    metrics.goodput = TrainerGoodput(started_s=90.0, clock=clock)
    step = {"loss": torch.tensor(2.0), "lr": 1e-4, "grad_norm": torch.tensor(1.0)}
    metrics.log_step(step=1, total_steps=5, step_time_s=8.0, phases={"first_step": "t"}, **step)
    clock.now = 110.0
    metrics.log_step(step=5, total_steps=5, step_time_s=1.5, **step)  # 4 steps of 1.5 s: 6 s of 20 s
    records = [json.loads(line) for line in out.getvalue().splitlines()]
    assert [r["goodput_pct"] for r in records] == [0.0, pytest.approx(30.0)]
    emf = [json.loads(line) for line in err.getvalue().splitlines() if line.startswith('{"_aws"')]
    assert emf[-1]["Goodput"] == pytest.approx(30.0)
    assert {"Name": "Goodput", "Unit": "Percent"} in emf[-1]["_aws"]["CloudWatchMetrics"][0]["Metrics"]
    progress = [line for line in err.getvalue().splitlines() if line.startswith("step ")]
    assert progress[-1].endswith("goodput 30.0% (steps 6.0 s of 20.0 s in this process)")
    assert "goodput" not in progress[0]
