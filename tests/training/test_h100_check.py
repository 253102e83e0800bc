"""benchmarks/scripts/h100_check.sh --dry-run: every part of the H100 check runs on the CPU at toy sizes and
leaves its JSON with the figures the GPU run will report, so the script cannot rot between GPU sessions.
Also: a part whose tools die still gets its file, and parts the deadline leaves no time for are skipped."""

from __future__ import annotations

import dataclasses
import importlib.util
import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

from node_bootstrap.package_lock import parse_lock
from training.config import TrainConfig

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
SCRIPT = REPO / "benchmarks/scripts/h100_check.sh"
REPORT = REPO / "benchmarks/scripts/h100_check_report.py"
FILES = ["1-node-fp8", "2-fp8-8b", "3-mfu-1b", "4-local-tier", "5a-hf-parity", "5b-compile-cache", "6-layout-tp1"]
ORDER = ["node-fp8", "fp8-8b", "mfu-1b", "local-tier", "hf-parity", "compile-cache", "layout-tp1"]


def run_check(out: Path, work: Path, *args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHON": sys.executable, "OMP_NUM_THREADS": "1"}
    env.pop("OUT", None)
    return subprocess.run(["bash", str(SCRIPT), "--out", str(out), "--work", str(work), *args], cwd=REPO, env=env,
                          capture_output=True, text=True, timeout=600)


@pytest.fixture(scope="module")
def dry_run(tmp_path_factory):
    out, work = tmp_path_factory.mktemp("out"), tmp_path_factory.mktemp("work")
    result = run_check(out, work, "--dry-run")
    parts = {path.stem.split("-", 1)[1]: json.loads(path.read_text()) for path in out.glob("[0-9]*-*.json")}
    return result, out, work, parts


def test_every_part_leaves_its_json_and_the_summary_lists_them_in_order(dry_run):
    result, out, _, parts = dry_run
    assert result.returncode == 0, result.stdout[-3000:] + result.stderr[-3000:]
    assert sorted(p.stem for p in out.iterdir()) == sorted([*FILES, "summary"])  # the device tool returns <= 8
    summary = json.loads((out / "summary.json").read_text())
    assert [row["part"] for row in summary["parts"]] == ORDER
    for row in summary["parts"]:
        assert row["status"] == parts[row["part"]]["status"] and row["key"] == parts[row["part"]]["key"]
        assert set(row["key"]) == {"name", "value", "unit", "target", "met"}
    assert summary["machine"]["device"] == "cpu" and summary["machine"]["versions"]["torchao"] == "0.18.0"
    table = result.stdout.splitlines()
    assert "DRY RUN: toy sizes on the CPU; the figures only show that every part runs" in table
    for row in summary["parts"]:
        assert any(line.startswith(row["title"]) for line in table), row["title"]


def test_the_node_fp8_check_installs_the_lock_and_multiplies_in_fp8(dry_run):
    _, _, work, parts = dry_run
    part = parts["node-fp8"]
    assert part["status"] == "ok" and part["exit_code"] == 0 and part["dry_run"] is True
    lock = parse_lock((REPO / "training/node-requirements.txt").read_text(), "lock")
    step = part["packages_step"]
    assert step["installed"] == {p.name: p.version for p in lock.packages}
    assert Path(step["lock_site"]).parent == work / "node/packages"  # the step's <packagesDir>/<key>
    check = part["fp8_check"]
    assert check["status"] == "ok" and check["command"][-4:] == ["--backends", "torchao", "--device", "cpu"]
    assert check["detail"].startswith("torchao 0.18.0 imports with torch ")
    assert check["probe_report"]["devices"] == [{"index": "cpu", "name": "cpu", "ok": True, "error": None}]
    assert part["key"]["value"] == "ok" and part["key"]["met"] is True


def test_the_fp8_part_times_bf16_and_both_torchao_recipes(dry_run):
    part = dry_run[3]["fp8-8b"]
    assert part["status"] == "ok"
    rows = {r["backend"]: r for r in part["bench"]["results"]}
    assert list(rows) == ["none", "torchao-tensorwise", "torchao-rowwise"]
    assert all(r["status"] == "ok" and r["tokens_per_s"] > 0 for r in rows.values())
    ratios = part["fp8_over_bf16"]
    for recipe in ("torchao-tensorwise", "torchao-rowwise"):
        assert ratios[recipe] == pytest.approx(rows[recipe]["tokens_per_s"] / rows["none"]["tokens_per_s"])
    assert part["key"]["value"] == max(ratios.values()) and part["key"]["met"] == (max(ratios.values()) >= 1.3)
    assert part["bench"]["preset"] == "tiny"  # the dry run's toy size; the GPU run: llama3-8b, --layers 10


def test_the_mfu_part_compiles_and_reports_tokens_per_s_where_there_is_no_peak(dry_run):
    part = dry_run[3]["mfu-1b"]
    assert part["status"] == "ok" and part["bench"]["parallel"]["compile"] is True
    row = part["bench"]["results"][0]
    assert row["backend"] == "none" and row["mfu"] is None  # no GPU: no MFU
    assert part["key"]["value"] == row["tokens_per_s"] > 0 and part["key"]["met"] is None


def test_the_local_tier_part_resumes_from_the_local_tier_like_the_straight_run(dry_run):
    part = dry_run[3]["local-tier"]
    assert part["status"] == "ok"
    assert part["save_step"] == 4 and 0 <= part["build_s"] <= part["written_s"] <= part["counted_s"]
    assert part["resume"]["tier"] == "local" and part["resume"]["step"] == 4
    check = part["resume_check"]
    assert check["first_step"] == 5 and check["first_step_loss_equal"] is True and check["finite"] is True
    assert check["common_steps"] == [5, 6, 7, 8]
    assert part["loop_held_s"] >= 0 and part["step_after_save_s"] >= part["loop_held_s"]
    assert part["resume_load_s"] >= 0
    assert part["key"]["met"] is True


def test_the_hf_part_compares_the_trainer_with_transformers_or_says_why_not(dry_run):
    part = dry_run[3]["hf-parity"]
    init = {f.name: f for f in dataclasses.fields(TrainConfig)}.get("init")
    has_import = init is not None and "hf_dir" in {f.name for f in dataclasses.fields(init.default_factory())}
    if not has_import:
        assert part["status"] == "skipped: not available (the trainer has no [init] hf_dir)"
    elif importlib.util.find_spec("transformers") is None:
        assert part["status"] == "skipped: transformers not importable"
    else:
        assert part["status"] == "ok", part
        assert part["abs_diff"] <= part["tolerance"] and part["trainer_loss"] > 6  # far from ln(320): not random
        assert "model.safetensors.index.json" in part["hf_files"]


def test_the_warm_compile_reads_the_cold_ones_cache(dry_run):
    _, _, work, parts = dry_run
    part = parts["compile-cache"]
    assert part["status"] == "ok"
    assert part["key"]["value"] == pytest.approx(part["warm_warmup_s"] / part["cold_warmup_s"])
    assert part["cold"]["warmup_s"] == parts["mfu-1b"]["bench"]["results"][0]["warmup_s"]
    assert any((work / "inductor-1b").rglob("*"))  # both runs used the part's own cache directory


def test_the_layout_part_runs_the_layout_path_at_tp_1_with_fp8_against_the_plans_memory(dry_run):
    part = dry_run[3]["layout-tp1"]
    assert part["status"] == "ok" and part["steps"] == 6
    assert part["layout"] == {"dp_replicate": 1, "dp_shard": 1, "tp": 1}  # the step records carry it
    assert part["layout_line"] == "layout: FSDP 1 (parallel.dp_replicate=1 dp_shard=1 tp=1) on 1 ranks"
    # the dry run's tiny model at its shape (mb 8 x seq 64), as clusterctl/plan/memory.py predicts it; no GPU,
    # so nothing measured against it (a CPU's figure is the process's RSS)
    from clusterctl.plan.memory import RunShape, estimate_memory
    from training.config import load_config

    model = load_config(None, []).model
    predicted = estimate_memory(model, RunShape(micro_batch_size=8, seq_len=64), 1, 80.0).peak_bytes / 2**30
    assert part["predicted_peak_gib"] == pytest.approx(predicted) and "measured_peak_gib" not in part
    assert part["key"]["value"] == part["predicted_peak_gib"] and part["key"]["met"] is None


def test_torchtitan_runs_only_in_its_own_call_and_only_when_it_is_there(tmp_path):
    result = run_check(tmp_path / "out", tmp_path / "work", "--dry-run", "--only", "titan-8b")
    assert result.returncode == 0, result.stderr[-3000:]
    assert sorted(p.name for p in (tmp_path / "out").iterdir()) == ["2b-titan-8b.json", "summary.json"]
    part = json.loads((tmp_path / "out" / "2b-titan-8b.json").read_text())
    if importlib.util.find_spec("torchtitan") is None and not any((REPO / ".whl").rglob("torchtitan-*.whl")):
        assert part["status"].startswith("skipped: torchtitan not importable: carry its wheels in .whl/")
    else:
        assert part["status"] == "ok"


def test_parts_the_deadline_leaves_no_time_for_are_skipped_not_lost(tmp_path):
    result = run_check(tmp_path / "out", tmp_path / "work", "--dry-run", "--deadline-s", "0",
                       "--only", "node-fp8,local-tier")
    assert result.returncode == 0, result.stderr[-3000:]
    parts = {p.stem: json.loads(p.read_text()) for p in (tmp_path / "out").glob("[0-9]*.json")}
    assert sorted(parts) == ["1-node-fp8", "4-local-tier"]
    assert parts["4-local-tier"]["status"].startswith("skipped: out of time: ")
    assert parts["4-local-tier"]["status"].endswith("s left of the script's 0 s, the part needs 90 s")


def test_a_part_whose_tools_died_still_gets_its_file(tmp_path):
    """A bench killed by its time limit (exit 124) after one row: the file says so, with the log's tail."""
    raw = tmp_path / "raw"
    raw.mkdir()
    (raw / "fp8-8b.json").write_text(json.dumps({"results": [
        {"backend": "none", "status": "ok", "reason": "", "tokens_per_s": 100.0},
        {"backend": "torchao-tensorwise", "status": "failed", "reason": "OutOfMemoryError: CUDA out of memory"}]}))
    (raw / "fp8-8b.log").write_text("bench: none: ok\nKilled\n")
    out = tmp_path / "2-fp8-8b.json"
    subprocess.run([sys.executable, str(REPORT), "part", "fp8-8b", "--raw", str(raw), "--out", str(out),
                    "--exit-code", "124", "--wall-s", "180.2", "--budget-s", "180"], check=True, timeout=60)
    part = json.loads(out.read_text())
    assert part["status"] == ("failed: timed out (exit 124 after 180 s of 180 s); torchao-tensorwise: failed: "
                              "OutOfMemoryError: CUDA out of memory; torchao-rowwise: no row")
    assert part["log_tail"] == "bench: none: ok\nKilled" and part["key"]["value"] is None

    subprocess.run([sys.executable, str(REPORT), "part", "mfu-1b", "--raw", str(raw), "--out", str(out),
                    "--exit-code", "137", "--wall-s", "80", "--budget-s", "75"], check=True, timeout=60)
    assert json.loads(out.read_text())["status"] == "failed: timed out (exit 137 after 80 s of 75 s); no bench record"
