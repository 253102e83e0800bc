"""Background staging of async saves (training/checkpoint/staging.py): the loop waits for the copy before its
next optimizer step, the copy is still verified, the buffers are kept across saves, and a torch without
DCP's staging API falls back to staging inside the save call. The Checkpointer tests run on a 1-rank gloo
group; the loop test runs the real trainer in a subprocess."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import textwrap
from pathlib import Path

import pytest
import torch
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save
from torch.distributed.checkpoint.staging import DefaultStager

import training.checkpoint.checkpointer as checkpointer_module
import training.checkpoint.staging as staging_module
from training.checkpoint.checkpointer import CheckpointConfig, Checkpointer, CheckpointSaveError
from training.checkpoint.layout import MARKER_FILE, is_complete
from training.checkpoint.staging import staging_api_available, use_pinned_memory
from training.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_rank_process_group")

REPO = Path(__file__).resolve().parents[2]


def model_and_optimizer(seed: int = 0) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    return model, optimizer


def checkpointer(root, **fields) -> Checkpointer:
    cfg = CheckpointConfig(dir=str(root), **fields)
    cfg.validate()
    return Checkpointer(cfg, rank=0, world_size=1, config_snapshot={})


def assert_restores(path, model: nn.Module) -> None:
    restored, restored_opt = model_and_optimizer(seed=1)
    Checkpointer(CheckpointConfig(), rank=0, world_size=1, config_snapshot={}).load(path, restored, restored_opt)
    for (key, value), expected in zip(restored.state_dict().items(), model.state_dict().values(), strict=True):
        assert torch.equal(value, expected), key


# ---------------------------------------------------------------------------------------------------------
# the loop: a slow staging holds the next optimizer step, and the checkpoint holds the step it was taken at
SLOW_STAGING_RUN = textwrap.dedent("""
    import json, sys, time
    from torch.distributed.checkpoint.staging import DefaultStager
    import training.train as train_module
    from training.config import load_config

    events = []
    stage = DefaultStager.stage

    def slow_stage(self, state_dict, **kwargs):  # the copy into CPU memory, made slow
        events.append("copy begins")
        time.sleep(1.0)
        staged = stage(self, state_dict, **kwargs)
        events.append("copy done")
        return staged

    DefaultStager.stage = slow_stage
    build_optimizer = train_module.build_optimizer

    def counting_optimizer(model, cfg):
        optimizer = build_optimizer(model, cfg)
        optimizer.register_step_pre_hook(lambda *_: events.append("optimizer.step"))
        return optimizer

    train_module.build_optimizer = counting_optimizer
    train_module.train(load_config(None, sys.argv[1:]), resume="none")
    print("EVENTS " + json.dumps(events))
""")


def run_trainer(*overrides: str) -> list[str]:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    proc = subprocess.run([sys.executable, "-c", SLOW_STAGING_RUN, "metrics.json_lines=false",
                           "metrics.progress=false", *overrides],
                          cwd=REPO, env=env, text=True, capture_output=True, timeout=300)
    assert proc.returncode == 0, proc.stderr[-3000:]
    line = next(line for line in proc.stdout.splitlines() if line.startswith("EVENTS "))
    return json.loads(line.removeprefix("EVENTS "))


def checkpoint_tensors(path: Path, tmp_path: Path) -> dict:
    out = tmp_path / f"{path.parent.name}-{path.name}.pt"
    dcp_to_torch_save(path, out)
    return torch.load(out, weights_only=False)


def assert_same_tree(a, b, key=""):
    if isinstance(a, dict):
        assert a.keys() == b.keys(), key
        for k in a:
            assert_same_tree(a[k], b[k], f"{key}.{k}")
    elif isinstance(a, list):
        assert len(a) == len(b), key
        for i, (x, y) in enumerate(zip(a, b, strict=True)):
            assert_same_tree(x, y, f"{key}.{i}")
    elif isinstance(a, torch.Tensor):
        assert torch.equal(a, b), key
    else:
        assert a == b, key


def test_the_loop_waits_for_a_slow_staging_before_its_next_optimizer_step(tmp_path):
    periodic, reference = tmp_path / "periodic", tmp_path / "reference"
    # an async save after step 2 whose copy takes a second, then a third step
    events = run_trainer("run.steps=3", "checkpoint.interval_steps=2", "checkpoint.save_final=false",
                         f"checkpoint.dir={periodic}")
    assert events == ["optimizer.step", "optimizer.step", "copy begins", "copy done", "optimizer.step"]
    # the same two steps, saved blocking from the live state after step 2
    run_trainer("run.steps=2", "checkpoint.async_save=false", f"checkpoint.dir={reference}")
    assert is_complete(periodic / "step-2") and is_complete(reference / "step-2")
    assert_same_tree(checkpoint_tensors(periodic / "step-2", tmp_path),
                     checkpoint_tensors(reference / "step-2", tmp_path))


# ---------------------------------------------------------------------------------------------------------
# the Checkpointer with background staging
def test_background_staging_returns_before_the_copy_and_the_checkpoint_holds_the_saved_state(tmp_path):
    model, optimizer = model_and_optimizer()
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    ckpt = checkpointer(tmp_path)
    assert ckpt.staging_pinned is False  # the CPU: pageable buffers kept across saves
    ckpt.save(1, model, optimizer, blocking=False)
    ckpt.wait_for_staging()
    with torch.no_grad():
        for p in model.parameters():
            p.mul_(2.0)  # the next optimizer step
    ckpt.close()
    timings = ckpt.last_timings
    assert timings.staging == "background" and timings.step == 1
    assert None not in (timings.build_state_s, timings.describe_s, timings.copy_s, timings.verify_s)
    assert timings.blocked_s <= timings.staged_s <= timings.complete_s
    model.load_state_dict(expected)
    assert_restores(tmp_path / "step-1", model)


def test_the_staging_buffers_are_kept_across_saves(tmp_path):
    model, optimizer = model_and_optimizer()
    ckpt = checkpointer(tmp_path, keep_last=5)
    addresses = []
    for step in (1, 2):
        ckpt.save(step, model, optimizer, blocking=False)
        staged = ckpt._pending.staging.staged.result()
        addresses.append({k: v.data_ptr() for k, v in staged["model"].items()})
        ckpt.wait()
    ckpt.close()
    assert addresses[0] == addresses[1]


def test_a_corrupted_staged_copy_fails_verification_and_is_never_complete(tmp_path, monkeypatch):
    stage = DefaultStager.stage

    def stage_and_flip_a_bit(self, state_dict, **kwargs):
        staged = stage(self, state_dict, **kwargs)
        staged["model"]["2.weight"].view(torch.int32).view(-1)[3] ^= 1  # still finite: only the bits differ
        return staged

    monkeypatch.setattr(DefaultStager, "stage", stage_and_flip_a_bit)
    model, optimizer = model_and_optimizer()
    live = model[2].weight.detach().clone()
    ckpt = checkpointer(tmp_path)
    ckpt.save(1, model, optimizer, blocking=False)
    ckpt.wait_for_staging()  # the loop goes on; the failure is the save's
    with pytest.raises(CheckpointSaveError, match=r"checkpoint step 1 failed .*model\.2\.weight: its bits differ"):
        ckpt.wait()
    assert torch.equal(model[2].weight, live)
    assert not (tmp_path / "step-1" / MARKER_FILE).exists() and not (tmp_path / "step-1" / ".metadata").exists()
    ckpt.close()


def test_a_staging_failure_fails_the_save_through_dcps_planning_not_the_loop(tmp_path, monkeypatch):
    def broken_describe(state, *, fingerprints):
        raise RuntimeError("no fingerprint for you")

    monkeypatch.setattr(staging_module, "describe", broken_describe)
    model, optimizer = model_and_optimizer()
    ckpt = checkpointer(tmp_path)
    ckpt.save(1, model, optimizer, blocking=False)
    ckpt.wait_for_staging()  # does not raise: the loop's next step is not where a save fails
    with pytest.raises(CheckpointSaveError, match=r"checkpoint step 1 failed .*no fingerprint for you"):
        ckpt.wait()
    assert not (tmp_path / "step-1" / ".metadata").exists()
    ckpt.close()


# ---------------------------------------------------------------------------------------------------------
# torch without the staging API, and checkpoint.staging=inline: staged inside the save call, as before
def test_a_torch_without_the_staging_api_stages_inside_the_save(tmp_path, monkeypatch, caplog):
    monkeypatch.setattr(checkpointer_module, "staging_api_available", lambda: False)
    model, optimizer = model_and_optimizer()
    with caplog.at_level("WARNING", logger="training.checkpoint"):
        ckpt = checkpointer(tmp_path)
    assert "lacks DCP's DefaultStager" in caplog.text and ckpt.staging_pinned is None
    ckpt.save(1, model, optimizer, blocking=False)
    ckpt.wait_for_staging()  # nothing to wait for: the copy was made inside save()
    ckpt.close()
    assert ckpt.last_timings.staging == "inline" and ckpt.last_timings.describe_s is not None
    assert_restores(tmp_path / "step-1", model)


def test_staging_inline_is_dcps_default_stager(tmp_path):
    model, optimizer = model_and_optimizer()
    ckpt = checkpointer(tmp_path, staging="inline")
    ckpt.save(1, model, optimizer, blocking=False)
    ckpt.close()
    assert ckpt.last_timings.staging == "inline"
    assert_restores(tmp_path / "step-1", model)


def test_staging_api_detection(monkeypatch):
    assert staging_api_available()  # torch 2.13 in this venv has it

    def old_async_save(state_dict, *, checkpoint_id=None, storage_writer=None, planner=None, process_group=None):
        raise AssertionError("not called")

    monkeypatch.setattr(dcp, "async_save", old_async_save)
    assert not staging_api_available()
    monkeypatch.undo()
    monkeypatch.setitem(sys.modules, "torch.distributed.checkpoint.staging", None)  # import fails
    assert not staging_api_available()


# ---------------------------------------------------------------------------------------------------------
# checkpoint.staging
def test_pinned_staging_needs_cuda(tmp_path):
    assert use_pinned_memory("auto", torch.device("cpu")) is False
    assert use_pinned_memory("pageable", torch.device("cpu")) is False
    with pytest.raises(ConfigError, match=r"checkpoint\.staging='pinned': pinned host memory needs CUDA .* "
                                          r"allowed here: auto, pageable, inline"):
        checkpointer(tmp_path, staging="pinned")


def test_an_unknown_staging_mode_names_the_key_and_the_choices():
    with pytest.raises(ConfigError, match=r"^checkpoint\.staging='fast': allowed: auto, pinned, pageable, "
                                          r"inline$"):
        CheckpointConfig(staging="fast").validate()
