"""What a resume may change, and where a run may save (issue 28, "Runs that never eat their own checkpoints"):
`python -m training`'s own main() in this process (a 1-rank group, the tiny model, a few steps), on the
issue's command lines, and the rules themselves (training/checkpoint/compat.py) on saved configs."""

from __future__ import annotations

import gc
import json
import logging
import shutil

import pytest

from training.__main__ import EXIT_CONFIG, EXIT_OK, build_parser, main
from training.checkpoint.compat import check_resumable, schedule_change
from training.checkpoint.layout import is_complete
from training.config import load_config
from training.errors import ConfigError

pytestmark = pytest.mark.usefixtures("one_torch_thread")

# tiny-cpu.toml, shortened: warmup 1 step so that 4 steps of cosine decay reach optim.min_lr (3e-4)
SMALL = ["run.seq_len=16", "run.micro_batch_size=2", "run.log_interval_steps=1", "optim.warmup_steps=1",
         "metrics.progress=false"]


def run(capsys, root, *overrides: str, args: tuple[str, ...] = ()) -> tuple[int, list[dict], list[str]]:
    """main() with SMALL, ``overrides`` and checkpoint.dir=root; (exit code, JSON records, config error lines)."""
    argv = [*args]
    for item in [*SMALL, f"checkpoint.dir={root}", *overrides]:
        argv += ["--set", item]
    code = main(argv)
    out, err = capsys.readouterr()
    records = [json.loads(line) for line in out.splitlines() if line.startswith("{")]
    records = [r for r in records if r["event"] not in ("phase", "beat")]  # the node's hang watch reads those
    assert "Traceback" not in err, err[-3000:]
    return code, records, [line for line in err.splitlines() if line.startswith("config error: ")]


def steps(root) -> list[str]:
    return sorted((p.name for p in root.iterdir()), key=lambda name: int(name.split("-")[1]))


@pytest.fixture(scope="module")
def used(tmp_path_factory):
    """A checkpoint.dir a 4-step run of the tiny model left (step-4, complete), copied for each test."""
    root = tmp_path_factory.mktemp("used") / "ckpt"
    code = main([a for item in [*SMALL, "run.steps=4", f"checkpoint.dir={root}"] for a in ("--set", item)])
    assert code == EXIT_OK and is_complete(root / "step-4")
    return root


@pytest.fixture()
def ckpt(used, tmp_path):
    return shutil.copytree(used, tmp_path / "ckpt")


def test_main_in_this_process_freezes_nothing(used):
    # the freeze of what the imports built is cli()'s, for a process that only trains: a caller that goes on
    # after main() (this test process, which ran it for `used`) keeps every object collectable
    assert gc.get_freeze_count() == 0


def test_a_resume_with_a_changed_model_shape_is_one_line_naming_the_fields(capsys, ckpt):
    # issue 28: `--set model.dim=128` against a dim-64 checkpoint gave DCP's 55-line size-mismatch traceback
    code, records, errors = run(capsys, ckpt, "run.steps=6", "model.dim=128", "model.ffn_dim=256")
    assert code == EXIT_CONFIG
    assert errors == [f"config error: --resume: {ckpt / 'step-4'} was saved with another model: model.dim 64 -> "
                      "128, model.ffn_dim 192 -> 256; allowed: the values it was saved with, or a new run (--resume "
                      "none) in another checkpoint.dir"]
    assert not any(r["event"] == "step" for r in records)


def test_a_fresh_start_into_a_used_directory_is_refused_and_deletes_nothing(capsys, ckpt):
    # issue 28: the new run's step-2 was written, then deleted by keep_last beside the old run's newer steps
    code, records, errors = run(capsys, ckpt, "run.steps=2", args=("--resume", "none"))
    assert code == EXIT_CONFIG and records == []
    assert errors == [f"config error: --resume none: starts a new run, but checkpoint.dir={str(ckpt)!r} holds "
                      "checkpoints up to step 4, which its saves would be mixed with (keep_last would delete by "
                      "step number); allowed: --resume auto (continue them), another checkpoint.dir, or "
                      "--overwrite-checkpoints (delete them first)"]
    assert steps(ckpt) == ["step-4"]


def test_overwrite_checkpoints_starts_afresh_and_a_later_auto_resume_continues_the_new_run(capsys, ckpt, caplog):
    with caplog.at_level(logging.WARNING, logger="training"):
        code, records, _ = run(capsys, ckpt, "run.steps=2", args=("--resume", "none", "--overwrite-checkpoints"))
    assert code == EXIT_OK
    assert {k: v for k, v in records[0].items() if k != "phases"} == {"event": "resume", "step": 0, "path": None}
    assert f"--overwrite-checkpoints: deleted 1 step directory after step 0 under {ckpt} (steps 4)" in caplog.text
    assert steps(ckpt) == ["step-2"]  # the new run's own, kept


def test_overwrite_checkpoints_is_refused_with_resume_auto(capsys, ckpt):
    code, _, errors = run(capsys, ckpt, "run.steps=6", args=("--overwrite-checkpoints",))
    assert code == EXIT_CONFIG
    assert errors == ["config error: --overwrite-checkpoints: allowed with --resume none or a checkpoint path; "
                      "--resume auto continues the checkpoints there"]
    assert "--overwrite-checkpoints" in build_parser().format_help()


def test_a_new_job_from_another_jobs_checkpoint_is_not_refused(capsys, ckpt, tmp_path):
    # clusterctl submit --resume-from J0: --resume auto --resume-from-dir <J0's directory> into the new job's own
    own = tmp_path / "j-new"
    code, records, errors = run(capsys, own, "run.steps=5", args=("--resume-from-dir", str(ckpt)))
    assert (code, errors) == (EXIT_OK, [])
    assert records[0]["step"] == 4 and records[0]["path"] == str(ckpt / "step-4")
    assert steps(own) == ["step-5"] and steps(ckpt) == ["step-4"]


def test_a_longer_run_steps_warns_once_with_the_lr_jump(capsys, ckpt, caplog):
    # issue 28: `step 200/200 lr 3.00e-04` went on as `step 201/300 lr 1.01e-03` without a word (here 4 -> 8)
    with caplog.at_level(logging.WARNING, logger="training"):
        code, records, _ = run(capsys, ckpt, "run.steps=8")
    assert code == EXIT_OK
    first = next(r for r in records if r["event"] == "step")
    assert first["step"] == 5 and first["lr"] == pytest.approx(1.65e-3, rel=1e-3)
    warnings = [r.getMessage() for r in caplog.records if "learning-rate schedule" in r.getMessage()]
    assert warnings == [
        "resume at step 4: the learning-rate schedule changed (run.steps 4 -> 8): step 4/4 ran at lr 3.00e-04, "
        "step 5/8 now runs at lr 1.65e-03 where the schedule that ran gives 3.00e-04; to extend it without "
        "reshaping the decay that ran, set optim.decay_steps=3 (the added steps train at optim.min_lr), or start "
        "runs that may grow with optim.schedule='wsd' (docs/operations.md, 'Resuming a run')"
    ]


def test_a_fixed_decay_extends_a_run_at_the_floor_without_a_warning(capsys, ckpt, caplog):
    with caplog.at_level(logging.WARNING, logger="training"):
        code, records, _ = run(capsys, ckpt, "run.steps=6", "optim.decay_steps=3")
    assert code == EXIT_OK
    assert [(r["step"], r["lr"]) for r in records if r["event"] == "step"] == [(5, 3e-4), (6, 3e-4)]
    assert "learning-rate schedule" not in caplog.text


# --- the rules on saved configs --------------------------------------------------------------------------------
def saved(*overrides: str) -> dict:
    return load_config(None, list(overrides)).to_dict()


def test_fields_that_may_change_are_allowed():
    cfg = load_config(None, ["optim.lr=1e-3", "run.steps=500", "checkpoint.interval_steps=7",
                             "run.micro_batch_size=4", "parallel.param_dtype=bfloat16", "fp8.backend=torchao"])
    assert check_resumable(saved(), cfg, "/c/step-9") == []
    assert check_resumable({}, cfg, "/c/step-9") == []  # a marker without a config: nothing to compare


@pytest.mark.parametrize(("override", "named"), [
    ("model.n_layers=3", "model.n_layers 2 -> 3"),
    ("model.n_heads=8", "model.n_heads 4 -> 8"),  # the same tensor shapes, another head_dim
    ("model.n_kv_heads=1", "model.n_kv_heads 2 -> 1"),
    ("model.vocab_size=384", "model.vocab_size 320 -> 384"),
    ("model.tie_embeddings=true", "model.tie_embeddings False -> True"),
])
def test_a_field_that_changes_the_saved_tensors_is_refused_by_name(override, named):
    with pytest.raises(ConfigError, match=f"^--resume: /c/step-9 was saved with another model: {named}; allowed"):
        check_resumable(saved(), load_config(None, [override]), "/c/step-9")


def test_a_switch_into_transformer_engine_is_refused_and_one_out_of_it_loads():
    te = saved("fp8.backend=te")
    assert check_resumable(te, load_config(None, []), "/c/step-9") == []
    with pytest.raises(ConfigError, match=r"fp8.backend 'none' -> 'te' \(the checkpoint has no Transformer Engine"):
        check_resumable(saved(), load_config(None, ["fp8.backend=te"]), "/c/step-9")


def test_a_field_that_loads_but_computes_differently_is_a_warning():
    warnings = check_resumable(saved(), load_config(None, ["model.rope_theta=500000.0"]), "/c/step-9")
    assert warnings == ["resume from /c/step-9: model.rope_theta 10000.0 -> 500000.0: the weights load, but the "
                        "model computes differently from the one that trained them"]


def test_the_issues_schedule_numbers():
    # tiny-cpu.toml (lr 3e-3, min_lr 3e-4, warmup 10): 200 steps extended to 300
    line = schedule_change(saved("run.steps=200"), load_config(None, ["run.steps=300"]), 200)
    assert line is not None and line.startswith(
        "resume at step 200: the learning-rate schedule changed (run.steps 200 -> 300): step 200/200 ran at lr "
        "3.00e-04, step 201/300 now runs at lr 1.01e-03 where the schedule that ran gives 3.00e-04; to extend it "
        "without reshaping the decay that ran, set optim.decay_steps=190")
    assert schedule_change(saved("run.steps=200"), load_config(None, ["run.steps=300", "optim.decay_steps=190"]),
                           200) is None


def test_schedule_changes_that_continue_what_ran_are_silent():
    assert schedule_change(saved("run.steps=200"), load_config(None, ["run.steps=200"]), 120) is None
    # a wsd run still in its stable phase, made longer: the decay moves, nothing that ran changes
    wsd = ["optim.schedule=wsd", "optim.decay_steps=50"]
    assert schedule_change(saved("run.steps=200", *wsd), load_config(None, ["run.steps=400", *wsd]), 120) is None
    assert schedule_change({}, load_config(None, ["run.steps=300"]), 200) is None  # no saved config
    assert schedule_change(saved("run.steps=200"), load_config(None, ["run.steps=200"]), 200) is None  # done


def test_a_changed_peak_is_named_in_the_warning():
    line = schedule_change(saved("run.steps=200"), load_config(None, ["run.steps=200", "optim.lr=6e-3"]), 100)
    assert line is not None and "(optim.lr 0.003 -> 0.006)" in line and "keep a decay fixed" in line
