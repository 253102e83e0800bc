"""``python -m training.bench``: tokens/s, model TFLOP/s, MFU and peak memory of full training steps
(forward + backward + gradient clipping + AdamW step, the training loop's own functions) for the FP8
backends none, torchao (each recipe) and te, on the same model and shapes in one run; with
``--compare-torchtitan`` the same rows trained by torchtitan's own Llama 3 model and float8 converter
(training.bench_torchtitan), and our tokens/s over theirs.

Each backend gets a fresh model built in the training order (meta device -> FP8 conversion -> activation
checkpointing -> compile -> FSDP2 on a one-rank mesh -> to_empty -> init_weights -> AdamW), then runs
``--warmup-steps`` untimed steps (compilation, allocator warm-up, FP8 scale history) and ``--steps`` timed
ones on random tokens, so data loading is not measured. Timing: CUDA events on a GPU, perf_counter on the
CPU. FLOPs per token follow training.model.flops_per_token (attention counted), MFU is against the GPU's
dense BF16 peak from the instance catalog, also for the FP8 backends, so the columns compare directly.
On a CPU it runs the tiny preset by default, with torchao in emulate mode (a smoke test of the path, not a
speed measurement).

Rows are named by backend and recipe: ``none``, ``torchao-tensorwise``, ``torchao-rowwise``, ``te-delayed``,
``te-current``; torchtitan's rows carry a ``titan:`` prefix.
"""

from __future__ import annotations

import argparse
import functools
import gc
import json
import math
import resource
import sys
import time
from dataclasses import asdict, dataclass, replace
from pathlib import Path

import torch

from training.bench_torchtitan import build_torchtitan_model, torchtitan_version
from training.config_sections import BACKENDS, TE_RECIPES, TORCHAO_RECIPES
from training.errors import ConfigError
from training.fp8 import Fp8Config, build_fp8_backend
from training.hardware import device_name, peak_bf16_tflops_per_gpu
from training.model import (
    MODEL_PRESETS,
    SDPA_PRIORITIES,
    build_model_config,
    count_params,
    flops_per_token,
    set_sdpa_priority,
)
from training.optim import OptimConfig, build_optimizer
from training.parallelize import (
    DistInfo,
    ParallelConfig,
    destroy_distributed,
    init_distributed,
)
from training.train import _forward_backward, build_model, clip_grad_norm_

GIB = 1024**3


@dataclass(frozen=True)
class Variant:
    """What one row trains: whose model (ours or torchtitan's), which FP8 backend, which scaling recipe."""

    backend: str  # none | torchao | te
    recipe: str = ""  # torchao: tensorwise | rowwise; te: delayed | current; none: ""
    torchtitan: bool = False

    @property
    def name(self) -> str:
        name = f"{self.backend}-{self.recipe}" if self.recipe else self.backend
        return f"titan:{name}" if self.torchtitan else name


@dataclass
class BenchResult:
    """One row."""

    backend: str  # the row name (Variant.name)
    status: str  # ok | skipped | failed
    reason: str = ""  # why it was skipped or how it failed
    tokens_per_s: float | None = None  # tokens per second through the timed steps
    tflops: float | None = None  # model TFLOP/s (flops_per_token x tokens/s)
    mfu: float | None = None  # tflops / the GPU's dense BF16 peak; None on a CPU or an unknown GPU
    step_time_ms: float | None = None  # mean wall time of one timed step
    peak_memory_gib: float | None = None  # GPU: max allocated; CPU: the process's max RSS so far
    final_loss: float | None = None  # loss of the last timed step (a sanity check of the numerics)
    vs_torchtitan: float | None = None  # our tokens/s over torchtitan's for the same backend and recipe


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training.bench",
        description="Measure training-step throughput (tokens/s, TFLOP/s, MFU) and peak memory per FP8 "
        "backend on one device. Defaults: the 1b preset at seq 4096 on a GPU, the tiny preset on a CPU.",
    )
    parser.add_argument(
        "--preset", choices=list(MODEL_PRESETS), help="model shape (default: 1b on GPU, tiny on CPU)"
    )
    parser.add_argument(
        "--layers",
        type=int,
        help="transformer blocks instead of the preset's (default: the preset's); e.g. --preset llama3-8b "
        "--layers 4 times Llama 3 8B's matmul shapes on one GPU, where the whole model does not fit",
    )
    parser.add_argument("--seq-len", type=int, help="tokens per sample (default: 4096 on GPU, 128 on CPU)")
    parser.add_argument("--micro-batch-size", type=int, help="samples per step (default: 2 on GPU, 8 on CPU)")
    parser.add_argument("--steps", type=int, default=10, help="timed steps per backend (default: 10)")
    parser.add_argument("--warmup-steps", type=int, default=3, help="untimed steps first (default: 3)")
    parser.add_argument(
        "--backends",
        default=",".join(BACKENDS),
        help="comma-separated FP8 backends (default: none,torchao,te)",
    )
    parser.add_argument(
        "--torchao-recipes",
        help="comma-separated torchao scaling recipes, one row each (default: tensorwise,rowwise on GPU, "
        "tensorwise on CPU)",
    )
    parser.add_argument(
        "--te-recipes", default="delayed", help="comma-separated TE recipes, one row each (default: delayed)"
    )
    parser.add_argument(
        "--compare-torchtitan",
        action="store_true",
        help="also train each none/torchao row with torchtitan's Llama 3 model and float8 converter (PyPI "
        "torchtitan) and report our tokens/s over theirs; says so when torchtitan is not installed",
    )
    parser.add_argument(
        "--sdpa-priority",
        choices=list(SDPA_PRIORITIES),
        default="cudnn",
        help="fused attention kernel our model prefers (default: cudnn)",
    )
    parser.add_argument(
        "--fp8-all-gather",
        choices=("auto", "on", "off"),
        default="auto",
        help="torchao tensorwise: FSDP2 all-gathers weights in FP8; auto = only with more than one rank, "
        "torchtitan's rule (default: auto)",
    )
    parser.add_argument(
        "--profile",
        type=Path,
        metavar="PATH",
        help="profile 3 steps of the first row with torch.profiler: kernel table to PATH.txt, trace to "
        "PATH.json (Chrome trace format)",
    )
    parser.add_argument(
        "--activation-checkpointing", action="store_true", help="recompute blocks in backward"
    )
    parser.add_argument("--compile", action="store_true", help="torch.compile each transformer block")
    parser.add_argument(
        "--loss-chunk-tokens",
        type=int,
        default=0,
        metavar="N",
        help="parallel.loss_chunk_tokens for our rows: 0 = cross-entropy on the full fp32 logits, N > 0 = the "
        "output head fused with the loss over chunks of N tokens (default: 0); torchtitan's rows always keep "
        "their own loss on the full logits",
    )
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results as JSON to PATH")
    parser.add_argument("--seed", type=int, default=0, help="seed of the weights and the random tokens")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        backends = _parse_backends(args.backends)
        torchao_recipes = _parse_recipes("--torchao-recipes", args.torchao_recipes, TORCHAO_RECIPES)
        te_recipes = _parse_recipes("--te-recipes", args.te_recipes, TE_RECIPES)
        if args.loss_chunk_tokens < 0:
            raise ConfigError(f"--loss-chunk-tokens={args.loss_chunk_tokens}: allowed: an integer >= 0 (0 = off)")
        for name in ("steps", "warmup_steps", "seq_len", "micro_batch_size", "layers"):
            value = getattr(args, name)
            if value is not None and value < (0 if name == "warmup_steps" else 1):
                raise ConfigError(
                    f"--{name.replace('_', '-')}={value}: allowed: an integer >= 1 (warmup: >= 0)"
                )
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    info = init_distributed()
    if info.world_size != 1:
        destroy_distributed()
        print("error: training.bench measures one device; run it without torchrun", file=sys.stderr)
        return 2
    on_gpu = info.device.type == "cuda"
    set_sdpa_priority(args.sdpa_priority)
    variants = expand_variants(
        backends,
        torchao_recipes or (["tensorwise", "rowwise"] if on_gpu else ["tensorwise"]),
        te_recipes,
        compare_torchtitan=args.compare_torchtitan,
    )
    fp8_all_gather = {"on": True, "off": False, "auto": info.world_size > 1}[args.fp8_all_gather]
    preset = args.preset or ("1b" if on_gpu else "tiny")
    seq_len = args.seq_len or (4096 if on_gpu else 128)
    micro_batch_size = args.micro_batch_size or (2 if on_gpu else 8)
    model_cfg = build_model_config(preset)
    if args.layers is not None:
        model_cfg = replace(model_cfg, n_layers=args.layers)
    # bf16 params on a GPU (the training default); float32 on a CPU, where bf16 matmuls are slow reference
    # kernels on most CPUs (see configs/tiny-cpu.toml)
    parallel_cfg = ParallelConfig(
        activation_checkpointing=args.activation_checkpointing,
        compile=args.compile,
        param_dtype="bfloat16" if on_gpu else "float32",
        loss_chunk_tokens=args.loss_chunk_tokens,
    )
    header = {
        "device": device_name(info.device),
        "preset": preset,
        "n_layers": model_cfg.n_layers,  # the preset's unless --layers
        "params": count_params(model_cfg),
        "seq_len": seq_len,
        "micro_batch_size": micro_batch_size,
        "flops_per_token": flops_per_token(model_cfg, seq_len),
        "peak_bf16_tflops": peak_bf16_tflops_per_gpu(info.device),
        "parallel": asdict(parallel_cfg),
        "sdpa_priority": args.sdpa_priority,
        "fp8_all_gather": fp8_all_gather,
        "versions": {},  # filled after the runs, when the backends' packages are imported
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }
    results = []
    try:
        for variant in variants:
            results.append(
                run_backend(
                    variant,
                    model_cfg,
                    parallel_cfg,
                    info,
                    seq_len=seq_len,
                    micro_batch_size=micro_batch_size,
                    steps=args.steps,
                    warmup_steps=args.warmup_steps,
                    seed=args.seed,
                    header=header,
                    fp8_all_gather=fp8_all_gather,
                    profile=args.profile if not results else None,
                )
            )
            r = results[-1]  # progress on stderr: a long run killed at a time limit still tells something
            print(f"bench: {r.backend}: {r.status} {_fmt(r.tokens_per_s, '.1f')} tokens/s "
                  f"{_fmt(r.mfu and 100 * r.mfu, '.1f', '%')} MFU {r.reason}", file=sys.stderr, flush=True)
    finally:
        destroy_distributed()
    header["versions"] = _versions()
    _add_torchtitan_ratios(variants, results)
    print(format_table(header, results))
    if args.json:
        args.json.write_text(json.dumps({**header, "results": [asdict(r) for r in results]}, indent=2) + "\n")
    return 1 if any(r.status == "failed" for r in results) else 0


def expand_variants(
    backends: list[str], torchao_recipes: list[str], te_recipes: list[str], *, compare_torchtitan: bool
) -> list[Variant]:
    """The rows, in order: each backend with each of its recipes, then torchtitan's none/torchao rows."""
    ours = []
    for backend in backends:
        recipes = {"torchao": torchao_recipes, "te": te_recipes}.get(backend, [""])
        ours += [Variant(backend, recipe) for recipe in recipes]
    if not compare_torchtitan:
        return ours
    # torchtitan has no TE path; its float8 converter is torchao's
    return ours + [Variant(v.backend, v.recipe, torchtitan=True) for v in ours if v.backend != "te"]


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
        elapsed_s, loss = _measure(
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
) -> tuple[float, torch.Tensor]:
    """Build the model (``build``: train.build_model, or torchtitan's), warm up, and return (seconds for the
    timed steps, last loss). The step is the training loop's: forward/backward, clip the gradient norm,
    AdamW. No data loader and no checkpoints: random tokens, one micro-batch per step."""
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
        loss = _forward_backward(model, fp8, micro_batches, 1, loss_chunk_tokens=loss_chunk_tokens)
        clip_grad_norm_(model, max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        fp8.post_optimizer_step(model)
        return loss.detach()

    for _ in range(warmup_steps):
        step()
    if profile is not None:
        _profile(step, profile)
    return _timed(step, steps, info.device)


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


def _parse_backends(text: str) -> list[str]:
    names = [name.strip() for name in text.split(",") if name.strip()]
    unknown = [name for name in names if name not in BACKENDS]
    if unknown or not names:
        raise ConfigError(f"--backends={text!r}: allowed: a comma-separated subset of {', '.join(BACKENDS)}")
    return list(dict.fromkeys(names))


def _parse_recipes(option: str, text: str | None, allowed: tuple[str, ...]) -> list[str]:
    if text is None:
        return []
    names = [name.strip() for name in text.split(",") if name.strip()]
    if not names or any(name not in allowed for name in names):
        raise ConfigError(f"{option}={text!r}: allowed: a comma-separated subset of {', '.join(allowed)}")
    return list(dict.fromkeys(names))


def _add_torchtitan_ratios(variants: list[Variant], results: list[BenchResult]) -> None:
    """Our tokens/s over torchtitan's, on our row, where both rows ran."""
    by_variant = dict(zip(variants, results, strict=True))
    for variant, result in by_variant.items():
        if variant.torchtitan:
            continue
        theirs = by_variant.get(Variant(variant.backend, variant.recipe, torchtitan=True))
        if theirs is not None and result.tokens_per_s and theirs.tokens_per_s:
            result.vs_torchtitan = result.tokens_per_s / theirs.tokens_per_s


def _versions() -> dict[str, str | None]:
    versions: dict[str, str | None] = {"python": sys.version.split()[0], "torch": torch.__version__}
    versions["cuda"] = torch.version.cuda
    versions["cudnn"] = str(torch.backends.cudnn.version()) if torch.cuda.is_available() else None
    versions["driver"] = _nvidia_driver()
    for module in ("torchao", "transformer_engine"):
        mod = sys.modules.get(module)
        versions[module] = getattr(mod, "__version__", None) if mod else None
    versions["torchtitan"] = torchtitan_version() if "torchtitan" in sys.modules else None
    return versions


def _nvidia_driver() -> str | None:
    """The driver version nvidia-smi reports, or None (no GPU, no nvidia-smi)."""
    import shutil
    import subprocess

    if not torch.cuda.is_available() or shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None


def format_table(header: dict, results: list[BenchResult]) -> str:
    """The human-readable report: one line of context, one row per backend, then the skip/fail reasons."""
    lines = [
        f"device {header['device']} | preset {header['preset']} ({header['n_layers']} layers, "
        f"{header['params'] / 1e6:.1f}M params)"
        + f" | seq {header['seq_len']} x micro-batch {header['micro_batch_size']}"
        + f" | {header['flops_per_token'] / 1e9:.3f} GFLOP/token"
        + f" | AC {'on' if header['parallel']['activation_checkpointing'] else 'off'}"
        + f" | compile {'on' if header['parallel']['compile'] else 'off'}"
        + f" | loss {_loss_label(header['parallel'].get('loss_chunk_tokens', 0))}",
        f"{'backend':<26} {'status':<8} {'tokens/s':>12} {'TFLOP/s':>9} {'MFU':>7} {'step ms':>9} "
        f"{'peak GiB':>9} {'loss':>8} {'vs titan':>9}",
    ]
    for r in results:
        lines.append(
            f"{r.backend:<26} {r.status:<8} {_fmt(r.tokens_per_s, '.1f'):>12} {_fmt(r.tflops, '.3f'):>9} "
            f"{_fmt(r.mfu and 100 * r.mfu, '.1f', '%'):>7} {_fmt(r.step_time_ms, '.1f'):>9} "
            f"{_fmt(r.peak_memory_gib, '.2f'):>9} {_fmt(r.final_loss, '.4f'):>8} "
            f"{_fmt(r.vs_torchtitan, '.3f', 'x'):>9}"
        )
    lines += [f"{r.backend}: {r.status}: {r.reason}" for r in results if r.reason]
    if header["peak_bf16_tflops"] is None:
        lines.append("MFU: not reported (no GPU peak known for this device)")
    return "\n".join(lines)


def _loss_label(loss_chunk_tokens: int) -> str:
    """How our rows compute the loss (torchtitan's rows always use the full logits)."""
    if loss_chunk_tokens > 0:
        return f"fused over {loss_chunk_tokens}-token chunks (titan: full logits)"
    return "full logits"


def _fmt(value: float | None, spec: str, suffix: str = "") -> str:
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:{spec}}{suffix}"


if __name__ == "__main__":
    sys.exit(main())
