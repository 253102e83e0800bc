"""`clusterctl plan --finetune` (issue 44): a fine-tune's schedule sized for its length, each setting printed with
its recipe, carried by the submit line, and passing the trainer's own run-length check; without it, that check's
warnings in the plan. Also the plan's other issue-44 lines: too few tokens, the refused node count last, the MFU
column's source, and a mistyped name."""

import json
import shlex

import pytest

import clusterctl.plan.mfu
from cluster_aws.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from clusterctl.plan.finetune import finetune_schedule
from training.config import load_config
from training.config.schedule import run_length_warnings

P5 = ("--instance-types", "p5.48xlarge")


@pytest.fixture(autouse=True)
def no_measurements(monkeypatch, tmp_path):
    """The default MFU (the real benchmarks/mfu.json may gain rows)."""
    table = tmp_path / "mfu.json"
    table.write_text('{"measurements": []}')
    monkeypatch.setattr(clusterctl.plan.mfu, "MEASURED_MFU_PATH", table)


def submit_line(result) -> list[str]:
    line = next(x.strip() for x in result.lines if x.strip().startswith("clusterctl submit "))
    return shlex.split(line)[1:]


def test_finetune_sizes_the_schedule_for_2b_tokens_and_says_why(cli):
    result = cli("plan", "--model", "llama3-8b", "--tokens", "2B", "--finetune", *P5)
    assert result.code == EXIT_OK, result.err
    # Tulu 3's batch, 2**19 tokens: 2e9 / 524,288 = 3,814.7 -> 3,815 steps (not pretraining's 477 of 4Mi)
    assert result.lines[1].startswith("global batch: 524,288 tokens a step at any node count (the fine-tune default, "
                                      "Tulu 3's 128 x 4096 tokens (below)): 3,815 steps; ")
    start = result.lines.index("fine-tune: 3,815 steps from random weights: no init.hf_dir yet (--init-hf-dir DIR "
                               "sets it); each setting and the recipe it follows:")
    reasons = result.lines[start + 1:start + 9]
    assert reasons[1] == ("  peak lr 2e-5: torchtune recipes/configs/llama3_1/8B_full.yaml (AdamW lr 2e-5); Tulu 3 "
                          "used 5e-6, the one to try if the validation loss rises")
    # 3% of 3,815 = 114.45 -> 114; a tenth -> 381; the cosine over the other 3,701 steps
    assert reasons[2] == "  warmup 114 steps: 3% of the run, Tulu 3's warmup_ratio"
    assert reasons[3].startswith("  decay: cosine to 0 over the remaining 3,701 steps, torchtune ")
    assert reasons[4].startswith("  durable checkpoint every 381 steps: a tenth of the run (ours)")
    assert reasons[5].startswith("  validation: off: the config has no validation.path; add --set "
                                 "validation.path=DIR (held-out shards) --set validation.interval_steps=190 ")
    assert reasons[5].endswith(" --set validation.windows=128")  # the same held-out set on any number of nodes
    assert reasons[6] == ("  lr schedule: peak 2.00e-05 after 114 warmup steps, cosine decay over steps 115-3815 to "
                          "0.00e+00; final lr 0.00e+00 at step 3815")
    sets = submit_line(result)
    assert sets[sets.index("run.steps=3815") - 1] == "--set"
    assert " ".join(sets).endswith("--set optim.lr=2e-5 --set optim.min_lr=0.0 --set optim.warmup_steps=114 "
                                   "--set checkpoint.interval_steps=381")
    assert not any(line.startswith("warning:") for line in result.lines)


def test_the_plans_submit_line_passes_submits_check_with_no_warning(cli):
    """The submit line, as printed, through `submit --dry-run`: the trainer's loader accepts it and its run-length
    check (which the trainer repeats at start-up) has nothing to say."""
    plan = cli("plan", "--model", "llama3-8b-finetune", "--tokens", "2B", *P5)
    assert plan.code == EXIT_OK, plan.err
    args = submit_line(plan)
    assert args[:3] == ["submit", "--config", "training/configs/llama3-8b-finetune.toml"]
    assert "validation.interval_steps=190" in args  # the packaged config has a held-out path
    dry_run = cli(*args, "--dry-run", "--json")
    assert dry_run.code == EXIT_OK, dry_run.err
    assert dry_run.err == ""
    settings = json.loads(dry_run.out)["settings"]
    assert settings["run.steps"] == 3815


def test_init_hf_dir_implies_the_finetune_and_is_on_the_submit_line(cli):
    result = cli("--json", "plan", "--model", "llama3-8b", "--tokens", "1B", "--init-hf-dir",
                 "/fsx/data/Llama-3.1-8B", *P5)
    assert result.code == EXIT_OK, result.err
    report = json.loads(result.out)
    assert report["globalBatchTokens"] == 524_288 and report["steps"] == 1908  # 1e9 / 524,288 = 1,907.3
    assert report["finetune"][0].startswith("fine-tune: 1,908 steps from init.hf_dir=/fsx/data/Llama-3.1-8B;")
    assert report["chosen"]["submit"].endswith(" --set optim.warmup_steps=57 --set checkpoint.interval_steps=190 "
                                               "--set init.hf_dir=/fsx/data/Llama-3.1-8B")
    assert report["chosen"]["runWarnings"] == []


@pytest.mark.parametrize("steps", [2, 3, 7, 33, 477, 3815, 100_000])
def test_the_schedule_passes_the_trainers_check_at_any_length(steps):
    base = load_config("llama3-8b-finetune")
    schedule = finetune_schedule(steps, 524_288, base)
    cfg = load_config("llama3-8b-finetune", [f"run.steps={steps}", *schedule.overrides(base)])
    assert run_length_warnings(cfg, cluster_job=True) == []
    assert 1 <= cfg.optim.warmup_steps < steps and 1 <= cfg.checkpoint.interval_steps < steps
    assert 1 <= cfg.validation.interval_steps <= max(1, steps // 20)


def test_a_one_step_run_has_no_room_and_the_trainers_check_says_so():
    base = load_config("llama3-8b-finetune")
    schedule = finetune_schedule(1, 524_288, base)
    assert schedule.warmup_steps == 0
    cfg = load_config("llama3-8b-finetune", ["run.steps=1", *schedule.overrides(base)])
    assert [w.split(":")[0] for w in run_length_warnings(cfg, cluster_job=True)] == [
        "checkpoint.interval_steps=1 >= run.steps=1"]


def test_without_finetune_the_trainers_warnings_are_in_the_plan(cli):
    """The issue's plan: 477 steps of a pretraining config, warmup 2000 and checkpoints every 500."""
    result = cli("plan", "--model", "llama3-8b", "--tokens", "2B", *P5)
    assert result.code == EXIT_OK, result.err
    assert "run.steps=477" in submit_line(result)
    expected = run_length_warnings(load_config("llama3-8b", ["run.steps=477"]), cluster_job=True)
    assert [w.split(":")[0] for w in expected] == ["optim.warmup_steps=2000 >= run.steps=477",
                                                   "checkpoint.interval_steps=500 >= run.steps=477"]
    warnings = [line for line in result.lines if line.startswith("warning:")]
    assert warnings == [f"warning: {w}" for w in expected] + [
        "warning: a run that continues published weights: clusterctl plan --finetune sizes the warmup, learning "
        "rate and checkpoint and validation intervals for its length"]


def test_tokens_below_a_million_warn_of_a_forgotten_suffix(cli):
    result = cli("plan", "--model", "1b", "--tokens", "200", *P5)
    assert result.lines[1] == ("warning: --tokens 200 is 200 tokens, under 1M: a forgotten suffix? (K, M, B, T: "
                               "200B is 200B)")
    assert not any(line.startswith("warning: --tokens") for line in cli("plan", "--model", "1b", "--tokens", "1M",
                                                                         *P5).lines)


def test_a_refused_node_count_says_why_in_the_last_line(cli):
    result = cli("plan", "--model", "llama3-8b", "--tokens", "2B", "--nodes", "3", *P5)
    assert result.code == EXIT_FAILED
    assert result.lines[-1] == (
        "no instance type fits: 3 nodes do not split the global batch of 4,194,304 tokens into whole micro-batches "
        "(196,608 tokens per micro-step); node counts that do: 1, 2, 4, 8, 16, 32, 64, 128, 256")


def test_the_mfu_column_says_the_activation_checkpointing_factor(cli):
    # 16 p5 hold llama3-70b without TP only with activation checkpointing: 0.40 assumed without it, x 3/4 = 0.30
    # with it (left to choose, the plan takes TP 8 without it there)
    result = cli("plan", "--model", "llama3-70b", "--tokens", "2B", "--nodes", "16", "--layout", "tp=1", *P5)
    assert result.code == EXIT_OK, result.err
    row = result.lines[3].split()
    assert row[row.index("on") + 2:row.index("on") + 6] == ["0.30", "assumed", "x3/4", "(AC)"]
    assert any(line.startswith("MFU FROM x3/4 (AC): activation checkpointing recomputes the forward")
               for line in result.lines)
    # llama3-8b on 1 p5 runs without it (TP 2): the figure as assumed, no factor and no note
    plain = cli("plan", "--model", "llama3-8b", "--tokens", "2B", "--nodes", "1", *P5).lines
    row = plain[3].split()
    assert row[row.index("off") + 2:row.index("off") + 4] == ["0.40", "assumed"] and "x3/4" not in row
    assert not any(line.startswith("MFU FROM") for line in plain)


def test_submit_names_the_closest_packaged_config_of_a_typo(cli):
    result = cli("submit", "--config", "1bb", "--dry-run")
    assert result.code == EXIT_USAGE and len(result.err.splitlines()) == 1
    assert result.err.endswith("or a .toml path; did you mean 1b?\n")
