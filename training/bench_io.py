"""``python -m training.bench_io``: the two costs beside the GPU step that decide whether the GPU waits.

``loader``: tokens/s the shard loader delivers to the device with the training loop's own pieces (token
shards on disk read through numpy memmap -> ShardBatchSource's sample order -> Prefetcher's background thread
-> pinned memory -> non-blocking copy), with nothing else running. Compare it with the tokens/s the GPU
consumes (``--gpu-tokens-per-s``, from ``python -m training.bench``): the loader should deliver >= 10x, so
that it stays hidden behind the step even on a busy host. The shards are written first with random tokens
(``--tokens``), or an existing directory is read (``--data``). The page cache is not dropped: on FSx the
first epoch is slower (docs/benchmarks.md says how it was measured).

``checkpoint``: for the preset's model and AdamW state after one step, the time a periodic async save blocks
the training loop (``Checkpointer.save(blocking=False)`` until it returns), the time until its copy of the
state in CPU memory is complete (``wait_for_staging``: the loop waits for it before its next optimizer step,
so in training only what exceeds the next forward and backward holds the loop; here nothing runs between),
the time until that save is complete on disk, and the time a blocking save takes (the SIGTERM path, which
must fit torchrun's shutdown window). ``phases_s`` breaks the async saves down: ``build_state`` (the state
dict, on the loop), ``describe`` (each tensor's fingerprint), ``copy`` (into CPU memory), ``verify`` (the
planner's check of the copy, on DCP's thread). ``--staging`` picks ``checkpoint.staging``: ``auto``
(background, pinned on CUDA), ``pinned``, ``pageable``, or ``inline`` (DCP's default: the copy and the
fingerprints inside the save call; run it for the before/after on one machine). The first async save also
allocates (and pins) the staging buffers that later saves reuse: ``all`` lists each save. The target
directory decides the write speed: measure on the file system the cluster will use.
"""

from __future__ import annotations

import argparse
import json
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import torch

from training.checkpoint.checkpointer import CheckpointConfig, Checkpointer, SaveTimings
from training.checkpoint.layout import is_complete, step_dir
from training.config.parallel import ParallelConfig
from training.config.sections import STAGING_MODES
from training.data.batches import DataConfig, Prefetcher, build_batch_source
from training.data.shards import ShardWriter
from training.errors import ConfigError
from training.fp8 import NoFp8
from training.model import MODEL_PRESETS, build_model_config, count_params
from training.optim import OptimConfig, build_optimizer
from training.parallel.process_group import destroy_distributed, init_distributed

GIB = 1024**3


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training.bench_io",
        description="Loader throughput and checkpoint cost, measured with the training loop's own code.",
    )
    sub = parser.add_subparsers(dest="command", required=True)
    loader = sub.add_parser("loader", help="tokens/s the shard loader delivers to the device")
    loader.add_argument("--data", type=Path, help="an existing shard directory (default: write random shards)")
    loader.add_argument("--tokens", type=int, default=500_000_000, help="tokens of random shards to write")
    loader.add_argument("--vocab-size", type=int, default=128256, help="vocabulary of the random shards")
    loader.add_argument("--seq-len", type=int, default=4096)
    loader.add_argument("--micro-batch-size", type=int, default=2)
    loader.add_argument("--steps", type=int, default=2000, help="steps to time")
    loader.add_argument("--gpu-tokens-per-s", type=float, help="what one GPU consumes, for the ratio")
    loader.add_argument("--workdir", type=Path, help="where random shards are written (default: a temp dir)")
    loader.add_argument("--json", type=Path, metavar="PATH")
    ckpt = sub.add_parser(
        "checkpoint",
        help="how long saves hold the loop, stage and take to complete, phase by phase",
        description="How long an async save holds the loop, until its copy in CPU memory is complete and "
                    "until it is complete on disk, with each phase (build_state, describe, copy, verify), and "
                    "how long a blocking (SIGTERM) save takes. JSON on stdout, a summary on stderr.",
    )
    ckpt.add_argument("--preset", choices=list(MODEL_PRESETS), default="1b")
    ckpt.add_argument("--dir", type=Path, required=True, help="checkpoint root to write to (emptied first)")
    ckpt.add_argument("--repeats", type=int, default=3, help="saves of each kind")
    ckpt.add_argument("--staging", choices=STAGING_MODES, default="auto",
                      help="checkpoint.staging for the async saves (default: auto; inline = DCP's default, "
                           "the copy inside the save call)")
    ckpt.add_argument("--json", type=Path, metavar="PATH")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        result = run_loader(args) if args.command == "loader" else run_checkpoint(args)
    except ConfigError as exc:
        print(f"error: {exc}", file=sys.stderr)
        return 2
    print(json.dumps(result, indent=2))
    if result["benchmark"] == "checkpoint":
        print(checkpoint_summary(result), file=sys.stderr)
    if args.json:
        args.json.write_text(json.dumps(result, indent=2) + "\n")
    return 0


def write_random_shards(out_dir: Path, *, tokens: int, vocab_size: int, seed: int = 0) -> None:
    """``tokens`` random ids in documents of 2048-8192 tokens, through the real ShardWriter."""
    rng = np.random.default_rng(seed)
    writer = ShardWriter(
        out_dir, vocab_size=vocab_size, eos_id=vocab_size - 1, tokenizer={"name": "random"},
        shard_size_tokens=100_000_000,
    )
    written = 0
    while written < tokens:
        length = int(rng.integers(2048, 8193))
        writer.add_document(rng.integers(0, vocab_size - 1, size=length, dtype=np.int64))
        written += length + 1
    writer.finish()


def run_loader(args: argparse.Namespace) -> dict:
    for name in ("tokens", "vocab_size", "seq_len", "micro_batch_size", "steps"):
        if getattr(args, name) < 1:
            raise ConfigError(f"--{name.replace('_', '-')}={getattr(args, name)}: allowed: an integer >= 1")
    device = torch.device("cuda") if torch.cuda.is_available() else torch.device("cpu")
    workdir = None
    data = args.data
    write_s = None
    if data is None:
        workdir = Path(tempfile.mkdtemp(prefix="bench-io-", dir=args.workdir))
        data = workdir / "shards"
        data.mkdir()
        began = time.perf_counter()
        write_random_shards(data, tokens=args.tokens, vocab_size=args.vocab_size)
        write_s = time.perf_counter() - began
    try:
        source = build_batch_source(
            DataConfig(source="shards", path=str(data)), seq_len=args.seq_len, vocab_size=args.vocab_size,
            seed=0, dp_rank=0, dp_world_size=1, micro_batch_size=args.micro_batch_size, grad_accum_steps=1,
        )
        tokens_per_step = args.seq_len * args.micro_batch_size
        with Prefetcher(source, start_step=0, grad_accum_steps=1, device=device) as prefetcher:
            for _ in range(10):  # thread start, first pinned allocations
                prefetcher.next_step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            began = time.perf_counter()
            for _ in range(args.steps):
                batch = prefetcher.next_step()
            if device.type == "cuda":
                torch.cuda.synchronize()
            elapsed = time.perf_counter() - began
        assert batch[0][0].shape == (args.micro_batch_size, args.seq_len)
    finally:
        if workdir is not None:
            shutil.rmtree(workdir, ignore_errors=True)
    tokens_per_s = args.steps * tokens_per_step / elapsed
    return {
        "benchmark": "loader",
        "device": str(device),
        "shard_tokens": args.tokens if args.data is None else None,
        "shard_write_s": write_s,
        "seq_len": args.seq_len,
        "micro_batch_size": args.micro_batch_size,
        "steps": args.steps,
        "loader_tokens_per_s": tokens_per_s,
        "gpu_tokens_per_s": args.gpu_tokens_per_s,
        "headroom": tokens_per_s / args.gpu_tokens_per_s if args.gpu_tokens_per_s else None,
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


def run_checkpoint(args: argparse.Namespace) -> dict:
    if args.repeats < 1:
        raise ConfigError(f"--repeats={args.repeats}: allowed: an integer >= 1")
    from training.train import build_model  # torch-heavy imports only for this subcommand

    info = init_distributed()
    try:
        on_gpu = info.device.type == "cuda"
        model_cfg = build_model_config(args.preset)
        parallel_cfg = ParallelConfig(param_dtype="bfloat16" if on_gpu else "float32")
        model = build_model(model_cfg, parallel_cfg, NoFp8(), info, seed=0)
        optimizer = build_optimizer(model, OptimConfig(lr=1e-4, warmup_steps=0))
        tokens = torch.randint(0, model_cfg.vocab_size, (1, 257), device=info.device)
        loss = torch.nn.functional.cross_entropy(model(tokens[:, :-1]).flatten(0, 1).float(), tokens[:, 1:].flatten())
        loss.backward()
        optimizer.step()  # AdamW state exists from the first step on
        state_bytes = sum(t.numel() * t.element_size() for t in _tensors(model, optimizer))

        shutil.rmtree(args.dir, ignore_errors=True)
        checkpointer = Checkpointer(
            CheckpointConfig(dir=str(args.dir), keep_last=1, staging=args.staging), rank=info.rank,
            world_size=info.world_size, config_snapshot={}, device=info.device,
        )
        blocked, staged, complete, blocking = [], [], [], []
        phases: list[SaveTimings] = []
        step = 0
        for _ in range(args.repeats):
            step += 1
            began = time.perf_counter()
            checkpointer.save(step, model, optimizer, blocking=False)
            blocked.append(time.perf_counter() - began)
            checkpointer.wait_for_staging()
            staged.append(time.perf_counter() - began)
            checkpointer.wait()
            complete.append(time.perf_counter() - began)
            assert is_complete(step_dir(args.dir, step)) and checkpointer.last_timings is not None
            phases.append(checkpointer.last_timings)
        staging_kind = phases[0].staging
        pinned = checkpointer.staging_pinned
        for _ in range(args.repeats):
            step += 1
            began = time.perf_counter()
            checkpointer.save(step, model, optimizer, blocking=True)
            blocking.append(time.perf_counter() - began)
        checkpointer.close()
    finally:
        destroy_distributed()
    return {
        "benchmark": "checkpoint",
        "device": str(info.device),
        "preset": args.preset,
        "params": count_params(model_cfg),
        "state_gib": state_bytes / GIB,
        "dir": str(args.dir),
        "torch": torch.__version__,
        "staging": {"setting": args.staging, "where": staging_kind, "pinned": pinned},
        "async_blocks_loop_s": _summary(blocked),
        "async_staged_s": _summary(staged),
        "async_until_complete_s": _summary(complete),
        "phases_s": {
            name: _summary([getattr(t, f"{name}_s") for t in phases])
            for name in ("build_state", "describe", "copy", "verify")
            if all(getattr(t, f"{name}_s") is not None for t in phases)
        },
        "blocking_save_s": _summary(blocking),
        "date": time.strftime("%Y-%m-%dT%H:%M:%S%z"),
    }


_WHERE = {"background": "on a staging thread beside the loop", "inline": "inside save()"}


def checkpoint_summary(result: dict) -> str:
    """The checkpoint result in a few lines for people (the JSON on stdout is the record)."""
    staging = result["staging"]
    pinned = {True: "pinned", False: "pageable", None: "new pageable memory each save"}[staging["pinned"]]
    lines = [
        f"checkpoint, {result['preset']} ({result['state_gib']:.2f} GiB of state) on {result['device']}, "
        f"torch {result['torch']}; async saves copy the state {_WHERE[staging['where']]} ({pinned}):",
        f"  loop held by save()        {result['async_blocks_loop_s']['median']:8.2f} s (median)",
        f"  staged copy complete after {result['async_staged_s']['median']:8.2f} s",
        f"  checkpoint complete after  {result['async_until_complete_s']['median']:8.2f} s",
    ]
    lines += [f"    {name:<24} {summary['median']:8.2f} s" for name, summary in result["phases_s"].items()]
    lines.append(f"  blocking save (SIGTERM)    {result['blocking_save_s']['median']:8.2f} s")
    return "\n".join(lines)


def _tensors(model: torch.nn.Module, optimizer: torch.optim.Optimizer):
    from torch.distributed.tensor import DTensor

    def local(t: torch.Tensor) -> torch.Tensor:
        return t.to_local() if isinstance(t, DTensor) else t

    yield from (local(p) for p in model.parameters())
    for state in optimizer.state.values():
        yield from (local(v) for v in state.values() if isinstance(v, torch.Tensor))


def _summary(values: list[float]) -> dict:
    return {"median": statistics.median(values), "min": min(values), "max": max(values), "all": values}


if __name__ == "__main__":
    sys.exit(main())
