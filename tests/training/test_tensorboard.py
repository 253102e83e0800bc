"""training/tensorboard.py: event files that TensorBoard's own reader (the tensorboard package, test-only) reads."""

from __future__ import annotations

import io
import json
import os
from pathlib import Path

import pytest
import torch
from preloaded_ranks import run_preloaded
from tensorboard.backend.event_processing.event_accumulator import EventAccumulator
from tensorboard.backend.event_processing.event_file_loader import EventFileLoader

from training.config import load_config
from training.config.sections import JOB_ID_ENV
from training.errors import ConfigError
from training.metrics import MetricsConfig, MetricsLogger, ThroughputModel
from training.tensorboard import SCALARS, EventFileWriter, crc32c, open_tensorboard, scalars_of
from training.validation import ValidationResult

REPO = Path(__file__).resolve().parents[2]
CPU = ThroughputModel(tokens_per_step=512, world_size=1, flops_per_token=1e6, peak_tflops_per_gpu=None)
H100 = ThroughputModel(tokens_per_step=8 * 2048 * 8, world_size=8, flops_per_token=1e10, peak_tflops_per_gpu=989.0)


def read_scalars(directory: Path) -> dict[str, list[tuple[int, float, float]]]:
    """tag -> [(step, value, wall_time)] as TensorBoard shows the run (every file in the directory)."""
    acc = EventAccumulator(str(directory))
    acc.Reload()
    return {tag: [(e.step, e.value, e.wall_time) for e in acc.Scalars(tag)] for tag in acc.Tags()["scalars"]}


def test_crc32c_is_castagnoli():
    assert crc32c(b"123456789") == 0xE3069283  # the CRC-32C check value (RFC 3720, B.4)
    assert crc32c(b"") == 0


def test_tensorboard_reads_the_scalars_back(tmp_path):
    writer = EventFileWriter(tmp_path, clock=lambda: 1_700_000_000.25)
    writer.add_scalars(1, {"loss/train": 2.5, "optim/lr": 1e-3})
    writer.add_scalars(10, {"loss/train": 1.75, "optim/lr": 3e-4, "loss/validation": 1.5})
    writer.add_scalars(11, {})  # nothing to write: no empty event
    (name,) = [p.name for p in tmp_path.iterdir()]
    assert name.startswith("events.out.tfevents.1700000000.") and f".{os.getpid()}." in name
    assert read_scalars(tmp_path) == {
        "loss/train": [(1, 2.5, 1_700_000_000.25), (10, 1.75, 1_700_000_000.25)],
        "optim/lr": [(1, pytest.approx(1e-3), 1_700_000_000.25), (10, pytest.approx(3e-4), 1_700_000_000.25)],
        "loss/validation": [(10, 1.5, 1_700_000_000.25)],
    }
    events = list(EventFileLoader(str(writer.path)).Load())
    assert events[0].file_version == "brain.Event:2" and len(events) == 3


def test_tensorboard_checks_the_record_crcs(tmp_path):
    # A record whose data CRC is off by one bit is dropped by TensorBoard's reader: it verifies the CRCs, so the
    # records it accepts above carry correct ones.
    writer = EventFileWriter(tmp_path, clock=lambda: 5.0)
    writer.add_scalars(1, {"loss/train": 2.5})
    writer.add_scalars(2, {"loss/train": 2.0})
    data = bytearray(writer.path.read_bytes())
    data[-1] ^= 0x01  # the last record's masked CRC of its data
    writer.path.write_bytes(bytes(data))
    steps = [e.step for e in EventFileLoader(str(writer.path)).Load() if e.HasField("summary")]
    assert steps == [1]


def test_a_resumed_run_writes_a_new_file_that_supersedes_the_steps_after_its_checkpoint(tmp_path):
    first = EventFileWriter(tmp_path, clock=lambda: 1000.0)
    for step in range(1, 6):  # the attempt that died at step 5; its last checkpoint was step 3
        first.add_scalars(step, {"loss/train": 10.0 - step})
    second = EventFileWriter(tmp_path, start_step=3, clock=lambda: 2000.0)
    for step in range(4, 7):
        second.add_scalars(step, {"loss/train": 100.0 - step})
    assert len(list(tmp_path.iterdir())) == 2 and first.path != second.path
    assert [(s, v) for s, v, _ in read_scalars(tmp_path)["loss/train"]] == [
        (1, 9.0), (2, 8.0), (3, 7.0), (4, 96.0), (5, 95.0), (6, 94.0)]


def _record(**extra):
    return {"event": "step", "step": 3, "loss": 2.0, "lr": 1e-3, "grad_norm": 0.5, "tokens_per_s": 1000.0,
            "tflops": 1.5, "mfu": 0.25, "step_time_s_max": 0.5, **extra}


def test_scalars_of_a_step_record():
    assert scalars_of(_record(val_loss=1.25)) == {
        "loss/train": 2.0, "loss/validation": 1.25, "optim/lr": 1e-3, "optim/grad_norm": 0.5,
        "throughput/tokens_per_s": 1000.0, "throughput/tflops_per_gpu": 1.5, "throughput/mfu_pct": 25.0,
        "throughput/step_time_s": 0.5}
    assert len(SCALARS) == 8
    # as in EMF: a diverged loss, MFU on a CPU, and a value past float32 are left out, not written as garbage
    left = scalars_of(_record(loss=float("nan"), mfu=None, grad_norm=1e39))
    assert not {"loss/train", "throughput/mfu_pct", "optim/grad_norm", "loss/validation"} & set(left)


def test_the_metrics_logger_writes_each_logged_step(tmp_path):
    writer = EventFileWriter(tmp_path)
    metrics = MetricsLogger(MetricsConfig(nvml=False, emf="off"), rank=0, world_size=8, device=torch.device("cpu"),
                            model=H100, stdout=io.StringIO(), stderr=io.StringIO(), tensorboard=writer)
    first = metrics.log_step(step=1, total_steps=20, loss=torch.tensor(3.0), lr=1e-4, grad_norm=torch.tensor(2.0),
                             step_time_s=2.0)
    last = metrics.log_step(step=20, total_steps=20, loss=torch.tensor(2.0), lr=3e-4, grad_norm=torch.tensor(1.0),
                            step_time_s=1.0, validation=ValidationResult(step=20, loss=2.25, time_s=0.1))
    scalars = read_scalars(tmp_path)
    assert set(scalars) == {tag for tag, _ in SCALARS}
    assert [(s, v) for s, v, _ in scalars["loss/train"]] == [(1, first["loss"]), (20, last["loss"])]
    assert [(s, v) for s, v, _ in scalars["loss/validation"]] == [(20, 2.25)]  # only where it was evaluated
    assert [s for s, _, _ in scalars["throughput/tokens_per_s"]] == [1, 20]
    assert scalars["throughput/tokens_per_s"][1][1] == pytest.approx(last["tokens_per_s"])
    assert scalars["throughput/mfu_pct"][1][1] == pytest.approx(100 * last["mfu"])
    assert scalars["optim/lr"][1][1] == pytest.approx(3e-4)


def test_only_rank_0_of_an_enabled_run_writes(tmp_path):
    job = {JOB_ID_ENV: "job-1"}
    ckpt = str(tmp_path / "ckpt")
    assert open_tensorboard(MetricsConfig(), ckpt, rank=0, start_step=0, environ={}) is None  # auto, not a job
    assert open_tensorboard(MetricsConfig(), "", rank=0, start_step=0, environ=job) is None  # auto, no dir
    assert open_tensorboard(MetricsConfig(tensorboard="off"), ckpt, rank=0, start_step=0, environ=job) is None
    assert open_tensorboard(MetricsConfig(), ckpt, rank=1, start_step=0, environ=job) is None
    assert not (tmp_path / "ckpt").exists()
    writer = open_tensorboard(MetricsConfig(), ckpt, rank=0, start_step=0, environ=job)
    assert writer is not None and writer.path.parent == tmp_path / "ckpt" / "tensorboard"
    forced = open_tensorboard(MetricsConfig(tensorboard="on"), ckpt, rank=0, start_step=0, environ={})
    assert forced is not None and forced.path.parent == writer.path.parent


def test_the_setting_is_checked():
    assert load_config(None).metrics.tensorboard == "auto"
    with pytest.raises(ConfigError, match=r"^metrics.tensorboard='yes': allowed: auto, on, off$"):
        load_config(None, ["metrics.tensorboard=yes"])
    with pytest.raises(ConfigError, match=r"^metrics.tensorboard='on': needs checkpoint.dir set"):
        load_config(None, ["metrics.tensorboard=on"])
    assert load_config(None, ["metrics.tensorboard=on", "checkpoint.dir=/tmp/x"]).metrics.tensorboard == "on"


def test_a_checkpoint_dir_that_cannot_hold_the_files_leaves_the_run_without_them(tmp_path, caplog):
    (tmp_path / "ckpt").write_text("a file where the directory should be")
    assert open_tensorboard(MetricsConfig(tensorboard="on"), str(tmp_path / "ckpt"), rank=0, start_step=0) is None
    assert "TensorBoard: cannot create an event file in" in caplog.text


def test_a_failed_append_stops_the_writes_not_the_run(tmp_path, caplog):
    writer = EventFileWriter(tmp_path / "tb")
    writer.path.unlink()
    writer.path.mkdir()  # appending to a directory fails like a broken file system would
    writer.add_scalars(1, {"loss/train": 1.0})
    assert writer.path is None and "not writing event files any more" in caplog.text
    writer.add_scalars(2, {"loss/train": 1.0})  # and stays quiet


def _train(*args: str) -> list[dict]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT", JOB_ID_ENV):
        env.pop(name, None)
    proc = run_preloaded(["-m", "training", "--set", "run.seq_len=16", "--set", "metrics.progress=false",
                          "--set", "run.log_interval_steps=2", *args], cwd=REPO, env=env, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    return [r for r in map(json.loads, proc.stdout.splitlines()) if r["event"] == "step"]


@pytest.mark.slow
def test_a_run_and_its_resume_leave_one_tensorboard_run_next_to_the_checkpoints(tmp_path):
    common = ("--set", f"checkpoint.dir={tmp_path}", "--set", "metrics.tensorboard=on",
              "--set", "checkpoint.interval_steps=4")
    records = _train("--set", "run.steps=4", *common)
    records += _train("--set", "run.steps=6", *common)  # resumes from step-4
    files = sorted((tmp_path / "tensorboard").iterdir())
    assert len(files) == 2 and (tmp_path / "step-4").is_dir()
    scalars = read_scalars(tmp_path / "tensorboard")
    assert [r["step"] for r in records] == [1, 2, 4, 5, 6]
    assert [(s, v) for s, v, _ in scalars["loss/train"]] == [(r["step"], pytest.approx(r["loss"])) for r in records]
    assert [v for _, v, _ in scalars["optim/lr"]] == [pytest.approx(r["lr"]) for r in records]
    assert "throughput/mfu_pct" not in scalars  # no MFU on a CPU
