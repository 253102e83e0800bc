"""The held-out loss on real 2-rank runs (gloo, FSDP2, the tiny model, synthetic training data, held-out byte
shards): the same value on every rank and for the same weights in every run, and training exactly as without
it, straight and across a resume, in bf16 and with torchao's FP8 (emulated). Five starts, shared by the
assertions, and one single-process start that a bad held-out directory stops. The ranks are started as
torchrun's workers but without its agent (torchrun_support.run_as_nodes), which would only add a torch import
to every start: torchrun itself is test_torchrun.py's.

In bf16 one split run serves as both baselines: its first part trains without validation (the straight run's
steps 1-3 must equal it although the straight run evaluated after step 2), its second part resumes with
validation on (and must continue exactly as the straight run, evaluating the same weights to the same value)."""

from __future__ import annotations

import json
import math
import re
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from torchrun_support import REPO, Run, env, load_checkpoint, run_as_nodes

from training.checkpoint.state import iter_leaves
from training.data.shards import ShardWriter

pytestmark = pytest.mark.slow

# warmup_steps=10 > 6 and min_lr = lr: every step's learning rate is the same whether the run was planned for 3,
# 5 or 6 steps, so the split run can be compared with the straight one step by step
COMMON = ["optim.warmup_steps=10", "optim.min_lr=3e-3", "checkpoint.async_save=false"]
# Rank 0 alone logs INFO; this entry logs the evaluation's line on every rank, so the test can compare them.
EVERY_RANK = """
import logging
import sys

from training.__main__ import main

logging.getLogger("training.validation").setLevel(logging.INFO)
sys.exit(main())
"""
EVALUATED = re.compile(r"\[rank (\d)\] INFO training\.validation: validation after step (\d+): loss (\S+),")


def two_ranks(overrides: list[str], **kwargs) -> Run:
    return run_as_nodes([overrides, overrides], **kwargs)


@pytest.fixture(scope="module")
def validation_on(tmp_path_factory) -> list[str]:
    """The [validation] overrides, on held-out byte shards: 6 x 401 tokens, 75 windows of 33, of which 15 are
    read: 8 by rank 0 and 7 by rank 1, whose second micro-batch of 4 holds a padding row that counts nowhere."""
    held_out = tmp_path_factory.mktemp("held-out")
    writer = ShardWriter(held_out, vocab_size=257, eos_id=256, tokenizer={"kind": "byte"}, shard_size_tokens=1000)
    for i in range(6):
        writer.add_document(np.frombuffer(f"held-out document {i}: ".encode() * 20, dtype=np.uint8)[:400])
    writer.finish()
    return [f"validation.path={held_out}", "validation.interval_steps=2", "validation.windows=15"]


@pytest.fixture(scope="module")
def runs(tmp_path_factory, validation_on) -> dict[str, tuple[Run, Path]]:
    root = tmp_path_factory.mktemp("validation")
    entry = root / "every_rank.py"
    entry.write_text(EVERY_RANK)

    def start(name: str, overrides: list[str], resume: str = "none") -> tuple[Run, Path]:
        directory = root / name
        run = two_ranks(COMMON + overrides + [f"checkpoint.dir={directory}"], resume=resume, entry=(str(entry),))
        assert run.returncode == 0, run.output
        return run, directory

    return {
        "on": start("on", ["run.steps=6", *validation_on]),
        "first": start("split", ["run.steps=3"]),  # without validation: the baseline for steps 1-3
        "second": start("split", ["run.steps=6", *validation_on], resume="auto"),
    }


@pytest.fixture(scope="module")
def fp8_runs(tmp_path_factory, validation_on) -> dict[str, tuple[Run, Path]]:
    """torchao FP8 (emulated) with its FP8 all-gather, whose scales are derived after each optimizer step: 5
    steps without and with validation; 5, not a multiple of the interval: the evaluation after the last step
    comes right before the final save, whose state must still equal the run's without validation."""
    pytest.importorskip("torchao")
    root = tmp_path_factory.mktemp("validation-fp8")
    fp8 = ["fp8.backend=torchao", "fp8.emulate=true", "fp8.torchao_recipe=tensorwise",
           "fp8.fsdp_float8_all_gather=true", "run.steps=5"]
    started = {}
    for name, extra in (("off", []), ("on", validation_on)):
        run = two_ranks(COMMON + fp8 + extra + [f"checkpoint.dir={root / name}"], resume="none")
        assert run.returncode == 0, run.output
        started[name] = (run, root / name)
    return started


def assert_same_state(a_dir: Path, b_dir: Path, tmp_path: Path, step: int = 6) -> None:
    a = dict(iter_leaves(load_checkpoint(a_dir / f"step-{step}", tmp_path)))
    b = dict(iter_leaves(load_checkpoint(b_dir / f"step-{step}", tmp_path)))
    assert a.keys() == b.keys() and any(k.startswith("optim.state.") for k in a)
    for key, value in a.items():
        assert torch.equal(value, b[key]) if isinstance(value, torch.Tensor) else value == b[key], key


def held_out(run: Run) -> dict[int, float]:
    return {s["step"]: s["val_loss"] for s in run.steps if "val_loss" in s}


def baseline(run: Run) -> list[dict]:
    """The records of the evaluation before the first step ([validation] at_start, step 0)."""
    return [json.loads(line) for line in run.output.splitlines()
            if line.startswith("{") and '"event": "validation"' in line]


def test_training_is_bit_identical_with_validation_on(runs):
    (on, _), (off, _) = runs["on"], runs["first"]
    assert sorted(off.losses) == [1, 2, 3] and held_out(off) == {}
    assert sorted(held_out(on))[0] == 2  # evaluated after step 2, so step 3 shows whether that changed training
    # and before step 1 (the baseline of a fresh start), which changed training no more than the others did
    ((start,),) = [baseline(on)]
    assert start["step"] == 0 and start["val_loss"] > held_out(on)[6]
    assert {s: on.losses[s] for s in off.losses} == off.losses  # exactly equal floats
    assert {s: on.grad_norms[s] for s in off.grad_norms} == off.grad_norms


def test_fp8_training_is_bit_identical_with_validation_on(fp8_runs, tmp_path):
    (off, off_dir), (on, on_dir) = fp8_runs["off"], fp8_runs["on"]
    assert sorted(off.losses) == list(range(1, 6)) and held_out(off) == {}
    assert sorted(held_out(on)) == [2, 4, 5]  # every interval and the last step
    assert on.losses == off.losses and on.grad_norms == off.grad_norms
    assert_same_state(off_dir, on_dir, tmp_path, step=5)


def test_a_resume_with_validation_on_stays_bit_exact(runs, tmp_path):
    (on, on_dir), (first, _), (second, split_dir) = runs["on"], runs["first"], runs["second"]
    assert second.resumes[0]["step"] == 3
    assert {**first.losses, **second.losses} == on.losses
    assert {**first.grad_norms, **second.grad_norms} == on.grad_norms
    assert sorted(held_out(second)) == [4, 6]  # the resumed start evaluated, and trained on exactly as before
    assert baseline(second) == []  # a resume has no baseline to take: its weights were trained already
    assert_same_state(on_dir, split_dir, tmp_path)


def test_every_interval_and_the_end_the_same_value_on_every_rank_and_for_the_same_weights(runs):
    on, second = runs["on"][0], runs["second"][0]
    losses = held_out(on)
    assert sorted(losses) == [2, 4, 6]
    # the same weights (the runs are bit-identical) give the same held-out loss in another run and start
    assert (held_out(second)[4], held_out(second)[6]) == (losses[4], losses[6])
    assert losses[2] != losses[4]  # and other weights another one
    for run in (on, second):
        logged = {}
        for rank, step, loss in EVALUATED.findall(run.output):
            logged.setdefault(int(step), {})[int(rank)] = float(loss)
        recorded = {**held_out(run), **{b["step"]: b["val_loss"] for b in baseline(run)}}
        assert {step: set(by_rank) for step, by_rank in logged.items()} == {s: {0, 1} for s in recorded}
        for step, by_rank in logged.items():
            assert by_rank[0] == by_rank[1] == recorded[step], (step, by_rank)
        for record in (s for s in run.steps if "val_loss" in s):
            assert record["val_perplexity"] == pytest.approx(math.exp(record["val_loss"]))
            assert record["val_time_s"] > 0


def test_a_missing_held_out_directory_stops_start_up_with_one_line(tmp_path):
    proc = subprocess.run([sys.executable, "-m", "training", "--set", "run.steps=2", "--set",
                           f"validation.path={tmp_path}/nowhere", "--set", "validation.interval_steps=1", "--set",
                           "validation.windows=1"], cwd=REPO, env=env(), capture_output=True, text=True,
                          timeout=120)
    assert proc.returncode == 2, proc.stderr
    (line,) = [x for x in proc.stderr.splitlines() if x.startswith("config error")]
    assert line.startswith(f"config error: validation.path='{tmp_path}/nowhere': not a usable shard directory")
    assert '"event": "step"' not in proc.stdout
