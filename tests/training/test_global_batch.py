"""run.global_batch_tokens (torchtitan's global_batch_size, in tokens): the accumulation follows from the world
size, so a job means the same step on 2 nodes or 64; a batch the ranks cannot split is refused in one line."""

import json
import os
from pathlib import Path

import pytest
from preloaded_ranks import run_preloaded

from training.config import load_config
from training.errors import ConfigError

REPO = Path(__file__).resolve().parents[2]


def run_config(*overrides):
    return load_config(None, list(overrides)).run  # tiny-cpu: seq 64 x micro-batch 8 = 512 tokens per rank


def test_the_accumulation_follows_the_world_size_and_the_step_stays_the_same():
    run = run_config("run.global_batch_tokens=8192")
    assert [run.accumulation_steps(ranks) for ranks in (1, 2, 4, 8, 16)] == [16, 8, 4, 2, 1]
    assert {run.tokens_per_step(ranks) for ranks in (1, 2, 4, 8, 16)} == {8192}
    # unset: grad_accum_steps as before, and the step grows with the ranks
    plain = run_config("run.grad_accum_steps=2")
    assert (plain.accumulation_steps(4), plain.tokens_per_step(4)) == (2, 4096)


def test_a_global_batch_the_ranks_cannot_split_is_refused_in_one_line():
    run = run_config("run.global_batch_tokens=8192")
    with pytest.raises(ConfigError) as error:
        run.accumulation_steps(3)
    assert str(error.value) == ("run.global_batch_tokens=8192: not a whole number of micro-batches on 3 ranks "
                                "(seq_len 64 x micro_batch_size 8 x 3 = 1536 tokens each); allowed: a multiple of 1536")
    with pytest.raises(ConfigError) as error:
        run.accumulation_steps(32)  # fewer tokens than one micro-batch on every rank
    assert str(error.value).startswith("run.global_batch_tokens=8192: not a whole number of micro-batches on 32 ")


@pytest.mark.parametrize(("overrides", "message"), [
    (["run.global_batch_tokens=1000"], "run.global_batch_tokens=1000: allowed: 0 (off) or a multiple of seq_len x "
                                       "micro_batch_size = 512"),
    (["run.global_batch_tokens=-512"], "run.global_batch_tokens=-512: allowed: 0 (off) or a multiple of seq_len x "
                                       "micro_batch_size = 512"),
    (["run.global_batch_tokens=4096", "run.grad_accum_steps=2"],
     "run.grad_accum_steps=2: derived from run.global_batch_tokens=4096 when that is set; allowed: 1 (leave it out)"),
])
def test_a_global_batch_that_cannot_be_right_at_any_world_size_fails_at_load(overrides, message):
    with pytest.raises(ConfigError) as error:
        run_config(*overrides)
    assert str(error.value) == message


def run_cli(*args):
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return run_preloaded(["-m", "training", *args], cwd=REPO, env=env, timeout=300)


@pytest.mark.slow
def test_the_trainer_accumulates_what_the_global_batch_asks_for(tmp_path):
    # one process: 1024 tokens a step = 2 micro-batches of 8 x 64; the same losses as grad_accum_steps=2
    common = ["--set", "run.steps=2", "--set", "run.log_interval_steps=1", "--resume", "none"]
    by_batch = run_cli(*common, "--set", "run.global_batch_tokens=1024", "--set", f"checkpoint.dir={tmp_path / 'a'}")
    assert by_batch.returncode == 0, by_batch.stderr
    assert ("global batch: 1024 tokens a step = seq 64 x micro-batch 8 x 1 data-parallel ranks x 2 accumulated"
            in by_batch.stderr)
    by_accum = run_cli(*common, "--set", "run.grad_accum_steps=2", "--set", f"checkpoint.dir={tmp_path / 'b'}")
    assert by_accum.returncode == 0, by_accum.stderr

    def losses(proc):
        return [r["loss"] for r in map(json.loads, proc.stdout.splitlines()) if "loss" in r]

    assert losses(by_batch) == losses(by_accum) and len(losses(by_batch)) == 2
