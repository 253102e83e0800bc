"""Measuring one row: build the model in the training order, warm it up, time the training loop's own step
(``run_backend``), and the optional torch.profiler capture of the first row."""

from __future__ import annotations

import functools
import gc
import resource
import time
from pathlib import Path

import torch

from training.bench.torchtitan_model import build_torchtitan_model
from training.bench.variants import BenchResult, Variant
from training.config.parallel import ParallelConfig
from training.errors import ConfigError
from training.fp8 import Fp8Config, build_fp8_backend
from training.optim import OptimConfig, build_optimizer
from training.parallel.process_group import DistInfo
from training.step import clip_grad_norm_, forward_backward
from training.train import build_model

GIB = 1024**3


def run_backend(
    variant: Variant,
    model_cfg,
    parallel_cfg: ParallelConfig,
    info: DistInfo,
    *,
    seq_len: int,
    micro_batch_size: int,
    steps: int,
    warmup_steps: int,
    seed: int,
    header: dict,
    fp8_all_gather: bool = False,
    profile: Path | None = None,
) -> BenchResult:
    """Build, warm up and time one row; a missing package or unsupported combination is a skip."""
    on_gpu = info.device.type == "cuda"
    name = variant.name
    if variant.backend == "te" and parallel_cfg.compile:
        return BenchResult(name, "skipped", "not with --compile (see TrainConfig.validate)")
    emulate = variant.backend == "torchao" and not on_gpu
    try:
        fp8 = build_fp8_backend(_fp8_config(variant, emulate, fp8_all_gather))
        if variant.torchtitan:
            build = functools.partial(
                build_torchtitan_model, model_cfg, parallel_cfg, info,
                float8_recipe=variant.recipe or None, emulate=emulate,
            )
        else:
            build = functools.partial(build_model, model_cfg, parallel_cfg, fp8, info, seed=seed)
    except ConfigError as exc:
        return BenchResult(name, "skipped", str(exc))
    _reset_peak_memory(info.device)
    try:
        elapsed_s, loss, warmup_s = _measure(
            build,
            fp8,
            model_cfg,
            parallel_cfg,
            info,
            # torchtitan's model returns logits and keeps its loss on them: like for like with our 0 only
            loss_chunk_tokens=0 if variant.torchtitan else parallel_cfg.loss_chunk_tokens,
            seq_len=seq_len,
            micro_batch_size=micro_batch_size,
            steps=steps,
            warmup_steps=warmup_steps,
            seed=seed,
            profile=profile,
        )
    except ConfigError as exc:  # torchtitan missing or not like for like: said, not a failure
        return BenchResult(name, "skipped", str(exc))
    except Exception as exc:  # an OOM or a kernel error in one backend must not hide the others' numbers
        return BenchResult(name, "failed", f"{type(exc).__name__}: {exc}".splitlines()[0][:300])
    finally:  # the model and optimizer died with _measure's frame; give their memory back before the next
        gc.collect()
        if on_gpu:
            torch.cuda.empty_cache()
    tokens_per_s = steps * micro_batch_size * seq_len / elapsed_s
    tflops = header["flops_per_token"] * tokens_per_s / 1e12
    peak = header["peak_bf16_tflops"]
    return BenchResult(
        name,
        "ok",
        tokens_per_s=tokens_per_s,
        tflops=tflops,
        mfu=tflops / peak if peak else None,
        step_time_ms=1000 * elapsed_s / steps,
        peak_memory_gib=_peak_memory_gib(info.device),
        final_loss=float(loss),
        warmup_s=warmup_s,
    )


def _fp8_config(variant: Variant, emulate: bool, fp8_all_gather: bool) -> Fp8Config:
    """The [fp8] section a training run would use for this row (torchtitan's rows convert with their own
    converter; their backend object is only asked for post_optimizer_step, which rowwise/none skip)."""
    cfg = Fp8Config(backend=variant.backend, emulate=emulate, fsdp_float8_all_gather=fp8_all_gather)
    if variant.backend == "torchao":
        cfg.torchao_recipe = variant.recipe
    elif variant.backend == "te":
        cfg.te_recipe = variant.recipe
    if variant.torchtitan:
        cfg.fsdp_float8_all_gather = False  # torchtitan 0.3 no longer all-gathers in FP8
    cfg.validate()
    return cfg


def _measure(
    build,
    fp8,
    model_cfg,
    parallel_cfg: ParallelConfig,
    info: DistInfo,
    *,
    seq_len: int,
    micro_batch_size: int,
    steps: int,
    warmup_steps: int,
    seed: int,
    loss_chunk_tokens: int = 0,
    profile: Path | None = None,
) -> tuple[float, torch.Tensor, float]:
    """Build the model (``build``: train.build_model, or torchtitan's), warm up, and return (seconds for the
    timed steps, last loss, seconds from the build to the end of the warm-up: the compile is in there). The
    step is the training loop's: forward/backward, clip the gradient norm, AdamW. No data loader and no
    checkpoints: random tokens, one micro-batch per step."""
    began = time.perf_counter()
    model = build()
    optimizer = build_optimizer(model, OptimConfig(lr=1e-4, warmup_steps=0))
    max_grad_norm = OptimConfig().max_grad_norm
    tokens = torch.randint(
        0,
        model_cfg.vocab_size,
        (micro_batch_size, seq_len + 1),
        generator=torch.Generator().manual_seed(seed),
    ).to(info.device)
    micro_batches = [(tokens[:, :-1].contiguous(), tokens[:, 1:].contiguous())]

    def step() -> torch.Tensor:
        loss = forward_backward(model, fp8, micro_batches, 1, loss_chunk_tokens=loss_chunk_tokens)
        clip_grad_norm_(model, max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        fp8.post_optimizer_step(model)
        return loss.detach()

    for _ in range(warmup_steps):
        step()
    if info.device.type == "cuda":
        torch.cuda.synchronize(info.device)
    warmup_s = time.perf_counter() - began
    if profile is not None:
        _profile(step, profile)
    return (*_timed(step, steps, info.device), warmup_s)


def _profile(step, path: Path) -> None:
    """Three steps under torch.profiler: the kernels by total device time to PATH.txt, the trace to
    PATH.json (open in Perfetto or chrome://tracing)."""
    from torch.profiler import ProfilerActivity, profile

    activities = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
    with profile(activities=activities) as prof:
        for _ in range(3):
            step()
        if torch.cuda.is_available():
            torch.cuda.synchronize()
    sort_by = "cuda_time_total" if torch.cuda.is_available() else "cpu_time_total"
    Path(f"{path}.txt").write_text(prof.key_averages().table(sort_by=sort_by, row_limit=40, max_name_column_width=90))
    prof.export_chrome_trace(f"{path}.json")


def _timed(step, steps: int, device: torch.device) -> tuple[float, torch.Tensor]:
    """Seconds for ``steps`` calls of ``step``: CUDA events around the queued work on a GPU (host timing
    would stop before the GPU finished), perf_counter on a CPU."""
    if device.type == "cuda":
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize(device)
        start.record()
        for _ in range(steps):
            loss = step()
        end.record()
        torch.cuda.synchronize(device)
        return start.elapsed_time(end) / 1000, loss.cpu()
    began = time.perf_counter()
    for _ in range(steps):
        loss = step()
    return time.perf_counter() - began, loss


def _reset_peak_memory(device: torch.device) -> None:
    if device.type == "cuda":
        torch.cuda.reset_peak_memory_stats(device)


def _peak_memory_gib(device: torch.device) -> float:
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / GIB
    # ru_maxrss is KiB on Linux; it cannot be reset, so on a CPU it is the process peak so far
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / GIB

