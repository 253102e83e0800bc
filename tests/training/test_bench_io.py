"""python -m training.bench_io on the CPU: the loader and checkpoint measurements run and report sane values."""

from __future__ import annotations

import json
import os
from pathlib import Path

import pytest
from preloaded_ranks import run_preloaded

from training.bench_io import main, write_random_shards
from training.data.shards import open_shards

REPO = Path(__file__).resolve().parents[2]


def test_loader_reports_tokens_per_s_and_the_headroom_over_the_gpu(tmp_path, capsys):
    out = tmp_path / "loader.json"
    assert main(["loader", "--tokens", "200000", "--vocab-size", "320", "--seq-len", "256", "--steps", "50",
                 "--gpu-tokens-per-s", "1000", "--workdir", str(tmp_path), "--json", str(out)]) == 0
    result = json.loads(out.read_text())
    assert result["device"] == "cpu" and result["steps"] == 50 and result["shard_tokens"] == 200000
    assert result["loader_tokens_per_s"] > 0
    assert result["headroom"] == result["loader_tokens_per_s"] / 1000
    assert [p.name for p in tmp_path.iterdir()] == ["loader.json"]  # the random shards were removed


def test_random_shards_are_real_shards(tmp_path):
    write_random_shards(tmp_path, tokens=50_000, vocab_size=320)
    shards = open_shards(tmp_path)
    assert shards.vocab_size == 320 and shards.num_tokens >= 50_000
    assert shards.read(0, 1000).max() < 320


def test_bad_loader_argument_names_the_option(capsys):
    assert main(["loader", "--steps", "0"]) == 2
    assert "--steps=0: allowed: an integer >= 1" in capsys.readouterr().err


STAGING = {  # --staging -> what the CPU run reports: the JSON's "staging", the text's words
    "auto": ({"setting": "auto", "where": "background", "pinned": False}, "on a staging thread beside the loop "
             "(pageable)"),
    "inline": ({"setting": "inline", "where": "inline", "pinned": None}, "inside save() (new pageable memory "
               "each save)"),
}


@pytest.mark.parametrize("staging", sorted(STAGING))
def test_checkpoint_times_async_and_blocking_saves(tmp_path, staging):
    out = tmp_path / "ckpt.json"
    result = run_preloaded(
        ["-m", "training.bench_io", "checkpoint", "--preset", "tiny", "--dir", str(tmp_path / "ckpt"),
         "--repeats", "1", "--staging", staging, "--json", str(out)],
        timeout=300, cwd=REPO, env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)},
    )
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    assert data["preset"] == "tiny" and data["state_gib"] > 0
    blocked, staged = data["async_blocks_loop_s"]["median"], data["async_staged_s"]["median"]
    complete = data["async_until_complete_s"]["median"]
    assert 0 < blocked <= staged <= complete and data["blocking_save_s"]["median"] > 0
    # where the copy was made, and each phase of the async saves
    reported, words = STAGING[staging]
    assert data["staging"] == reported and f"async saves copy the state {words}:" in result.stderr
    assert set(data["phases_s"]) == {"build_state", "describe", "copy", "verify"}
    assert all(len(phase["all"]) == 1 and phase["median"] >= 0 for phase in data["phases_s"].values())
    assert "loop held by save()" in result.stderr and "blocking save (SIGTERM)" in result.stderr
    # keep_last=1: only the last (blocking) save is left, and it is complete
    assert sorted(p.name for p in (tmp_path / "ckpt").iterdir()) == ["step-2"]
