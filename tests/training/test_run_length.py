"""What a run's length says about its schedule and checkpoints (training.config.schedule): the lines the trainer
logs at start-up and clusterctl submit prints, and the data.path rule, all on configs, without torch."""

from __future__ import annotations

import pytest

from training.config import load_config
from training.config.schedule import describe_lr_schedule, lr_at, run_length_warnings
from training.errors import ConfigError


def test_a_warmup_the_run_never_finishes_is_said_with_the_last_lr():
    # issue 44's measurement: 30 steps of a 200-step warmup end at 4.5e-4 of a 3e-3 peak
    cfg = load_config("tiny-cpu", ["run.steps=30", "optim.warmup_steps=200"])
    assert run_length_warnings(cfg) == [
        "optim.warmup_steps=200 >= run.steps=30: the learning rate never reaches its peak optim.lr=3.00e-03 "
        "(the last step runs at 4.50e-04); set fewer warmup steps than the run has, e.g. --set "
        "optim.warmup_steps=1 (5%)"]
    assert lr_at(29, cfg.optim, 30) == pytest.approx(4.5e-4)
    assert describe_lr_schedule(cfg.optim, 30) == (
        "lr schedule: peak 3.00e-03 after 200 warmup steps (not reached in 30 steps), no decay within the run; "
        "final lr 4.50e-04 at step 30")


def test_a_checkpoint_interval_past_the_end_is_said_and_the_local_tier_named():
    # issue 44's plan: 477 steps with llama3-8b's interval of 500 (and its local tier every 50 steps)
    cfg = load_config("llama3-8b", ["run.steps=477", "optim.warmup_steps=20"])
    assert run_length_warnings(cfg, cluster_job=True) == [
        "checkpoint.interval_steps=500 >= run.steps=477: no checkpoint is written before the end of the run, only "
        "at the end and on SIGTERM or Ctrl-C; the local tier saves every 50 steps, but not to checkpoint.dir; set "
        "it below run.steps, e.g. --set checkpoint.interval_steps=119"]


def test_interval_zero_is_its_own_case_and_no_checkpoint_dir_says_nothing():
    cfg = load_config("tiny-cpu", ["run.steps=50", "checkpoint.dir=/tmp/ck", "checkpoint.save_final=false"])
    assert run_length_warnings(cfg) == [
        "checkpoint.interval_steps=0 (off): no checkpoint is written before the end of the run's 50 steps, not "
        "even at the end (checkpoint.save_final=false) and on SIGTERM or Ctrl-C; set it below run.steps to save "
        "along the way"]
    assert run_length_warnings(load_config("tiny-cpu", ["run.steps=50"])) == []  # no dir: nothing saved, by choice
    # a cluster job always has a checkpoint.dir (its launcher sets it): submit says what the run will do there
    assert len(run_length_warnings(load_config("tiny-cpu", ["run.steps=50"]), cluster_job=True)) == 1


def test_a_run_that_fits_its_settings_gets_no_warning_and_its_schedule_line():
    cfg = load_config("tiny-cpu", ["run.steps=100", "checkpoint.dir=/tmp/ck", "checkpoint.interval_steps=25"])
    assert run_length_warnings(cfg) == []
    assert describe_lr_schedule(cfg.optim, 100) == (
        "lr schedule: peak 3.00e-03 after 10 warmup steps, cosine decay over steps 11-100 to 3.00e-04; final lr "
        "3.00e-04 at step 100")
    wsd = load_config("tiny-cpu", ["optim.schedule=wsd", "optim.decay_steps=20"])
    assert describe_lr_schedule(wsd.optim, 100) == (
        "lr schedule: peak 3.00e-03 after 10 warmup steps, wsd decay over steps 81-100 to 3.00e-04; final lr "
        "3.00e-04 at step 100")


def test_data_path_is_refused_with_synthetic_data_unless_set_synthetic_replaces_a_files_shards():
    with pytest.raises(ConfigError, match=r"^data.path='/tmp/shards': not read with data.source='synthetic'; "):
        load_config("tiny-cpu", ["data.path=/tmp/shards"])
    with pytest.raises(ConfigError, match=r"^data.path='/x': not read with data.source='synthetic'"):
        load_config("125m", ["data.source=synthetic", "data.path=/x"])
    # README's smoke job: a packaged config's shards replaced by synthetic data, so its path is not read
    cfg = load_config("125m", ["data.source=synthetic"])
    assert (cfg.data.source, cfg.data.path) == ("synthetic", "")
