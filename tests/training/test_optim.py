"""The learning-rate schedule, the optimizer's parameter groups and [optim] validation."""

from __future__ import annotations

import math

import pytest
import torch
from torch import nn

from training.errors import ConfigError
from training.optim import OptimConfig, apply_lr, build_optimizer, lr_at

CFG = OptimConfig(lr=1e-3, min_lr=1e-4, warmup_steps=10)


def test_warmup_is_linear_and_reaches_the_peak_at_its_last_step():
    assert lr_at(0, CFG, 100) == pytest.approx(1e-4)
    assert lr_at(4, CFG, 100) == pytest.approx(5e-4)
    assert lr_at(9, CFG, 100) == pytest.approx(1e-3)


def test_cosine_decays_from_the_peak_to_the_floor_at_the_last_step():
    assert lr_at(10, CFG, 100) == pytest.approx(1e-3)
    midpoint = 10 + (100 - 1 - 10) / 2
    assert lr_at(int(midpoint), CFG, 100) == pytest.approx(
        1e-4 + 0.5 * (1 + math.cos(math.pi * (int(midpoint) - 10) / 89)) * 9e-4)
    assert lr_at(99, CFG, 100) == pytest.approx(1e-4)
    schedule = [lr_at(s, CFG, 100) for s in range(10, 100)]
    assert all(a >= b for a, b in zip(schedule, schedule[1:], strict=False))


def test_steps_past_the_end_stay_at_the_floor():
    assert lr_at(150, CFG, 100) == pytest.approx(1e-4)


def test_the_schedule_does_not_depend_on_the_run_length_during_warmup():
    # the bit-exact resume test relies on this: a 10-step run inside the warmup of a 20-step one
    cfg = OptimConfig(lr=3e-3, min_lr=3e-3, warmup_steps=15)
    assert [lr_at(s, cfg, 10) for s in range(10)] == [lr_at(s, cfg, 20) for s in range(10)]


def test_no_warmup_starts_at_the_peak():
    cfg = OptimConfig(lr=1e-3, min_lr=0.0, warmup_steps=0)
    assert lr_at(0, cfg, 10) == pytest.approx(1e-3)
    assert lr_at(9, cfg, 10) == pytest.approx(0.0)


def test_a_fixed_decay_keeps_the_schedule_that_ran_when_the_run_grows():
    # the default decays until the last step, so run.steps reshapes it; optim.decay_steps fixes its length
    fixed = OptimConfig(lr=1e-3, min_lr=1e-4, warmup_steps=10, decay_steps=90)
    assert [lr_at(s, fixed, 300) for s in range(100)] == [lr_at(s, CFG, 100) for s in range(100)]
    assert [lr_at(s, fixed, 300) for s in (100, 200, 299)] == [1e-4, 1e-4, 1e-4]  # the added steps: the floor
    assert lr_at(100, CFG, 300) > 5e-4  # the default re-stretched


def test_wsd_holds_the_peak_then_decays_linearly_over_the_last_steps():
    wsd = OptimConfig(lr=1e-3, min_lr=1e-4, warmup_steps=10, schedule="wsd", decay_steps=20)
    assert lr_at(9, wsd, 100) == pytest.approx(1e-3)  # warmup as before
    assert {lr_at(s, wsd, 100) for s in range(10, 80)} == {1e-3}  # stable
    assert lr_at(80, wsd, 100) == pytest.approx(1e-3 - 0.05 * 9e-4)  # the first of 20 decay steps
    assert lr_at(89, wsd, 100) == pytest.approx(1e-3 - 0.5 * 9e-4)
    assert lr_at(99, wsd, 100) == 1e-4 and lr_at(120, wsd, 100) == 1e-4
    # made longer while stable: no step that ran changes, the decay moves to the new end
    assert [lr_at(s, wsd, 200) for s in range(80)] == [lr_at(s, wsd, 100) for s in range(80)]
    assert lr_at(199, wsd, 200) == 1e-4
    # decay_steps 0: decay_fraction of the run
    by_fraction = OptimConfig(lr=1e-3, min_lr=0.0, warmup_steps=0, schedule="wsd", decay_fraction=0.25)
    assert by_fraction.decay_window(100) == (75, 25)
    assert lr_at(74, by_fraction, 100) == 1e-3 and lr_at(75, by_fraction, 100) == pytest.approx(0.96e-3)


def test_matrices_are_decayed_and_norms_and_biases_are_not():
    model = nn.Sequential(nn.Embedding(10, 4), nn.Linear(4, 4), nn.LayerNorm(4))
    opt = build_optimizer(model, OptimConfig(weight_decay=0.1, betas=(0.8, 0.9), eps=1e-6))
    decay, no_decay = opt.param_groups
    assert decay["weight_decay"] == 0.1 and no_decay["weight_decay"] == 0.0
    assert {id(p) for p in decay["params"]} == {id(model[0].weight), id(model[1].weight)}
    assert {id(p) for p in no_decay["params"]} == {id(model[1].bias), id(model[2].weight), id(model[2].bias)}
    assert decay["betas"] == (0.8, 0.9) and decay["eps"] == 1e-6


def test_apply_lr_sets_every_group():
    model = nn.Linear(2, 2)
    opt = build_optimizer(model, OptimConfig())
    apply_lr(opt, 0.125)
    assert [g["lr"] for g in opt.param_groups] == [0.125, 0.125]
    model(torch.ones(1, 2)).sum().backward()
    opt.step()  # the groups are usable by AdamW


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("lr", 0.0, "optim.lr=0.0: allowed: a finite number > 0"),
        ("lr", float("inf"), "optim.lr=inf"),
        ("min_lr", 1.0, "optim.min_lr=1.0: allowed: 0 <= min_lr <= optim.lr"),
        ("warmup_steps", -1, "optim.warmup_steps=-1: allowed: an integer >= 0"),
        ("weight_decay", -0.1, "optim.weight_decay=-0.1"),
        ("betas", (0.9, 1.0), "optim.betas=(0.9, 1.0): allowed: two numbers in [0, 1)"),
        ("betas", (0.9,), "optim.betas=(0.9,)"),
        ("eps", 0.0, "optim.eps=0.0"),
        ("max_grad_norm", -1.0, "optim.max_grad_norm=-1.0: allowed: a number >= 0 (0 = off)"),
        ("schedule", "linear", "optim.schedule='linear': allowed: cosine, wsd"),
        ("decay_steps", -1, "optim.decay_steps=-1: allowed: an integer >= 0 (0: until the run's last step)"),
        ("decay_fraction", 0.0, "optim.decay_fraction=0.0: allowed: a number in (0, 1]"),
        ("decay_fraction", 1.5, "optim.decay_fraction=1.5: allowed: a number in (0, 1]"),
    ],
)
def test_invalid_values_name_the_field(field, value, message):
    cfg = OptimConfig(**{field: value})
    with pytest.raises(ConfigError) as err:
        cfg.validate()
    assert str(err.value).startswith(message)


def test_defaults_are_valid():
    OptimConfig().validate()
