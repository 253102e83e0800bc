"""python -m training.bench on the CPU: the tiny preset, a couple of steps per backend."""

from __future__ import annotations

import json
import os
import subprocess
from dataclasses import replace
from pathlib import Path

import pytest
from preloaded_ranks import run_preloaded

from training.bench.cli import build_parser, main
from training.bench.report import format_table
from training.bench.variants import BenchResult, Variant, add_torchtitan_ratios, expand_variants
from training.model import build_model_config, count_params, flops_per_token

REPO = Path(__file__).resolve().parents[2]


def run_bench(*args: str) -> subprocess.CompletedProcess:
    """python -m training.bench in a process of its own (it creates and destroys its own process group)."""
    return run_preloaded(["-m", "training.bench", *args], timeout=300, cwd=REPO,
                         env={**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO)})


@pytest.fixture(scope="module")
def bench_run(tmp_path_factory):
    """One real run of every backend, shared by the tests that read its table and its JSON."""
    out = tmp_path_factory.mktemp("bench") / "bench.json"
    result = run_bench("--steps", "2", "--warmup-steps", "1", "--seq-len", "32", "--compare-torchtitan",
                       "--json", str(out))
    return result, json.loads(out.read_text()) if out.exists() else None


def test_cpu_run_prints_the_table_for_every_backend(bench_run):
    result, _ = bench_run
    assert result.returncode == 0, result.stderr[-3000:]
    lines = result.stdout.splitlines()
    assert lines[0].startswith("device cpu | preset tiny (2 layers, 0.1M params) | seq 32 x micro-batch 8")
    assert lines[1].split() == [
        "backend",
        "status",
        "tokens/s",
        "TFLOP/s",
        "MFU",
        "step",
        "ms",
        "peak",
        "GiB",
        "loss",
        "vs",
        "titan",
    ]
    rows = {line.split()[0]: line.split() for line in lines[2:7]}
    # on a CPU torchao runs only its tensorwise recipe; torchtitan gets the none and torchao rows, never te
    assert list(rows) == ["none", "torchao-tensorwise", "te-delayed", "titan:none", "titan:torchao-tensorwise"]
    assert rows["none"][1] == "ok" and rows["torchao-tensorwise"][1] == "ok"
    assert float(rows["none"][2]) > 0 and rows["none"][4] == "-"  # tokens/s; no MFU on a CPU
    assert rows["te-delayed"][1] == "skipped"
    assert any(
        line.startswith("te-delayed: skipped: fp8.backend='te': Transformer Engine is not importable")
        for line in lines
    )
    # torchtitan is not a dependency: its rows say so, and the run still succeeds
    assert rows["titan:none"][1] == "skipped" and rows["none"][-1] == "-"
    assert any(
        line.startswith("titan:none: skipped: torchtitan is not importable") and "pip install torchtitan" in line
        for line in lines
    )
    assert "MFU: not reported (no GPU peak known for this device)" in lines


def test_json_has_the_numbers_and_the_versions(bench_run):
    _, data = bench_run
    assert data["preset"] == "tiny" and data["seq_len"] == 32 and data["peak_bf16_tflops"] is None
    assert data["n_layers"] == 2  # the preset's
    assert data["versions"]["torchao"]  # imported by the torchao run
    results = {r["backend"]: r for r in data["results"]}
    assert data["fp8_all_gather"] is False  # one rank: nothing to all-gather (torchtitan's rule)
    assert data["sdpa_priority"] == "cudnn"
    none = results["none"]
    assert none["status"] == "ok" and none["mfu"] is None
    # TFLOP/s is flops_per_token x tokens/s
    assert none["tflops"] == pytest.approx(data["flops_per_token"] * none["tokens_per_s"] / 1e12)
    assert none["tokens_per_s"] == pytest.approx(8 * 32 / (none["step_time_ms"] / 1000))
    assert none["peak_memory_gib"] > 0 and 4.5 < none["final_loss"] < 7.5
    # the build and the warm-up (the compile, with --compile) are timed apart from the timed steps
    assert none["warmup_s"] > 0 and results["torchao-tensorwise"]["warmup_s"] > 0
    assert results["te-delayed"]["warmup_s"] is None  # skipped: nothing was built
    assert results["torchao-tensorwise"]["status"] == "ok"
    assert results["te-delayed"]["status"] == "skipped" and "pip install" in results["te-delayed"]["reason"]
    assert results["titan:none"]["status"] == "skipped" and none["vs_torchtitan"] is None


def test_the_fused_loss_row_says_so_and_trains_like_the_full_logits(bench_run, tmp_path):
    """--loss-chunk-tokens: recorded in the JSON and the table's context line; same seed, same tokens, so the
    none row's loss is the full-logits run's to float32 rounding."""
    out = tmp_path / "fused.json"
    result = run_bench("--steps", "2", "--warmup-steps", "1", "--seq-len", "32", "--backends", "none",
                       "--loss-chunk-tokens", "100", "--json", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    assert "| loss fused over 100-token chunks (titan: full logits)" in result.stdout.splitlines()[0]
    assert "| loss full logits" in bench_run[0].stdout.splitlines()[0]
    data = json.loads(out.read_text())
    assert data["parallel"]["loss_chunk_tokens"] == 100 and bench_run[1]["parallel"]["loss_chunk_tokens"] == 0
    fused = data["results"][0]
    full = next(r for r in bench_run[1]["results"] if r["backend"] == "none")
    assert fused["backend"] == "none" and fused["final_loss"] == pytest.approx(full["final_loss"], rel=1e-5)


def test_torchtitan_only_trains_only_torchtitans_rows(tmp_path):
    """--torchtitan-only: the rows --compare-torchtitan adds, without ours (measured in another run)."""
    out = tmp_path / "titan.json"
    result = run_bench("--steps", "1", "--warmup-steps", "0", "--seq-len", "16", "--backends", "none,torchao",
                       "--torchtitan-only", "--json", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    rows = json.loads(out.read_text())["results"]
    assert [r["backend"] for r in rows] == ["titan:none", "titan:torchao-tensorwise"]


def test_a_negative_loss_chunk_is_a_usage_error(capsys):
    assert main(["--loss-chunk-tokens", "-1"]) == 2
    assert "--loss-chunk-tokens=-1: allowed: an integer >= 0 (0 = off)" in capsys.readouterr().err


def test_bad_backend_list_is_a_usage_error(capsys):
    assert main(["--backends", "none,fp4"]) == 2
    assert (
        "--backends='none,fp4': allowed: a comma-separated subset of none, torchao, te"
        in capsys.readouterr().err
    )


def test_bad_recipe_list_is_a_usage_error(capsys):
    assert main(["--torchao-recipes", "tensorwise,blockwise"]) == 2
    assert (
        "--torchao-recipes='tensorwise,blockwise': allowed: a comma-separated subset of tensorwise, rowwise"
        in capsys.readouterr().err
    )


def test_variants_expand_recipes_and_mirror_none_and_torchao_for_torchtitan():
    variants = expand_variants(["none", "torchao", "te"], ["tensorwise", "rowwise"], ["delayed"],
                               compare_torchtitan=True)
    assert [v.name for v in variants] == [
        "none", "torchao-tensorwise", "torchao-rowwise", "te-delayed",
        "titan:none", "titan:torchao-tensorwise", "titan:torchao-rowwise",
    ]
    assert [v.name for v in expand_variants(["torchao"], ["rowwise"], [], compare_torchtitan=False)] == [
        "torchao-rowwise"
    ]


def test_ratio_is_ours_over_torchtitans_for_the_same_backend_and_recipe():
    variants = [Variant("none"), Variant("torchao", "rowwise"), Variant("none", torchtitan=True),
                Variant("torchao", "rowwise", torchtitan=True)]
    results = [BenchResult("none", "ok", tokens_per_s=51.0), BenchResult("torchao-rowwise", "ok", tokens_per_s=40.0),
               BenchResult("titan:none", "ok", tokens_per_s=50.0), BenchResult("titan:torchao-rowwise", "skipped")]
    add_torchtitan_ratios(variants, results)
    assert results[0].vs_torchtitan == pytest.approx(1.02)
    assert results[1].vs_torchtitan is None  # torchtitan's row did not run: no ratio, not a made-up one
    assert results[2].vs_torchtitan is None


def test_layers_override_the_presets_depth_and_everything_counted_from_it(tmp_path):
    out = tmp_path / "bench.json"
    result = run_bench("--layers", "1", "--backends", "none", "--steps", "1", "--warmup-steps", "0",
                       "--seq-len", "16", "--json", str(out))
    assert result.returncode == 0, result.stderr[-3000:]
    data = json.loads(out.read_text())
    one_layer = replace(build_model_config("tiny"), n_layers=1)
    assert data["n_layers"] == 1
    assert data["params"] == count_params(one_layer) < count_params(build_model_config("tiny"))
    assert data["flops_per_token"] == flops_per_token(one_layer, 16)
    assert result.stdout.startswith("device cpu | preset tiny (1 layers, ")


def test_a_depth_below_one_is_a_usage_error(capsys):
    assert main(["--layers", "0"]) == 2
    assert "--layers=0: allowed: an integer >= 1" in capsys.readouterr().err


def test_help_lists_the_documented_options():
    help_text = build_parser().format_help()
    for option in (
        "--preset",
        "--seq-len",
        "--micro-batch-size",
        "--steps",
        "--warmup-steps",
        "--backends",
        "--activation-checkpointing",
        "--compile",
        "--json",
        "--torchao-recipes",
        "--compare-torchtitan",
        "--torchtitan-only",
        "--sdpa-priority",
        "--fp8-all-gather",
        "--profile",
        "--loss-chunk-tokens",
        "--layers",
    ):
        assert option in help_text
    assert "torchtitan's rows always keep their own loss" in " ".join(help_text.split())


def test_table_shows_mfu_as_a_percentage_and_failures_with_their_reason():
    header = {
        "device": "NVIDIA H100 80GB HBM3",
        "preset": "1b",
        "n_layers": 16,
        "params": 1.5e9,
        "seq_len": 4096,
        "micro_batch_size": 2,
        "flops_per_token": 1e10,
        "peak_bf16_tflops": 989.0,
        "parallel": {"activation_checkpointing": False, "compile": True},
    }
    results = [
        BenchResult(
            "none",
            "ok",
            tokens_per_s=40000.0,
            tflops=400.0,
            mfu=400 / 989,
            step_time_ms=204.8,
            peak_memory_gib=60.5,
            final_loss=11.9,
        ),
        BenchResult("te", "failed", "OutOfMemoryError: CUDA out of memory"),
    ]
    results[0].vs_torchtitan = 1.0234
    table = format_table(header, results)
    assert "40.4%" in table and "compile on" in table and "1.023x" in table
    assert "te: failed: OutOfMemoryError: CUDA out of memory" in table
