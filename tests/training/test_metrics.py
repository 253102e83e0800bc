"""Step records, the progress line, throughput/MFU arithmetic, and the [metrics] settings."""

from __future__ import annotations

import io
import json
from pathlib import Path

import pytest
import torch

from training.config import load_config
from training.errors import ConfigError
from training.metrics import (
    GpuSampler,
    MetricsConfig,
    MetricsLogger,
    ThroughputModel,
    log_resume,
    summarize_ranks,
    throughput,
)

H100 = ThroughputModel(tokens_per_step=8 * 2048 * 8, world_size=8, flops_per_token=1e10,
                       peak_tflops_per_gpu=989.0)
CPU = ThroughputModel(tokens_per_step=512, world_size=2, flops_per_token=1e6, peak_tflops_per_gpu=None)


def test_summarize_ranks_names_the_slowest():
    assert summarize_ranks([0.20, 0.50, 0.30]) == {"step_time_s_min": 0.20, "step_time_s_max": 0.50,
                                                   "slowest_rank": 1}


def test_throughput_tflops_and_mfu():
    result = throughput(2.0, H100)
    assert result["tokens_per_s"] == pytest.approx(65536.0)
    # 65536 tok/s x 1e10 FLOP/tok / 8 GPUs = 81.92 TFLOP/s per GPU
    assert result["tflops"] == pytest.approx(81.92)
    assert result["mfu"] == pytest.approx(81.92 / 989.0)


def test_no_mfu_without_a_peak():
    assert throughput(1.0, CPU)["mfu"] is None


def logger(cfg: MetricsConfig | None = None, **kwargs) -> tuple[MetricsLogger, io.StringIO, io.StringIO]:
    out, err = io.StringIO(), io.StringIO()
    metrics = MetricsLogger(cfg or MetricsConfig(nvml=False), rank=0, world_size=1,
                            device=torch.device("cpu"), model=CPU, stdout=out, stderr=err, **kwargs)
    return metrics, out, err


def test_a_step_record_is_one_json_line_with_the_launcher_keys():
    metrics, out, err = logger()
    record = metrics.log_step(step=7, total_steps=100, loss=torch.tensor(2.5), lr=1e-3,
                              grad_norm=torch.tensor(0.75), step_time_s=0.25)
    (line,) = out.getvalue().splitlines()
    parsed = json.loads(line)
    assert parsed == record
    assert parsed["event"] == "step" and parsed["step"] == 7 and parsed["loss"] == 2.5
    assert parsed["lr"] == 1e-3 and parsed["grad_norm"] == 0.75
    assert parsed["tokens_per_s"] == pytest.approx(2048.0)
    assert parsed["tflops"] == pytest.approx(2048.0 * 1e6 / 2 / 1e12)
    assert parsed["mfu"] is None
    assert parsed["step_time_s_min"] == parsed["step_time_s_max"] == 0.25 and parsed["slowest_rank"] == 0
    assert parsed["mem_gib"] > 0
    assert err.getvalue().startswith("step 7/100 loss 2.5000 lr 1.00e-03 2,048 tok/s")
    assert "slowest rank 0" in err.getvalue()


def test_a_nan_loss_is_written_as_null():
    metrics, out, err = logger()
    metrics.log_step(step=1, total_steps=2, loss=torch.tensor(float("nan")), lr=1e-3,
                     grad_norm=torch.tensor(float("inf")), step_time_s=0.1)
    parsed = json.loads(out.getvalue())  # strict JSON: no NaN token
    assert parsed["loss"] is None and parsed["grad_norm"] is None
    assert "loss nan" in err.getvalue()


def test_outputs_can_be_switched_off():
    metrics, out, err = logger(MetricsConfig(json_lines=False, progress=False, nvml=False))
    returned = metrics.log_step(step=1, total_steps=1, loss=torch.tensor(1.0), lr=0.1,
                                grad_norm=torch.tensor(1.0), step_time_s=0.1)
    assert returned is not None
    assert out.getvalue() == "" and err.getvalue() == ""


def test_gpu_sampler_is_off_on_a_cpu():
    assert GpuSampler(torch.device("cpu"), enabled=True).sample() == {}


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"cloudwatch_namespace": ""}, "metrics.cloudwatch_namespace='': allowed: a non-empty name"),
        ({"cloudwatch_namespace": "AWS/EC2"}, "metrics.cloudwatch_namespace='AWS/EC2'"),
    ],
)
def test_invalid_values_name_the_field(fields, message):
    with pytest.raises(ConfigError) as err:
        MetricsConfig(**fields).validate()
    assert str(err.value).startswith(message)


def test_publishing_from_the_job_is_refused_in_one_line_pointing_to_emf(tmp_path):
    """Jobs have no AWS credentials (the metadata service is closed to the job user): PutMetricData from
    the trainer cannot work on the cluster, so asking for it fails before a step, naming what does work."""
    message = ("metrics.cloudwatch=true: allowed: false. Jobs have no AWS credentials (docs/security.md); step "
               "metrics reach CloudWatch as EMF lines the nodes' CloudWatch agent ships: metrics.emf='auto' "
               "(the default: on in cluster jobs) or 'on'")
    with pytest.raises(ConfigError) as err:
        MetricsConfig(cloudwatch=True).validate()
    assert str(err.value) == message
    config = Path(__file__).parents[2] / "training/configs/tiny-cpu.toml"
    with pytest.raises(ConfigError) as err:
        load_config(config, ["metrics.cloudwatch=true"])
    assert str(err.value) == message
    # the settings that only PutMetricData read are gone: a config that still sets one is told so
    with pytest.raises(ConfigError, match=r"^metrics.cloudwatch_region: unknown key; allowed: "):
        load_config(config, ["metrics.cloudwatch_region=us-east-1"])
    assert load_config(config, ["metrics.cloudwatch=false"]).metrics.cloudwatch is False


def test_local_rank_0_of_every_other_node_prints_a_short_step_line_for_its_supervisor():
    """Only global rank 0 has the whole record; the job supervisor on each node watches its own node's log
    for progress (node_bootstrap/jobs/progress.py), so each node's first local rank says which step it did."""
    lines = {}
    for rank, local_rank in ((8, 0), (9, 1)):
        out, err = io.StringIO(), io.StringIO()
        metrics = MetricsLogger(MetricsConfig(nvml=False), rank=rank, local_rank=local_rank, world_size=16,
                                device=torch.device("cpu"), model=CPU, stdout=out, stderr=err)
        assert metrics.log_step(step=40, total_steps=100, loss=torch.tensor(2.5), lr=1e-3,
                                grad_norm=torch.tensor(0.75), step_time_s=0.25) is None
        lines[(rank, local_rank)] = (out.getvalue(), err.getvalue())
    assert lines[(8, 0)] == ('{"event": "step", "step": 40, "rank": 8}\n', "")
    assert lines[(9, 1)] == ("", "")
    from node_bootstrap.jobs import find_last_step
    assert find_last_step("[rank8]:" + lines[(8, 0)][0]) == {"event": "step", "step": 40, "rank": 8}


def test_the_resume_line_says_where_the_run_started_on_every_nodes_first_rank():
    """Printed once after the resume decision; the jobs launcher's status reads it as resumedFromStep."""
    from node_bootstrap.jobs import find_resumed_from_step

    def printed(rank, local_rank, step, path, cfg=None):
        out = io.StringIO()
        log_resume(cfg or MetricsConfig(), rank=rank, local_rank=local_rank, step=step, path=path, stdout=out)
        return out.getvalue()

    resumed = printed(0, 0, 1200, Path("/fsx/checkpoints/j-1/step-1200"))
    assert resumed == '{"event": "resume", "step": 1200, "path": "/fsx/checkpoints/j-1/step-1200"}\n'
    assert printed(0, 0, 0, None) == '{"event": "resume", "step": 0, "path": null}\n'  # a fresh start
    # the first local rank of another node says the same, with its rank; the other ranks say nothing
    assert json.loads(printed(8, 0, 1200, "/fsx/checkpoints/j-1/step-1200")) == {
        "event": "resume", "step": 1200, "path": "/fsx/checkpoints/j-1/step-1200", "rank": 8}
    assert printed(9, 1, 1200, "/x") == printed(1, 1, 1200, "/x") == ""
    assert printed(0, 0, 5, "/x", MetricsConfig(json_lines=False)) == ""  # no JSON lines asked for
    # the node's parser, under torchrun's line prefix, after step lines of an earlier start of the trainer
    log = '{"event": "resume", "step": 0, "path": null}\n{"event": "step", "step": 1100, "loss": 2.0}\n'
    assert find_resumed_from_step(log + "[rank0]:" + resumed) == 1200
    assert find_resumed_from_step(log) == 0 and find_resumed_from_step('{"event": "step", "step": 3}') is None


def test_the_resume_line_names_the_tier_and_the_fetched_shards():
    from node_bootstrap.jobs import find_resumed_from_tier

    out = io.StringIO()
    log_resume(MetricsConfig(), rank=0, local_rank=0, step=40, path="/scratch/checkpoints/j-1/step-40/rank-0",
               stdout=out, tier="local", fetched=8)
    assert json.loads(out.getvalue()) == {"event": "resume", "step": 40,
                                          "path": "/scratch/checkpoints/j-1/step-40/rank-0", "tier": "local",
                                          "fetched": 8}
    assert find_resumed_from_tier(out.getvalue()) == "local"
    assert find_resumed_from_tier('{"event": "resume", "step": 0, "path": null}') is None  # a fresh start
