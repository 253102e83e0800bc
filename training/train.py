"""The training run: the build order, written once, then the loop.

Build order (torchtitan's train.py): the layout checked -> process group -> named mesh -> model on the meta
device -> FP8 conversion -> tensor parallelism -> activation checkpointing -> per-block compile -> fully_shard
per block, then the root -> to_empty on the device -> seeded init_weights -> optimizer -> resume -> loop. Each
step is one comment below.

Step numbering: ``step`` in the loop is the 0-based index of the optimizer step being taken; the logs, the
JSON lines and the checkpoint directories count completed steps (``done = step + 1``), so ``step-10/`` holds
the state after 10 steps and a resume from it continues with index 10.
"""

from __future__ import annotations

import dataclasses
import gc
import logging
import os
import time
from collections.abc import Callable
from dataclasses import dataclass

import torch
from torch import nn

from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.compat import schedule_change
from training.checkpoint.layout import read_train_state, step_dir
from training.checkpoint.local_resume import choose_local_resume, keep_only, load_local
from training.checkpoint.local_tier import LocalCheckpointer
from training.checkpoint.resume import agree_on_resume
from training.compile_cache import (
    CompileCache,
    compile_cache_for,
    inductor_dir,
    restore_compile_cache,
    save_compile_cache,
)
from training.config import TrainConfig
from training.config.parallel import ParallelConfig
from training.config.schedule import describe_lr_schedule, run_length_warnings
from training.data.batches import Prefetcher, build_batch_source
from training.errors import ConfigError
from training.faults import StopRequest
from training.fp8 import Fp8Backend, build_fp8_backend, describe_fp8, te_unverified_combinations
from training.hardware import peak_bf16_tflops_per_gpu
from training.hf.export import export_checkpoint
from training.hf.load import load_hf_weights, resolve_init_model
from training.metrics import MetricsLogger, ThroughputModel, log_resume, phase_time
from training.model import ModelConfig, Transformer, flops_per_token, num_params
from training.optim import apply_lr, build_optimizer, lr_at
from training.parallel.layout import Layout, resolve_layout
from training.parallel.mesh import build_mesh
from training.parallel.parallelize import apply_parallelism
from training.parallel.process_group import (
    DistInfo,
    destroy_distributed,
    init_distributed,
    launch_sizes,
    set_process_group_timeout,
)
from training.phases import CHECKPOINT_LOAD, CHECKPOINT_SAVE, EXPORT, VALIDATION, PhaseReporter
from training.preflight import run_preflight
from training.step import clip_grad_norm_, forward_backward
from training.tensorboard import open_tensorboard
from training.validation import Validator, build_validator
from training.young_daly import IntervalCheck

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class TrainResult:
    """How a run ended (on every rank)."""

    start_step: int  # completed steps when this run began (the resumed checkpoint's step, or 0)
    steps_done: int  # completed steps when it ended
    stopped_by_signal: bool  # True when SIGTERM or SIGINT ended it early (after a checkpoint)
    stop_signal: str = ""  # which, agreed by the ranks: "SIGTERM" or "SIGINT" (training.faults); "" when none


def train(cfg: TrainConfig, *, resume: str = "auto", local_resume: bool | None = None,
          overwrite_checkpoints: bool = False) -> TrainResult:
    """Train per ``cfg``; ``resume`` is ``auto`` | ``none`` | a checkpoint path (checkpoint.resolve_resume).
    ``local_resume``: whether a newer step of the local tier may win over ``resume`` (default: with
    ``auto``; ``python -m training`` also when ``--resume-from-dir`` chose another job's checkpoint).
    ``overwrite_checkpoints``: a start with ``none`` or a path may delete the newer checkpoints of checkpoint.dir
    (refused without it: checkpoint.claim_checkpoint_dir). Collective: under torchrun every rank calls it."""
    if overwrite_checkpoints and resume == "auto":
        raise ConfigError("--overwrite-checkpoints: allowed with --resume none or a checkpoint path; --resume auto "
                          "continues the checkpoints there")
    # init.hf_dir: the model's shape is its config.json's (or the copy a fresh start left in checkpoint.dir)
    cfg = resolve_init_model(cfg)
    run_preflight(cfg, rank=int(os.environ.get("RANK", "0")))  # a bad setting fails here, before any build
    # the layout: one that cannot run (degrees, tp against the model and a node, the batch) fails here on every
    # rank alike, before the rendezvous and any collective
    world_size, gpus_per_node = launch_sizes()
    layout = resolve_layout(cfg.parallel, world_size=world_size, gpus_per_node=gpus_per_node, model=cfg.model,
                            run=cfg.run, fp8_backend=cfg.fp8.backend)
    if local_resume is None:
        local_resume = resume == "auto"
    # 0) from here on a SIGTERM or a Ctrl-C is a request to stop at the next step boundary, not an immediate death
    with StopRequest() as stop:
        return _build_and_train(cfg, resume, local_resume, overwrite_checkpoints, stop, layout)


def _build_and_train(cfg: TrainConfig, resume: str, local_resume: bool, overwrite: bool,
                     stop: StopRequest, layout: Layout) -> TrainResult:
    # 1) process group and device: nccl on CUDA (plus gloo for CPU tensors), gloo on the CPU
    dist_info = dataclasses.replace(init_distributed(cfg.parallel.init_timeout_seconds), layout=layout)
    rendezvous_done = phase_time()  # the restart timeline's phases (the resume line carries them)
    # Inductor writes into this run's own directory, which a restart restores on a node that lacks it
    compile_cache = compile_cache_for(cfg, dist_info.world_size)
    try:
        with inductor_dir(compile_cache):
            result = _train_in_group(cfg, resume, local_resume, overwrite, stop, dist_info, compile_cache,
                                     rendezvous_done)
    except ConfigError:
        # A start-up check every rank fails alike (a --resume path that is no checkpoint, unreadable shards):
        # tear the group down before the error reaches the CLI, or the interpreter can abort at exit on the
        # process group's still-running threads ("terminate called without an active exception").
        destroy_distributed()
        raise
    # The FSDP2 model outlives _train_in_group in reference cycles (its hooks and states refer to each other),
    # and with it the process groups and gloo work objects its collectives left. Collected by chance at
    # interpreter shutdown, a gloo object that frees a tensor needs the GIL of an interpreter half torn down:
    # the rank aborted after its last step ("terminate called without an active exception", exit -6), now
    # and then. Collect them here, while the interpreter is whole.
    gc.collect()
    return result


def _train_in_group(cfg: TrainConfig, resume: str, local_resume: bool, overwrite: bool, stop: StopRequest,
                    dist_info: DistInfo, compile_cache: CompileCache | None = None,
                    rendezvous_done: str | None = None) -> TrainResult:
    device = dist_info.device
    layout = dist_info.layout or Layout(dp_replicate=1, dp_shard=dist_info.world_size, tp=1)
    log.info("rank %d/%d pid %d device %s", dist_info.rank, dist_info.world_size, os.getpid(), device)
    if dist_info.is_main:  # what this run computes with, before anything is built
        log.info("torch %s; fp8: %s", torch.__version__, describe_fp8(
            cfg.fp8, param_dtype=cfg.parallel.param_dtype, reduce_dtype=cfg.parallel.reduce_dtype))

    # the held-out set ([validation]) is read now: a bad one fails before the model is built; the ranks of a
    # tp group read the same part of it
    validator = build_validator(cfg, rank=dist_info.dp_rank, world_size=dist_info.dp_size,
                                gather_size=dist_info.world_size, loss_parallel=layout.tp > 1)
    # the step's shape: the data-parallel ranks split the global batch, so accumulation follows their number
    accum = cfg.run.accumulation_steps(dist_info.dp_size)
    if dist_info.is_main:
        log.info("layout: %s (parallel.dp_replicate=%d dp_shard=%d tp=%d) on %d ranks", layout.name,
                 layout.dp_replicate, layout.dp_shard, layout.tp, dist_info.world_size)
        log.info("global batch: %d tokens a step = seq %d x micro-batch %d x %d data-parallel ranks x %d "
                 "accumulated", cfg.run.tokens_per_step(dist_info.dp_size), cfg.run.seq_len,
                 cfg.run.micro_batch_size, dist_info.dp_size, accum)
        log.info("%s", describe_lr_schedule(cfg.optim, cfg.run.steps))
        for warning in run_length_warnings(cfg):  # what clusterctl submit says too, before a job is sent
            log.warning("%s", warning)
    # the durable checkpoint to resume from (rank 0's choice): a config it cannot load, or a start that would
    # save beside a newer run's checkpoints, fails now, before the model is built
    resume_path = agree_on_resume(resume, cfg, dist_info.rank, local_resume=local_resume, overwrite=overwrite)

    # a restart compiles warm: Inductor's directory as its job's first start left it in checkpoint.dir, restored
    # on a node that lacks it, as a spare does (compile_cache.py)
    warm = restore_compile_cache(compile_cache)
    save_cache = (lambda: save_compile_cache(compile_cache)) if dist_info.is_main and not warm else None

    # 2-9) the model, built in the one order (build_model)
    fp8 = build_fp8_backend(cfg.fp8)
    model = build_model(cfg.model, cfg.parallel, fp8, dist_info, seed=cfg.run.seed)
    log.info("model: %.2fM parameters, fp8 backend %s", num_params(model) / 1e6, fp8.name)
    unverified = te_unverified_combinations(cfg.fp8, activation_checkpointing=cfg.parallel.activation_checkpointing)
    if unverified and dist_info.is_main:
        log.warning("Transformer Engine: not yet verified on a GPU by this project: %s; check them with "
                    "`python benchmarks/te_checkpoint_check.py` (docs/benchmarks.md)", "; ".join(unverified))

    # 10) optimizer (FP8 backends that keep scales per weight update them after each step, below)
    optimizer = build_optimizer(model, cfg.optim)

    # 11) resume: rank 0 picks the durable checkpoint, the ranks together the newest complete local step; the
    #     newer wins (a tie: the local one), every rank loads its shards of it; the resume line says which
    checkpointer = Checkpointer(cfg.checkpoint, rank=dist_info.rank, world_size=dist_info.world_size,
                                config_snapshot=cfg.to_dict(), device=dist_info.device)
    local = LocalCheckpointer(cfg.checkpoint, rank=dist_info.rank, world_size=dist_info.world_size,
                              local_world_size=dist_info.local_world_size, device=dist_info.device,
                              layout=layout.settings())
    start_step, tier, fetched = 0, None, None
    # the phase records tell this node's job supervisor what the trainer is doing (training/phases.py)
    phases = PhaseReporter(cfg.metrics.json_lines and dist_info.local_rank == 0)
    with phases.phase(CHECKPOINT_LOAD):  # a fresh start's too: it tells the supervisor that phases are reported
        durable = read_train_state(resume_path) if resume_path is not None else None
        local_choice = (choose_local_resume(local, not_older_than=durable.step if durable else 0) if local_resume
                        else None)
        if local_choice is not None:
            load_local(local_choice, model, optimizer)
            start_step, tier, fetched, resume_path = (local_choice.step, "local", local_choice.fetched,
                                                      local_choice.path)
            log.info("resumed from the local tier: step %d (%d shard(s) fetched from another node)", start_step,
                     fetched)
        elif resume_path is not None:
            start_step, tier = checkpointer.load(resume_path, model, optimizer).step, "durable"
        elif cfg.init.hf_dir:
            # a fresh start: the init directory's weights replace the random ones, each rank reading its shards
            load_hf_weights(model, cfg, rank=dist_info.rank)
    if resume_path is not None:
        # what the straight run derived from these weights after the step that produced them (torchao's
        # precomputed FP8 all-gather scales), derived again, so the next step runs the same code path
        fp8.post_optimizer_step(model)
    keep_only(local, local_choice.step if local_choice is not None else None)
    checkpointer.set_start_step(start_step)  # keep_last never deletes this run's saves for another run's
    if dist_info.is_main and durable is not None and (changed := schedule_change(durable.config, cfg, start_step)):
        log.warning("%s", changed)  # a larger run.steps re-stretches the schedule: said once, at the start
    log_resume(cfg.metrics, rank=dist_info.rank, local_rank=dist_info.local_rank, step=start_step,
               path=resume_path, tier=tier, fetched=fetched,
               phases={"rendezvous_done": rendezvous_done or phase_time(), "checkpoint_loaded": phase_time()},
               compile_cache=None if compile_cache is None else "snapshot" if warm else "cold")

    # 12) the loop
    try:
        with phases.compiles():  # a recompile mid-run, a backward compiled at its first call
            result = _loop(cfg, model, optimizer, fp8, checkpointer, local, stop, dist_info, start_step, validator,
                           on_first_step=save_cache, phases=phases)
    except BaseException:
        local.abandon()  # its writer may wait on a rank that is gone: what it left is never counted
        checkpointer.close_after_error()  # a pending save may still complete; the first error propagates
        raise
    with phases.phase(CHECKPOINT_SAVE):
        local.close()
        checkpointer.close()  # waits for a pending async save: never exit while one is being written
    destroy_distributed()
    if cfg.export.hf_dir and dist_info.is_main and not result.stopped_by_signal and result.steps_done == cfg.run.steps:
        # rank 0 alone, from the final checkpoint on disk, shard by shard (the other ranks may exit)
        with phases.phase(EXPORT):
            export_checkpoint(step_dir(cfg.checkpoint.dir, result.steps_done), cfg.export.resolve(cfg.checkpoint.dir))
    return result


def build_model(model_cfg: ModelConfig, parallel_cfg: ParallelConfig, fp8: Fp8Backend, dist_info: DistInfo, *,
                seed: int) -> Transformer:
    """Steps 2-9 of the build order, shared by train() and the benchmark: a sharded model with its initial
    weights on ``dist_info.device``, in train mode, laid out per ``dist_info.layout`` (None: FSDP over every
    rank)."""
    # 2) the named mesh (dp_replicate, dp_shard, tp), tp innermost so a tp group is on one node
    layout = dist_info.layout or Layout(dp_replicate=1, dp_shard=dist_info.world_size, tp=1)
    mesh = build_mesh(layout, dist_info.device.type)

    # 3) model on the meta device: no memory is allocated until to_empty, so a 70B model builds anywhere
    with torch.device("meta"):
        model = Transformer(model_cfg)

    # 4) FP8: swap eligible nn.Linear for the backend's FP8 modules, before any wrapping
    fp8.convert(model)

    # 5-7) tensor parallelism (torchao's FP8 styles under FP8) -> activation checkpointing (with the FP8
    #      backend's recompute function, if it has one) -> per-block torch.compile -> fully_shard per block,
    #      then the root, on the data-parallel mesh (HSDP when dp_replicate > 1)
    apply_parallelism(model, parallel_cfg, mesh, checkpoint_fn=fp8.activation_checkpoint_fn(),
                      float8_tp=fp8.float8_tensor_parallel)

    # 8) allocate the (sharded) parameters on the device
    model.to_empty(device=dist_info.device)

    # 9) initial weights from a generator seeded with ``seed``: each sharded weight is drawn whole and sliced
    #    to this rank's shard, so the model is the same for any number of ranks (Transformer.init_weights)
    model.init_weights(seed=seed)
    model.train()
    return model


def _loop(cfg: TrainConfig, model: nn.Module, optimizer: torch.optim.Optimizer, fp8: Fp8Backend,
          checkpointer: Checkpointer, local: LocalCheckpointer, stop: StopRequest, dist_info: DistInfo,
          start_step: int, validator: Validator | None = None,
          on_first_step: Callable[[], object] | None = None, phases: PhaseReporter | None = None) -> TrainResult:
    phases = phases or PhaseReporter(False)
    run = cfg.run
    device = dist_info.device
    total_steps = run.steps
    accum = run.accumulation_steps(dist_info.dp_size)  # from run.global_batch_tokens, else grad_accum_steps
    if start_step >= total_steps:
        log.warning("checkpoint is at step %d, run.steps=%d: nothing to train", start_step, total_steps)
        return TrainResult(start_step=start_step, steps_done=start_step, stopped_by_signal=False)

    source = build_batch_source(
        cfg.data, seq_len=run.seq_len, vocab_size=cfg.model.vocab_size, seed=run.seed,
        dp_rank=dist_info.dp_rank, dp_world_size=dist_info.dp_size, micro_batch_size=run.micro_batch_size,
        grad_accum_steps=accum,
    )
    if dist_info.is_main:
        log.info("data: %s", source.describe())  # what the run reads, said once: synthetic is no surprise
    prefetcher = Prefetcher(
        source, start_step=start_step, grad_accum_steps=accum, device=device,
        depth=cfg.data.prefetch_depth_steps, pin_memory=cfg.data.pin_memory,
        numa_affinity=cfg.data.numa_affinity,
    )
    metrics = MetricsLogger(
        cfg.metrics, rank=dist_info.rank, local_rank=dist_info.local_rank, world_size=dist_info.world_size,
        device=device,
        model=ThroughputModel(
            tokens_per_step=run.tokens_per_step(dist_info.dp_size),
            world_size=dist_info.world_size,
            flops_per_token=flops_per_token(cfg.model, run.seq_len),
            peak_tflops_per_gpu=peak_bf16_tflops_per_gpu(device),
        ),
        tensorboard=open_tensorboard(cfg.metrics, cfg.checkpoint.dir, rank=dist_info.rank, start_step=start_step),
        layout=dist_info.layout.settings() if dist_info.layout else None,
    )
    # the local tier's interval against Young/Daly's optimum for this run, said once the second step is timed
    interval_check = IntervalCheck(
        cfg.checkpoint.local_interval_steps, nodes=dist_info.world_size // dist_info.local_world_size,
        params=num_params(model), start_step=start_step,
        gpus=dist_info.world_size // (dist_info.layout.dp_replicate if dist_info.layout else 1),
    ) if dist_info.is_main else None
    if validator is not None and start_step == 0 and cfg.validation.at_start:
        # the baseline, before any step changed the weights (an imported model's own held-out loss): step 0
        with phases.phase(VALIDATION):
            baseline = validator.evaluate(model, step=0, device=device)
        metrics.log_validation(baseline, total_steps=total_steps)
    stopped = False
    done = start_step
    compiled = ""
    interval_start, interval_steps = time.perf_counter(), 0
    try:
        for step in range(start_step, total_steps):
            lr = lr_at(step, cfg.optim, total_steps)
            apply_lr(optimizer, lr)
            with phases.data_wait():  # a read that stalls past a second: a phase, with its bound
                batches = prefetcher.next_step()
            loss = forward_backward(model, fp8, batches, accum,
                                    loss_chunk_tokens=cfg.parallel.loss_chunk_tokens,
                                    loss_parallel=dist_info.layout is not None and dist_info.layout.tp > 1)
            if step == start_step:  # torch.compile compiles in the first forward and backward of a start
                compiled = phase_time()
            grad_norm = clip_grad_norm_(model, cfg.optim.max_grad_norm)
            # a save's background copy of the state overlaps forward and backward; it must be complete before
            # the step changes the parameters and optimizer state (no-op without a save in flight)
            with phases.staging_wait():  # a long wait for it is a save, not a stopped step
                checkpointer.wait_for_staging()
                local.wait_for_staging()
            optimizer.step()
            optimizer.zero_grad(set_to_none=True)
            fp8.post_optimizer_step(model)
            done = step + 1
            interval_steps += 1

            validate = validator is not None and validator.due(done, total_steps)  # a held-out loss is logged
            if logged := done % run.log_interval_steps == 0 or done in (start_step + 1, total_steps) or validate:
                if device.type == "cuda":
                    torch.cuda.synchronize(device)  # step time must include the queued GPU work
                now = time.perf_counter()
                # after the step time is taken (evaluating is not training time); the same on every rank
                validation = None
                if validator is not None and validate:
                    with phases.phase(VALIDATION):  # a pause of the step lines the supervisor expects
                        validation = validator.evaluate(model, step=done, device=device)
                first = {"compiled": compiled, "first_step": phase_time()} if done == start_step + 1 else None
                metrics.log_step(step=done, total_steps=total_steps, loss=loss, lr=lr, grad_norm=grad_norm,
                                 step_time_s=(now - interval_start) / interval_steps, validation=validation,
                                 phases=first)
                if done == start_step + 1:  # start-up is over: a collective that now takes minutes is a hang
                    set_process_group_timeout(cfg.parallel.train_timeout_seconds, dist_info)
                    if on_first_step is not None:  # rank 0 after a cold compile: the compile cache saved
                        on_first_step()
                interval_start, interval_steps = time.perf_counter(), 0

            # step boundary: finish a completed async save, agree on SIGTERM, save when due
            checkpointer.poll()
            stopped = stop.agreed()
            if interval_check is not None and (advice := interval_check.step_done(done, time.perf_counter())):
                log.warning("%s", advice)
            if not logged:  # after the stop flag's all_reduce: every rank reached this step's end
                phases.beat(done)
            if stopped:
                with phases.phase(CHECKPOINT_SAVE):
                    checkpointer.save(done, model, optimizer, blocking=True)
                break
            if checkpointer.should_save(done, total_steps):
                # the final save blocks: the process is about to exit anyway
                with phases.phase(CHECKPOINT_SAVE):
                    checkpointer.save(done, model, optimizer, blocking=done == total_steps)
            if local.should_save(done) and done < total_steps:  # the final state is saved durably
                with phases.phase(CHECKPOINT_SAVE):
                    local.save(done, model, optimizer)
    finally:
        prefetcher.close()
    return TrainResult(start_step=start_step, steps_done=done, stopped_by_signal=stopped,
                       stop_signal=stop.signal_name if stopped else "")
