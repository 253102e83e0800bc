"""Acceptance for FP8 resume: real 2-rank runs on the CPU (gloo, FSDP2, torchao in emulate mode), for each
torchao recipe and FP8 all-gather setting. The ranks are started as torchrun's workers but without its agent
(torchrun_support.run_as_nodes), which would only add a torch import to every start: torchrun itself is
test_torchrun.py's.

One chain of three runs per recipe: a straight run with asynchronous periodic checkpoints; a run resumed from
one of those asynchronous checkpoints and stopped by SIGTERM (which saves a blocking checkpoint); a run
resumed from the SIGTERM checkpoint to the end. Losses, gradient norms and every model and optimizer tensor
must be bit-identical with the straight run. And a non-finite value planted in a staged copy must fail the
save loudly and leave no complete checkpoint.

Every start costs seconds on the 2-core CI machine, so the runs are module-scoped fixtures and the model is
the tiny one (test_torchrun.py's SMALL shapes) for 12 steps."""

from __future__ import annotations

import re
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torchrun_support import Run, complete_steps, load_checkpoint, run_as_nodes, run_as_nodes_and_signal

from training.checkpoint.state import iter_leaves

pytestmark = pytest.mark.slow

FP8 = ["fp8.backend=torchao", "fp8.emulate=true"]
RECIPES = {
    # the defaults, and the path whose asynchronous checkpoints held uninitialised memory
    "tensorwise-fp8-all-gather": ["fp8.torchao_recipe=tensorwise", "fp8.fsdp_float8_all_gather=true"],
    "tensorwise": ["fp8.torchao_recipe=tensorwise", "fp8.fsdp_float8_all_gather=false"],
    # rowwise scaling has no FP8 all-gather (fp8.py turns it off for any recipe but tensorwise)
    "rowwise": ["fp8.torchao_recipe=rowwise", "fp8.fsdp_float8_all_gather=false"],
}
STEPS = 12
# A warmup longer than any run and min_lr = lr: a step's learning rate does not depend on run.steps, so the
# SIGTERM run (run.steps=100000, stopped early) follows the same curve as the 12-step runs.
SCHEDULE = ["optim.warmup_steps=15", "optim.min_lr=3e-3"]
PERIODIC = ["checkpoint.interval_steps=3", "checkpoint.keep_last=10", "checkpoint.async_save=true"]
SIGNAL_AFTER_STEP = 5


def two_ranks(overrides: list[str], **kwargs) -> Run:
    return run_as_nodes([overrides, overrides], **kwargs)


@dataclass
class ResumeChain:
    straight: Run  # STEPS steps, asynchronous saves at 3, 6, 9 and a blocking final save at 12
    straight_root: Path
    stopped: Run  # resumed from a copy of the straight run's step-3, stopped by SIGTERM
    sigterm_step: int  # the blocking checkpoint the SIGTERM caused
    finished: Run  # resumed from the SIGTERM checkpoint up to STEPS, with the same periodic saves
    root: Path


@pytest.fixture(scope="module", params=sorted(RECIPES))
def chain(request, tmp_path_factory) -> ResumeChain:
    pytest.importorskip("torchao")
    recipe = FP8 + RECIPES[request.param] + SCHEDULE
    straight_root = tmp_path_factory.mktemp(f"straight-{request.param}")
    straight = two_ranks(recipe + PERIODIC + [f"run.steps={STEPS}", f"checkpoint.dir={straight_root}"],
                         resume="none")
    root = tmp_path_factory.mktemp(f"resumed-{request.param}")
    if (straight_root / "step-3").is_dir():
        shutil.copytree(straight_root / "step-3", root / "step-3")
    # no periodic saves: the checkpoint this run leaves is the blocking one SIGTERM causes
    stopped_overrides = recipe + ["run.steps=100000", "checkpoint.interval_steps=0", f"checkpoint.dir={root}"]
    stopped = run_as_nodes_and_signal([stopped_overrides, stopped_overrides], sig=signal.SIGTERM,
                                      after_step=SIGNAL_AFTER_STEP)
    saved = complete_steps(root)
    sigterm_step = saved[-1] if saved else 0
    finished = two_ranks(recipe + PERIODIC + [f"run.steps={STEPS}", f"checkpoint.dir={root}"], resume="auto")
    return ResumeChain(straight, straight_root, stopped, sigterm_step, finished, root)


def test_the_periodic_saves_were_asynchronous_and_complete(chain):
    assert chain.straight.returncode == 0, chain.straight.output
    assert "fp8 backend torchao" in chain.straight.output
    for step in (3, 6, 9):
        assert f"checkpoint step {step}: staged in " in chain.straight.output  # dcp.async_save, not a fallback
    assert complete_steps(chain.straight_root) == [3, 6, 9, 12]


def test_resume_from_an_async_checkpoint_is_bit_exact_up_to_the_sigterm(chain):
    assert chain.stopped.returncode == 0, chain.stopped.output
    assert f"resumed from {chain.root}/step-3 " in chain.stopped.output
    assert "stopped by SIGTERM" in chain.stopped.output
    assert SIGNAL_AFTER_STEP <= chain.sigterm_step < STEPS, chain.stopped.output
    assert sorted(chain.stopped.losses) == list(range(4, chain.sigterm_step + 1))
    for step in range(4, chain.sigterm_step + 1):
        assert chain.stopped.losses[step] == chain.straight.losses[step], step
        assert chain.stopped.grad_norms[step] == chain.straight.grad_norms[step], step


def test_resume_from_the_sigterm_checkpoint_is_bit_exact_to_the_end(chain):
    assert chain.finished.returncode == 0, chain.finished.output
    assert f"resumed from {chain.root}/step-{chain.sigterm_step} " in chain.finished.output
    assert sorted(chain.finished.losses) == list(range(chain.sigterm_step + 1, STEPS + 1))
    for step in chain.finished.losses:
        assert chain.finished.losses[step] == chain.straight.losses[step], step
        assert chain.finished.grad_norms[step] == chain.straight.grad_norms[step], step
    assert all(0 < loss < 10 for loss in chain.straight.losses.values()), chain.straight.losses


def test_every_model_and_optimizer_tensor_is_bit_exact(chain, tmp_path):
    # the final blocking saves, and an asynchronous periodic save both chains wrote after the resumes
    steps = [STEPS] + ([9] if chain.sigterm_step < 9 else [])
    for step in steps:
        a = dict(iter_leaves(load_checkpoint(chain.straight_root / f"step-{step}", tmp_path)))
        b = dict(iter_leaves(load_checkpoint(chain.root / f"step-{step}", tmp_path)))
        assert a.keys() == b.keys()
        assert any(k.startswith("model.") for k in a) and any(k.startswith("optim.state.") for k in a)
        for key, value in a.items():
            if isinstance(value, torch.Tensor):
                assert torch.equal(value, b[key]), (step, key)
                assert torch.isfinite(value).all(), (step, key)
            else:
                assert value == b[key], (step, key)


# ---------------------------------------------------------------------------------------------------------
# A launcher that runs `python -m training` with one NaN written into rank 1's staged copy of a weight: what
# uninitialised memory can hold. Nothing in the training package knows about it.
PLANT = """
import os
import sys

from torch.distributed.checkpoint.staging import DefaultStager

stage = DefaultStager.stage


def stage_and_plant(self, state_dict, **kwargs):
    staged = stage(self, state_dict, **kwargs)
    if os.environ["RANK"] == "1":
        staged["model"]["layers.0.attention.wq.weight"]._local_tensor.view(-1)[0] = float("nan")
    return staged


DefaultStager.stage = stage_and_plant
from training.__main__ import main  # noqa: E402

sys.exit(main())
"""


def test_a_planted_non_finite_staged_tensor_fails_the_save_loudly_and_leaves_no_complete_checkpoint(tmp_path):
    pytest.importorskip("torchao")
    script = tmp_path / "plant.py"
    script.write_text(PLANT)
    root = tmp_path / "checkpoints"
    run = two_ranks(FP8 + RECIPES["tensorwise-fp8-all-gather"]
                    + ["run.steps=6", "checkpoint.interval_steps=3", f"checkpoint.dir={root}"],
                    resume="none", entry=(str(script),))
    assert run.returncode != 0, run.output
    failure = (r"ERROR training\.checkpoint: checkpoint step 3 failed and is not complete \(.*step-3\): rank 1: "
               r"CheckpointVerificationError: .*model\.layers\.0\.attention\.wq\.weight: non-finite values")
    assert re.search(failure, run.output), run.output
    assert complete_steps(root) == []  # neither step 3 nor a later save
    assert not (root / "step-3" / ".metadata").exists()
