"""The compile cache (training/compile_cache.py): its key, a corrupt file ignored with a warning, and a real
round trip: torch.compile in one process saves the artifacts, a fresh process loads them and compiles warm (its
FX graph cache hits), as attempt 2's spare does after a restart."""

from __future__ import annotations

import logging
import subprocess
import sys
from pathlib import Path

import pytest

from training.compile_cache import ARTIFACTS, CACHE_DIR, artifacts_path, cache_key, load_compile_cache
from training.config import load_config

REPO = Path(__file__).resolve().parents[2]


def config(tmp_path: Path, *overrides: str):
    return load_config("training/configs/tiny-cpu.toml", [f"checkpoint.dir={tmp_path}", *overrides])


def test_the_key_changes_with_what_invalidates_a_compiled_graph(tmp_path):
    base = config(tmp_path, "parallel.compile=true")
    assert cache_key(base, 2) == cache_key(config(tmp_path, "parallel.compile=true"), 2)
    assert cache_key(base, 2) != cache_key(base, 4)  # world size
    assert cache_key(base, 2) != cache_key(config(tmp_path, "parallel.compile=true", "run.seq_len=32"), 2)
    assert cache_key(base, 2) != cache_key(config(tmp_path, "parallel.compile=true", "model.n_layers=3"), 2)
    # not a step count or a learning rate: a longer run or another lr compiles the same graphs
    assert cache_key(base, 2) == cache_key(config(tmp_path, "parallel.compile=true", "run.steps=7", "optim.lr=1e-2"), 2)
    assert artifacts_path(base, 2) == tmp_path / CACHE_DIR / cache_key(base, 2) / ARTIFACTS
    assert artifacts_path(config(tmp_path), 2) is None  # no torch.compile: nothing to keep


def test_a_corrupt_cache_is_ignored_with_a_warning(tmp_path, caplog):
    path = artifacts_path(config(tmp_path, "parallel.compile=true"), 2)
    assert load_compile_cache(path) is False  # none yet: a cold compile, no warning
    path.parent.mkdir(parents=True)
    path.write_bytes(b"\x80\x04not artifacts at all")
    with caplog.at_level(logging.WARNING, logger="training.compile_cache"):
        assert load_compile_cache(path) is False
    assert f"compile cache {path} not used" in caplog.text and "compiling cold" in caplog.text


# Compiles a small function (forward and backward), loading the artifacts first when asked, and saving them
# after; prints the FX graph cache's hits and misses.
ROUND_TRIP = """
import sys
from pathlib import Path
import torch
from torch._dynamo.utils import counters
from training.compile_cache import load_compile_cache, save_compile_cache
path = Path(sys.argv[1])
loaded = load_compile_cache(path) if sys.argv[2] == "load" else False
f = torch.compile(lambda x, w: torch.relu(x @ w).sum())
w = torch.randn(16, 16, requires_grad=True)
f(torch.randn(4, 16), w).backward()
if not loaded:
    assert save_compile_cache(path)
print(loaded, counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"])
"""


def run_round_trip(path: Path, mode: str, cache_dir: Path) -> list[str]:
    # each process its own Inductor cache dir: the second finds nothing but what the artifacts bring
    env = {"PYTHONPATH": str(REPO), "TORCHINDUCTOR_CACHE_DIR": str(cache_dir), "PATH": "/usr/bin:/bin",
           "OMP_NUM_THREADS": "1", "HOME": str(cache_dir)}
    done = subprocess.run([sys.executable, "-c", ROUND_TRIP, str(path), mode], env=env, capture_output=True,
                          text=True, timeout=300, cwd=REPO)
    assert done.returncode == 0, done.stderr[-3000:]
    return done.stdout.split()


@pytest.mark.slow
def test_a_fresh_process_compiles_warm_from_the_saved_artifacts(tmp_path):
    path = tmp_path / CACHE_DIR / "key" / ARTIFACTS
    loaded, hits, misses = run_round_trip(path, "cold", tmp_path / "inductor-1")
    assert (loaded, hits) == ("False", "0") and int(misses) > 0 and path.is_file()
    loaded, hits, misses = run_round_trip(path, "load", tmp_path / "inductor-2")
    assert (loaded, misses) == ("True", "0") and int(hits) > 0
