"""benchmarks/scripts/hf_io_bench.py at a toy size (a 100k-parameter model, one repeat): every measurement runs,
the JSON has the figures docs/benchmarks.md reports, and the import on 2 ranks reproduced the files' weights,
so the benchmark cannot rot between the runs that measure the ~1 GB model."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks/scripts/hf_io_bench.py"
TOY = {"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 96, "vocab_size": 320}
PARAMS = 2 * 320 * 64 + 64 + 2 * (2 * 64 + 64 * 64 * 2 + 2 * 64 * 32 + 3 * 64 * 96)  # embedding, output, norms, blocks


@pytest.fixture(scope="module")
def bench(tmp_path_factory):
    work, out = tmp_path_factory.mktemp("work"), tmp_path_factory.mktemp("out") / "hf-io.json"
    proc = subprocess.run(
        [sys.executable, str(SCRIPT), "--model", json.dumps(TOY), "--max-shard-gb", "0.00005", "--repeats", "1",
         "--work", str(work), "--json", str(out)],
        cwd=REPO, env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}, capture_output=True,
        text=True, timeout=300)
    assert proc.returncode == 0, proc.stdout[-3000:] + proc.stderr[-3000:]
    return json.loads(out.read_text()), work, proc.stdout


def test_the_import_on_two_ranks_reproduces_every_weight_of_the_files(bench):
    report, work, stdout = bench
    imported = report["import"]
    assert imported["nproc"] == 2 and [r["rank"] for r in imported["per_rank"]] == [0, 1]
    assert imported["weights_match"] is True and imported["mismatched"] == []
    assert imported["tensors_checked"] == 21  # embedding, output, final norm, 9 per block
    # each rank holds its own rows only: the two fp32 shards together are the model once
    assert sum(r["shard_bytes"] for r in imported["per_rank"]) == report["model"]["bytes_fp32"] == 4 * PARAMS
    assert "import weights match the files: True (21 tensors on each rank)" in stdout


def test_the_export_wrote_several_files_with_their_index(bench):
    report, work, _ = bench
    assert report["model"]["params"] == PARAMS and report["model"]["bytes_bf16"] == 2 * PARAMS
    files = sorted(p.name for p in (work / "hf").glob("*.safetensors"))
    assert report["model"]["hf_files"] == len(files) == 5 and files[0] == "model-00001-of-00005.safetensors"
    assert (work / "hf/model.safetensors.index.json").is_file() and (work / "hf/config.json").is_file()


def test_the_json_has_every_figure_the_document_reports(bench):
    report, _, _ = bench
    assert report["benchmark"] == "hf-io" and report["repeats"] == 1 and report["date"].startswith("20")
    assert report["machine"]["nproc"] == os.cpu_count() and report["machine"]["memory_bytes"] > 0
    assert set(report["versions"]) == {"python", "torch", "safetensors", "transformers"}
    assert report["versions"]["torch"].startswith("2.13.0")
    assert len(report["load_average"]["start"]) == len(report["load_average"]["end"]) == 3
    rows = [*report["import"]["per_rank"], report["read"], report["export"], report["save_file"]]
    for row in rows:
        assert set(row["seconds"]) == {"min", "median", "all"} and len(row["seconds"]["all"]) == 1
        assert row["seconds"]["min"] > 0 and row["process_wall_s"]["min"] >= row["seconds"]["min"]
        assert row["peak_bytes"] >= row["rss_before_bytes"] > 0 and row["ru_maxrss_bytes"] > 0
        assert row["added_bytes"] == row["peak_bytes"] - row["rss_before_bytes"]
    assert report["read"]["bytes"] == report["save_file"]["bytes"] == report["model"]["bytes_bf16"]
    assert set(report["ratios"]) == {
        "import_over_read_s", "export_over_save_file_s", "import_peak_max_rank_over_fp32",
        "import_added_max_rank_over_bf16", "read_peak_over_bf16", "export_peak_over_bf16",
        "save_file_peak_over_bf16"}
    assert all(value > 0 for key, value in report["ratios"].items() if key != "import_added_max_rank_over_bf16")


@pytest.mark.parametrize("args, line", [
    (["--repeats", "0"], "--repeats=0: allowed: an integer >= 1"),
    (["--nproc", "0"], "--nproc=0: allowed: an integer >= 1"),
    (["--max-shard-gb", "0"], "--max-shard-gb=0.0: allowed: a number > 0"),
    (["--model", "[1]"], "--model=[1]: allowed: a JSON object of [model] fields"),
])
def test_a_bad_option_is_one_line_naming_it(args, line):
    proc = subprocess.run([sys.executable, str(SCRIPT), *args], cwd=REPO, capture_output=True, text=True, timeout=60)
    assert (proc.returncode, proc.stderr, proc.stdout) == (2, line + "\n", "")
