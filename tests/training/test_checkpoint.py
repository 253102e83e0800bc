"""Checkpointer in one process: real DCP saves (sync and async) into tmp_path on a 1-rank gloo group, the
completion marker, keep-last-k, stale and incomplete directories, --resume resolution and loading. The
2-process behaviour (FSDP2 shards, SIGTERM, SIGKILL) is in test_torchrun.py."""

from __future__ import annotations

import json
import logging
import threading

import pytest
import torch
from torch import nn
from torch.distributed.checkpoint import FileSystemWriter

from training.checkpoint.checkpointer import CheckpointConfig, Checkpointer
from training.checkpoint.layout import MARKER_FILE, find_latest_complete, is_complete, read_train_state, step_dir
from training.checkpoint.resume import claim_checkpoint_dir, resolve_resume
from training.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_rank_process_group")


def make_model_and_optimizer(seed: int) -> tuple[nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = nn.Sequential(nn.Linear(4, 8), nn.ReLU(), nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(3, 4)).sum().backward()
    optimizer.step()
    optimizer.zero_grad()
    return model, optimizer


def checkpointer(root, **fields) -> Checkpointer:
    cfg = CheckpointConfig(dir=str(root), **fields)
    cfg.validate()
    return Checkpointer(cfg, rank=0, world_size=1, config_snapshot={"run": {"steps": 7}})


def fake_checkpoint(root, step: int, *, metadata: bool = True, marker: bool = True):
    path = step_dir(root, step)
    path.mkdir(parents=True)
    (path / "__0_0.distcp").write_bytes(b"shard")
    if metadata:
        (path / ".metadata").write_bytes(b"meta")
    if marker:
        (path / MARKER_FILE).write_text(json.dumps({"step": step}))
    return path


def test_a_blocking_save_is_complete_and_describes_itself(tmp_path):
    model, optimizer = make_model_and_optimizer(0)
    ckpt = checkpointer(tmp_path, async_save=False)
    ckpt.save(3, model, optimizer, blocking=True)
    path = tmp_path / "step-3"
    assert is_complete(path)
    state = json.loads((path / MARKER_FILE).read_text())
    assert state["step"] == 3 and state["world_size"] == 1 and state["config"] == {"run": {"steps": 7}}
    ckpt.close()


def test_an_async_save_is_marked_complete_only_after_its_write_finished(tmp_path):
    model, optimizer = make_model_and_optimizer(0)
    ckpt = checkpointer(tmp_path, async_save=True)
    ckpt.save(1, model, optimizer, blocking=False)
    pending = ckpt._pending
    assert pending is not None
    pending.upload.result()  # the DCP write is done, but nobody has looked yet
    assert not (tmp_path / "step-1" / MARKER_FILE).exists()
    ckpt.poll()
    assert is_complete(tmp_path / "step-1")
    ckpt.close()


def test_an_async_save_snapshots_the_state_it_was_given(tmp_path, monkeypatch):
    # hold the background write until the parameters have changed
    parameters_changed = threading.Event()
    write_data = FileSystemWriter.write_data

    writes = []

    def delayed_write_data(self, *args, **kwargs):
        assert parameters_changed.wait(timeout=30)
        writes.append(self)
        return write_data(self, *args, **kwargs)

    monkeypatch.setattr(FileSystemWriter, "write_data", delayed_write_data)
    model, optimizer = make_model_and_optimizer(0)
    expected = {k: v.clone() for k, v in model.state_dict().items()}
    ckpt = checkpointer(tmp_path, async_save=True)
    ckpt.save(1, model, optimizer, blocking=False)
    ckpt.wait_for_staging()  # as the loop does right before its next optimizer.step()
    with torch.no_grad():
        for p in model.parameters():
            p.add_(1.0)  # the next optimizer step, while the write is pending
    parameters_changed.set()
    ckpt.close()  # close waits for the pending save
    assert writes, "the write did not go through the delayed FileSystemWriter"
    restored, restored_opt = make_model_and_optimizer(1)
    Checkpointer(CheckpointConfig(), rank=0, world_size=1, config_snapshot={}).load(
        tmp_path / "step-1", restored, restored_opt)
    for key, value in restored.state_dict().items():
        assert torch.equal(value, expected[key]), key


def test_a_new_save_waits_for_the_pending_one(tmp_path):
    model, optimizer = make_model_and_optimizer(0)
    ckpt = checkpointer(tmp_path, async_save=True, keep_last=5)
    ckpt.save(1, model, optimizer, blocking=False)
    ckpt.save(2, model, optimizer, blocking=False)
    assert is_complete(tmp_path / "step-1")  # finished before step-2 began
    ckpt.close()
    assert is_complete(tmp_path / "step-2")


def test_load_restores_model_and_optimizer_exactly(tmp_path):
    model, optimizer = make_model_and_optimizer(0)
    ckpt = checkpointer(tmp_path, async_save=False)
    ckpt.save(5, model, optimizer, blocking=True)
    other, other_opt = make_model_and_optimizer(1)
    assert not torch.equal(other[0].weight, model[0].weight)
    state = ckpt.load(tmp_path / "step-5", other, other_opt)
    assert state.step == 5
    for (key, a), b in zip(model.state_dict().items(), other.state_dict().values(), strict=True):
        assert torch.equal(a, b), key
    for pa, pb in zip(model.parameters(), other.parameters(), strict=True):
        for name in ("exp_avg", "exp_avg_sq", "step"):
            assert torch.equal(optimizer.state[pa][name], other_opt.state[pb][name]), name
    # the checkpoint it resumed from is not saved again at the same step
    ckpt.save(5, other, other_opt, blocking=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-5"]


def test_keeps_the_last_k_complete_checkpoints(tmp_path):
    model, optimizer = make_model_and_optimizer(0)
    ckpt = checkpointer(tmp_path, async_save=True, keep_last=2)
    for step in (2, 4, 6):
        ckpt.save(step, model, optimizer, blocking=False)
    ckpt.close()
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-4", "step-6"]


def test_prune_removes_older_leftovers_and_never_newer_directories(tmp_path):
    fake_checkpoint(tmp_path, 1, marker=False)  # a crash leftover older than the new checkpoint
    fake_checkpoint(tmp_path, 9, marker=False)  # newer: could be a save in flight
    model, optimizer = make_model_and_optimizer(0)
    ckpt = checkpointer(tmp_path, async_save=False, keep_last=3)
    ckpt.save(5, model, optimizer, blocking=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-5", "step-9"]


def test_keep_last_never_deletes_this_runs_saves_for_another_runs_newer_ones(tmp_path):
    # issue 28: a fresh run beside another run's step-200..300 saved step-2, and keep_last (by step number)
    # deleted it at once
    for step in (200, 250, 300):
        fake_checkpoint(tmp_path, step)
    model, optimizer = make_model_and_optimizer(0)
    ckpt = checkpointer(tmp_path, async_save=False, keep_last=3)
    for step in (2, 4):
        ckpt.save(step, model, optimizer, blocking=True)
    assert sorted(int(p.name[5:]) for p in tmp_path.iterdir()) == [2, 4, 200, 250, 300]


def test_keep_last_prunes_the_run_it_continued_with_its_own_saves(tmp_path):
    for step in (5, 10, 300):  # 5 and 10: the line this run continues; 300: another run's
        fake_checkpoint(tmp_path, step)
    fake_checkpoint(tmp_path, 7, marker=False)  # a crash leftover of that line
    model, optimizer = make_model_and_optimizer(0)
    ckpt = checkpointer(tmp_path, async_save=False, keep_last=2)
    ckpt.set_start_step(10)
    for step in (12, 14):
        ckpt.save(step, model, optimizer, blocking=True)
    assert sorted(int(p.name[5:]) for p in tmp_path.iterdir()) == [12, 14, 300]


def test_a_stale_directory_at_the_save_step_is_replaced(tmp_path, caplog):
    stale = fake_checkpoint(tmp_path, 4, metadata=False, marker=False)
    (stale / "__1_0.distcp").write_bytes(b"from a larger world size")
    model, optimizer = make_model_and_optimizer(0)
    with caplog.at_level(logging.WARNING, logger="training.checkpoint"):
        checkpointer(tmp_path, async_save=False).save(4, model, optimizer, blocking=True)
    assert not (stale / "__1_0.distcp").exists()
    assert is_complete(stale) and read_train_state(stale).step == 4
    assert f"removing stale checkpoint directory {stale}" in caplog.text


def test_should_save_on_the_interval_and_at_the_end(tmp_path):
    ckpt = checkpointer(tmp_path, interval_steps=5, async_save=False)
    assert [s for s in range(1, 13) if ckpt.should_save(s, total_steps=12)] == [5, 10, 12]
    no_final = checkpointer(tmp_path, interval_steps=0, save_final=False, async_save=False)
    assert not any(no_final.should_save(s, total_steps=12) for s in range(1, 13))
    disabled = Checkpointer(CheckpointConfig(dir=""), rank=0, world_size=1, config_snapshot={})
    assert not disabled.enabled and not disabled.should_save(12, total_steps=12)


def test_find_latest_complete_skips_incomplete_directories_with_a_warning(tmp_path, caplog):
    fake_checkpoint(tmp_path, 2)
    fake_checkpoint(tmp_path, 10)
    fake_checkpoint(tmp_path, 12, marker=False)  # DCP finished, our marker not written
    fake_checkpoint(tmp_path, 14, metadata=False, marker=False)  # killed while writing shards
    (tmp_path / "step-x").mkdir()  # not a checkpoint name: ignored
    with caplog.at_level(logging.WARNING, logger="training.checkpoint"):
        assert find_latest_complete(tmp_path) == tmp_path / "step-10"
    warnings = [r.getMessage() for r in caplog.records if r.levelno == logging.WARNING]
    assert warnings == [
        f"skipping incomplete checkpoint {tmp_path / 'step-14'} (step 14): missing .metadata, {MARKER_FILE}",
        f"skipping incomplete checkpoint {tmp_path / 'step-12'} (step 12): missing {MARKER_FILE}",
    ]


def test_steps_sort_numerically_not_by_name(tmp_path):
    fake_checkpoint(tmp_path, 9)
    fake_checkpoint(tmp_path, 10)
    assert find_latest_complete(tmp_path) == tmp_path / "step-10"


def test_resolve_resume(tmp_path):
    assert resolve_resume("none", str(tmp_path)) is None
    assert resolve_resume("auto", "") is None  # checkpointing off
    assert resolve_resume("auto", str(tmp_path / "nothing-yet")) is None
    fake_checkpoint(tmp_path, 3)
    assert resolve_resume("auto", str(tmp_path)) == tmp_path / "step-3"
    assert resolve_resume(str(tmp_path / "step-3"), "") == tmp_path / "step-3"


def test_resume_path_must_be_a_complete_checkpoint(tmp_path):
    with pytest.raises(ConfigError, match=r"^--resume='.*/missing': allowed: auto, none, or a checkpoint"):
        resolve_resume(str(tmp_path / "missing"), "")
    fake_checkpoint(tmp_path, 7, marker=False)
    incomplete = r"step-7': not a complete checkpoint \(needs .metadata and train_state"
    with pytest.raises(ConfigError, match=incomplete):
        resolve_resume(str(tmp_path / "step-7"), "")


def test_a_start_that_leaves_newer_checkpoints_is_refused_unless_told_to_overwrite(tmp_path, caplog):
    for step in (200, 250, 300):
        fake_checkpoint(tmp_path, step)
    fake_checkpoint(tmp_path, 400, marker=False)  # incomplete: never resumed from
    root = str(tmp_path)
    with pytest.raises(ConfigError) as err:
        claim_checkpoint_dir("none", 0, root)
    assert str(err.value) == (
        f"--resume none: starts a new run, but checkpoint.dir={root!r} holds checkpoints up to step 300, which its "
        "saves would be mixed with (keep_last would delete by step number); allowed: --resume auto (continue "
        "them), another checkpoint.dir, or --overwrite-checkpoints (delete them first)")
    path = str(tmp_path / "step-200")
    with pytest.raises(ConfigError, match=f"^--resume {path}: starts at step 200, but checkpoint.dir=.* up to step "
                                          "300,.* --overwrite-checkpoints \\(delete the steps after 200 first\\)$"):
        claim_checkpoint_dir(path, 200, root)
    claim_checkpoint_dir(path, 300, root)  # the newest complete one: it continues the directory
    claim_checkpoint_dir("none", 0, "")  # no checkpoint.dir
    with caplog.at_level(logging.WARNING, logger="training.checkpoint"):
        claim_checkpoint_dir(path, 200, root, overwrite=True)
    assert sorted(p.name for p in tmp_path.iterdir()) == ["step-200"]
    assert f"deleted 3 step directories after step 200 under {tmp_path} (steps 250, 300, 400)" in caplog.text


def test_a_fresh_start_beside_the_local_tiers_steps_is_refused_too(tmp_path):
    local = tmp_path / "local"
    (local / "step-20" / "rank-0").mkdir(parents=True)
    with pytest.raises(ConfigError, match=f"^--resume none: starts a new run, but checkpoint.local_dir="
                                          f"'{local}' holds local steps up to 20, "):
        claim_checkpoint_dir("none", 0, str(tmp_path / "durable"), local_root=str(local))
    claim_checkpoint_dir("none", 0, str(tmp_path / "durable"), local_root=str(local), overwrite=True)
    assert (local / "step-20").is_dir()  # the local tier's own start (keep_only) deletes it, on every node


@pytest.mark.parametrize(
    ("fields", "message"),
    [
        ({"interval_steps": -1}, "checkpoint.interval_steps=-1: allowed: an integer >= 0"),
        ({"keep_last": 0}, "checkpoint.keep_last=0: allowed: an integer >= 1"),
        ({"keep_last": True}, "checkpoint.keep_last=True: allowed: an integer >= 1"),
    ],
)
def test_invalid_values_name_the_field(fields, message):
    with pytest.raises(ConfigError, match=f"^{message}"):
        CheckpointConfig(**fields).validate()
