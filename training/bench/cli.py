"""The command line of ``python -m training.bench``: its flags (``build_parser``) and the run (``main``): the
defaults for a GPU or a CPU, the header of the report, one ``measure.run_backend`` per row, the table, the JSON
and the exit code (0; 1 when a row failed; 2 for a bad flag or more than one rank)."""

from __future__ import annotations

import argparse
import json
import sys
import time
from dataclasses import asdict, replace
from pathlib import Path

from training.bench.measure import run_backend
from training.bench.report import format_number, format_table, software_versions
from training.bench.variants import add_torchtitan_ratios, expand_variants
from training.config.parallel import ParallelConfig
from training.config.sections import BACKENDS, TE_RECIPES, TORCHAO_RECIPES
from training.errors import ConfigError
from training.hardware import device_name, peak_bf16_tflops_per_gpu
from training.model import (
    MODEL_PRESETS,
    SDPA_PRIORITIES,
    build_model_config,
    count_params,
    flops_per_token,
    set_sdpa_priority,
)
from training.parallel.process_group import destroy_distributed, init_distributed


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
        "--torchtitan-only",
        action="store_true",
        help="train only torchtitan's rows of --compare-torchtitan (ours measured in another run: "
        "benchmarks/scripts/h100_check.sh compares the two JSON files)",
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
    parser.add_argument(
        "--json", type=Path, metavar="PATH",
        help="also write the results as JSON to PATH (after every row: a run stopped early keeps its rows)",
    )
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
        compare_torchtitan=args.compare_torchtitan or args.torchtitan_only,
    )
    if args.torchtitan_only:
        variants = [v for v in variants if v.torchtitan]
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
            print(f"bench: {r.backend}: {r.status} {format_number(r.tokens_per_s, '.1f')} tokens/s "
                  f"{format_number(r.mfu and 100 * r.mfu, '.1f', '%')} MFU {r.reason}",
                  file=sys.stderr, flush=True)
            if args.json:  # after every row: a run killed at a time limit keeps the rows it finished
                _write_json(args.json, header, variants[: len(results)], results)
    finally:
        destroy_distributed()
    header["versions"] = software_versions()
    add_torchtitan_ratios(variants, results)
    print(format_table(header, results))
    if args.json:
        _write_json(args.json, header, variants, results)
    return 1 if any(r.status == "failed" for r in results) else 0


def _write_json(path: Path, header: dict, variants: list, results: list) -> None:
    """The record so far: the header with the versions imported by now, and each row measured."""
    header["versions"] = software_versions()
    add_torchtitan_ratios(variants, results)
    path.write_text(json.dumps({**header, "results": [asdict(r) for r in results]}, indent=2) + "\n")


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

