"""Acceptance tests: real ``torchrun --nproc_per_node=2`` runs of ``python -m training`` on the CPU (gloo,
FSDP2, the tiny model, synthetic data); only the fused-loss straight run, whose subject is the loss, starts its
two ranks without torchrun's agent. Each start costs seconds, so every run is a module-scoped fixture shared by
the assertions about it."""

from __future__ import annotations

import json
import re
import shutil
import signal
from dataclasses import dataclass
from pathlib import Path

import pytest
import torch
from torchrun_support import Run, complete_steps, load_checkpoint, run_as_nodes, torchrun, torchrun_and_signal

from node_bootstrap.job_contract import TRAINER_STOPPED_LINE
from training.checkpoint.state import iter_leaves

pytestmark = pytest.mark.slow

# ---------------------------------------------------------------------------------------------------------
# 20 steps straight vs 10 + resume + 10. warmup_steps=15 > 10 and min_lr = lr: the learning rate at every
# step is the same whether the run was planned for 10 or 20 steps, and the warmup crosses the resume point,
# so a resume that continued at the wrong step would show in the losses.
RESUME = ["optim.warmup_steps=15", "optim.min_lr=3e-3",
          "checkpoint.interval_steps=5", "checkpoint.keep_last=2", "checkpoint.async_save=true"]
# The loss on the full logits (the default) and fused with the output head over chunks of 48 tokens (each
# rank's micro-batch has 4 x 32 = 128 tokens: two chunks of 48 and a short one of 32).
LOSS = {"full-logits": [], "fused-loss": ["parallel.loss_chunk_tokens=48"]}


@pytest.fixture(scope="module")
def straight_runs(tmp_path_factory):
    """The 20-step straight run for a LOSS mode, run once per mode and shared (the fused-loss comparison
    needs both). The full-logits run is a real torchrun's; the fused loss changes only the loss, not what
    torchrun does, so its ranks start without the agent (torchrun_support.run_as_nodes)."""
    runs: dict[str, tuple[Run, Path]] = {}

    def get(mode: str) -> tuple[Run, Path]:
        if mode not in runs:
            root = tmp_path_factory.mktemp(f"straight-{mode}")
            overrides = RESUME + LOSS[mode] + ["run.steps=20", f"checkpoint.dir={root}"]
            run = (torchrun(overrides, resume="none") if mode == "full-logits"
                   else run_as_nodes([overrides, overrides], resume="none"))
            runs[mode] = run, root
        return runs[mode]

    return get


@pytest.fixture(scope="module", params=sorted(LOSS))
def loss_mode(request) -> str:
    return request.param


@pytest.fixture(scope="module")
def straight(straight_runs, loss_mode) -> tuple[Run, Path]:
    return straight_runs(loss_mode)


@pytest.fixture(scope="module")
def split(tmp_path_factory) -> tuple[Run, Run, Path]:
    """The 20 steps as 10 + resume + 10, with the loss on the full logits. The fused loss keeps no state of its
    own, so a resume with it would only take this path again (it is compared with the full logits below)."""
    root = tmp_path_factory.mktemp("split")
    first = torchrun(RESUME + ["run.steps=10", f"checkpoint.dir={root}"], resume="none")
    second = torchrun(RESUME + ["run.steps=20", f"checkpoint.dir={root}"], resume="auto")
    return first, second, root


def test_loss_falls_on_the_synthetic_task(straight):
    run, _ = straight
    assert run.returncode == 0, run.output
    losses = [run.losses[s] for s in range(1, 21)]
    assert sum(losses[-3:]) / 3 < sum(losses[:3]) / 3 - 0.5, losses


def test_the_fused_loss_trains_like_the_full_logits_on_two_ranks(straight_runs):
    """2 ranks, gradient accumulation over 2 micro-batches, 20 steps: the fused loss (and so its gradients,
    reduce-scattered by FSDP2) follows the full-logits run to float32 rounding."""
    full, _ = straight_runs("full-logits")
    fused, fused_root = straight_runs("fused-loss")
    assert full.returncode == 0 and fused.returncode == 0, fused.output
    assert sorted(fused.losses) == sorted(full.losses) == list(range(1, 21))
    for step, loss in full.losses.items():
        assert fused.losses[step] == pytest.approx(loss, rel=1e-6), step  # measured: 4.7e-8 at most
        assert fused.grad_norms[step] == pytest.approx(full.grad_norms[step], rel=1e-5), step  # 1.2e-7
    saved = json.loads((fused_root / "step-20" / "train_state.json").read_text())
    assert saved["config"]["parallel"]["loss_chunk_tokens"] == 48


def test_step_records_carry_the_metrics(straight):
    run, _ = straight
    record = [s for s in run.steps if "loss" in s][-1]  # rank 0's (another node's step lines carry no loss)
    assert record["event"] == "step" and record["step"] == 20
    assert record["mfu"] is None  # no GPU peak on a CPU
    assert record["slowest_rank"] in (0, 1)
    assert 0 < record["step_time_s_min"] <= record["step_time_s_max"]
    # 2 ranks x 2 micro-batches x 4 samples x 32 tokens per step
    assert record["tokens_per_s"] == pytest.approx(512 / record["step_time_s_max"])
    assert record["tflops"] > 0 and record["grad_norm"] > 0 and record["mem_gib"] > 0


def test_periodic_async_saves_keep_the_last_two(straight):
    run, root = straight
    assert sorted(p.name for p in root.iterdir()) == ["step-15", "step-20"], run.output
    assert complete_steps(root) == [15, 20]
    state = json.loads((root / "step-20" / "train_state.json").read_text())
    assert state["step"] == 20 and state["world_size"] == 2
    assert state["config"]["run"]["steps"] == 20


def test_resume_is_bit_exact(straight_runs, split, tmp_path):
    run, straight_root = straight_runs("full-logits")
    first, second, split_root = split
    assert first.returncode == 0, first.output
    assert second.returncode == 0, second.output
    assert "resumed from" in second.output and "step-10" in second.output
    # one resume line per run, from rank 0 (one node), before the first step line: what the jobs launcher
    # reads from the job log as resumedFromStep
    assert run.resumes == first.resumes == [{"event": "resume", "step": 0, "path": None}]
    assert second.resumes == [{"event": "resume", "step": 10, "path": f"{split_root}/step-10", "tier": "durable"}]
    assert second.output.index('"event": "resume"') < second.output.index('"event": "step"')
    from node_bootstrap.jobs import find_resumed_from_step
    assert find_resumed_from_step(second.output) == 10
    assert sorted(first.losses) == list(range(1, 11))
    assert sorted(second.losses) == list(range(11, 21))
    # losses: exactly equal floats, step by step
    assert {**first.losses, **second.losses} == run.losses
    # final model and optimizer state, tensor by tensor
    a = dict(iter_leaves(load_checkpoint(straight_root / "step-20", tmp_path)))
    b = dict(iter_leaves(load_checkpoint(split_root / "step-20", tmp_path)))
    assert a.keys() == b.keys()
    assert any(k.startswith("model.") for k in a) and any(k.startswith("optim.state.") for k in a)
    for key, value in a.items():
        if isinstance(value, torch.Tensor):
            assert torch.equal(value, b[key]), key
        else:
            assert value == b[key], key


def test_a_2_rank_checkpoint_loads_bit_exactly_into_1_rank(straight_runs, tmp_path):
    """What holds across world sizes (tiny-cpu.toml): DCP reshards the saved state exactly, every tensor bit
    for bit. The steps after such a resume are not bit-exact with the 2-rank run (each rank's loss is a mean
    over its part of the batch and FSDP2 averages the gradients, so the sums run in another order): they
    agree to a few float32 ulps (~5e-7 in the loss)."""
    from torch.distributed.tensor import DTensor

    from training.checkpoint.checkpointer import CheckpointConfig, Checkpointer
    from training.checkpoint.state import build_state
    from training.config import load_config
    from training.fp8 import NoFp8
    from training.optim import build_optimizer
    from training.parallel.process_group import destroy_distributed, init_distributed
    from training.train import build_model

    _, root = straight_runs("full-logits")
    cfg = load_config(None, [])  # the tiny-cpu default the runs used: same model, float32
    info = init_distributed()  # no torchrun variables here: a 1-rank group
    assert info.world_size == 1
    try:
        model = build_model(cfg.model, cfg.parallel, NoFp8(), info, seed=1)  # other weights: the load must win
        optimizer = build_optimizer(model, cfg.optim)
        Checkpointer(CheckpointConfig(), rank=0, world_size=1, config_snapshot={}).load(
            root / "step-20", model, optimizer)
        loaded = {k: v.full_tensor() if isinstance(v, DTensor) else v
                  for k, v in iter_leaves(build_state(model, optimizer)) if isinstance(v, torch.Tensor)}
    finally:
        destroy_distributed()
    saved = {k: v for k, v in iter_leaves(load_checkpoint(root / "step-20", tmp_path)) if isinstance(v, torch.Tensor)}
    assert loaded.keys() == saved.keys() and any(k.startswith("optim.state.") for k in saved)
    for key, value in saved.items():
        assert torch.equal(loaded[key], value), key


# ---------------------------------------------------------------------------------------------------------
# One chain of three runs (each torchrun start is expensive): SIGTERM to rank 1 -> checkpoint and exit 0;
# resume from it with periodic saves, then SIGKILL rank 1; plant an incomplete checkpoint newer than the
# last complete one; restart, then Ctrl-C (SIGINT to torchrun and both ranks, as a terminal sends it).
@dataclass
class FaultChain:
    root: Path
    stopped: Run  # the run rank 1 got SIGTERM in
    sigterm_step: int  # the checkpoint it saved
    killed: Run  # resumed from that checkpoint, then rank 1 got SIGKILL
    newest: int  # the newest complete checkpoint the kill left
    restarted: Run  # --resume auto after the kill, stopped by Ctrl-C after its second step


@pytest.fixture(scope="module")
def faults(tmp_path_factory) -> FaultChain:
    root = tmp_path_factory.mktemp("faults")
    # no periodic saves: the only checkpoint is the one SIGTERM causes
    no_periodic = [f"checkpoint.dir={root}", "checkpoint.interval_steps=0"]
    stopped = torchrun_and_signal(["run.steps=100000", *no_periodic], sig=signal.SIGTERM, after_step=3)
    saved = complete_steps(root)
    sigterm_step = saved[-1] if saved else 0
    periodic = [f"checkpoint.dir={root}", "checkpoint.interval_steps=2", "checkpoint.keep_last=3"]
    killed = torchrun_and_signal(["run.steps=100000", *periodic], sig=signal.SIGKILL,
                                 after_step=sigterm_step + 5)
    newest = complete_steps(root)[-1]
    # what a crash between DCP's .metadata and our marker leaves: a newer directory without train_state.json
    incomplete = root / f"step-{newest + 1}"
    shutil.rmtree(incomplete, ignore_errors=True)
    shutil.copytree(root / f"step-{newest}", incomplete)
    (incomplete / "train_state.json").unlink()
    restarted = torchrun_and_signal(["run.steps=100000", *periodic], sig=signal.SIGINT, after_step=newest + 2,
                                    ctrl_c=True)
    return FaultChain(root, stopped, sigterm_step, killed, newest, restarted)


def test_sigterm_on_one_rank_saves_a_complete_checkpoint_and_exits_0(faults):
    assert faults.stopped.returncode == 0, faults.stopped.output
    # both ranks agreed at the boundary after the last logged step, saved it, and stopped
    assert faults.sigterm_step == faults.stopped.steps[-1]["step"] >= 3
    assert "stopped by SIGTERM" in faults.stopped.output
    # on every rank: the line a node's supervisor reads as a checkpointed stop (node_bootstrap/job_contract.py)
    assert faults.stopped.output.count(f"{TRAINER_STOPPED_LINE} {faults.sigterm_step} (checkpoint saved)") == 2


def test_resume_continues_from_the_sigterm_checkpoint(faults):
    assert f"resumed from {faults.root}/step-{faults.sigterm_step} " in faults.killed.output
    assert faults.killed.resumes == [
        {"event": "resume", "step": faults.sigterm_step, "path": f"{faults.root}/step-{faults.sigterm_step}",
         "tier": "durable"}]
    assert faults.killed.steps[0]["step"] == faults.sigterm_step + 1


def test_sigkill_of_one_rank_fails_the_job_and_leaves_complete_checkpoints(faults):
    assert faults.killed.returncode != 0
    assert faults.sigterm_step < faults.newest <= faults.killed.steps[-1]["step"]


def test_restart_skips_the_incomplete_checkpoint_with_a_warning(faults):
    skipped = f"{faults.root}/step-{faults.newest + 1}"
    warning = rf"WARNING .*skipping incomplete checkpoint {re.escape(skipped)} "
    assert re.search(warning, faults.restarted.output), faults.restarted.output


def test_restart_resumes_from_the_last_complete_checkpoint(faults):
    assert f"resumed from {faults.root}/step-{faults.newest} " in faults.restarted.output
    assert sorted(faults.restarted.losses)[:2] == [faults.newest + 1, faults.newest + 2]
    # the planted incomplete directory was older than the new checkpoints: pruned as a crash leftover
    assert not (faults.root / f"step-{faults.newest + 1}").exists()


def test_ctrl_c_under_torchrun_saves_at_the_step_boundary_on_every_rank(faults):
    # issue 44: Ctrl-C under torchrun gave 217 stderr lines, 3 tracebacks and exit 1, with no checkpoint. Now
    # both ranks agree on the step, save it and say so in one line each. torchrun itself still ends in its own
    # SignalException traceback and exit 1 (the elastic agent's, on any SIGINT): the only traceback left.
    last = faults.restarted.steps[-1]["step"]
    assert last >= faults.newest + 2
    output = faults.restarted.output
    assert output.count(f"stopped by SIGINT after step {last} (checkpoint saved)") == 2, output
    assert complete_steps(faults.root)[-1] == last
    assert output.count("Traceback") == 1 and "SignalException" in output, output
