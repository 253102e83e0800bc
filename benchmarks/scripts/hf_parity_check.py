"""Part 5a of benchmarks/scripts/h100_check.sh: the trainer started from Hugging Face weights computes what
transformers computes, on this machine's device.

    python3 benchmarks/scripts/hf_parity_check.py --work DIR --json OUT/5a-hf-parity.json

A small random Llama 3.1-style model (grouped-query attention, rope_scaling "llama3") is written with
transformers' save_pretrained in several safetensors files with their index. `python -m training` starts from
it (`--set init.hf_dir=DIR`, float32, one step on the default config's synthetic data) and logs the loss of its
first step: the loss of the imported weights on the first batch, before any update. transformers computes the
same cross-entropy from its logits on the same batch (training.data.batches's own batch source, same config), on the
same device. Equal losses (within float32 rounding) mean equal logits up to what a mean can hide; this is the
import's end-to-end check on a GPU, the CPU tests (tests/training) compare the logits themselves.

Status "skipped: not available" when the trainer has no [init] hf_dir, "skipped: transformers not importable"
without transformers (the GPU image has it; on the nodes it is never installed).
"""

from __future__ import annotations

import argparse
import dataclasses
import json
import subprocess
import sys
import time
from pathlib import Path

import torch

from training.config import TrainConfig, load_config
from training.data.batches import build_batch_source

REPO = Path(__file__).resolve().parents[2]
SHAPE = dict(vocab_size=320, hidden_size=64, intermediate_size=192, num_hidden_layers=2, num_attention_heads=4,
             num_key_value_heads=2, rms_norm_eps=1e-5, rope_theta=500000.0, max_position_embeddings=2048,
             rope_scaling={"rope_type": "llama3", "factor": 8.0, "low_freq_factor": 1.0, "high_freq_factor": 4.0,
                           "original_max_position_embeddings": 1024}, tie_word_embeddings=False,
             # weights 10x transformers' default spread: logits far from uniform, so a loss near ln(vocab) (a
             # model that kept its random init, or lost a weight on the way) cannot pass for the imported one
             initializer_range=0.2)
# float32 on both sides; the two implementations sum in different orders (fused attention, RoPE), so a few
# float32 ulps of the logits, averaged by the mean: far below what a wrong weight or a transposed one gives
TOLERANCE = 1e-4


def available() -> str | None:
    """None when the check can run, else why not."""
    init = {f.name: f for f in dataclasses.fields(TrainConfig)}.get("init")
    if init is None or "hf_dir" not in {f.name for f in dataclasses.fields(init.default_factory())}:
        return "skipped: not available (the trainer has no [init] hf_dir)"
    try:
        import transformers  # noqa: F401
    except ImportError:
        return "skipped: transformers not importable"
    return None


def write_model(directory: Path, seed: int = 0) -> None:
    from transformers import LlamaConfig, LlamaForCausalLM

    torch.manual_seed(seed)
    model = LlamaForCausalLM(LlamaConfig(**SHAPE))
    model.save_pretrained(directory, max_shard_size="200KB", safe_serialization=True)


def trainer_first_loss(hf_dir: Path, overrides: list[str], timeout_s: float) -> tuple[float, str]:
    argv = [sys.executable, "-m", "training", *sum((["--set", o] for o in overrides), []),
            "--set", f"init.hf_dir={hf_dir}", "--resume", "none"]
    done = subprocess.run(argv, capture_output=True, text=True, timeout=timeout_s, cwd=REPO)
    steps = [json.loads(line) for line in done.stdout.splitlines() if line.startswith("{")]
    first = next((r for r in steps if r.get("event") == "step" and r.get("step") == 1), None)
    if done.returncode != 0 or first is None:
        tail = " | ".join(done.stderr.strip().splitlines()[-3:])
        raise RuntimeError(f"python -m training exited {done.returncode}: {tail}")
    return first["loss"], done.stderr


def transformers_loss(hf_dir: Path, overrides: list[str], device: torch.device) -> float:
    from transformers import LlamaForCausalLM

    cfg = load_config(None, overrides)
    source = build_batch_source(cfg.data, seq_len=cfg.run.seq_len, vocab_size=SHAPE["vocab_size"], seed=cfg.run.seed,
                                dp_rank=0, dp_world_size=1, micro_batch_size=cfg.run.micro_batch_size,
                                grad_accum_steps=1)
    inputs, targets = source.get(0, 0)  # the first step's only micro-batch
    model = LlamaForCausalLM.from_pretrained(hf_dir, dtype=torch.float32).to(device).eval()
    with torch.no_grad():
        logits = model(inputs.to(device)).logits
    return float(torch.nn.functional.cross_entropy(logits.float().flatten(0, 1), targets.to(device).flatten()))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description="Trainer vs transformers on imported Hugging Face weights.")
    parser.add_argument("--work", type=Path, required=True)
    parser.add_argument("--json", type=Path, required=True)
    parser.add_argument("--timeout-s", type=float, default=120.0, help="for the trainer's run")
    args = parser.parse_args(argv)
    device = torch.device("cuda" if torch.cuda.is_available() else "cpu")
    result: dict = {"part": "hf-parity", "device": str(device), "tolerance": TOLERANCE}
    reason = available()
    if reason is not None:
        result["status"] = reason
    else:
        overrides = ["model.preset=", "run.steps=1", "run.log_interval_steps=1", "parallel.param_dtype=float32",
                     "parallel.reduce_dtype=float32", "metrics.nvml=false"]
        began = time.monotonic()
        try:
            hf_dir = args.work / "hf-model"
            write_model(hf_dir)
            result["hf_files"] = sorted(p.name for p in hf_dir.iterdir())
            trainer, log = trainer_first_loss(hf_dir, overrides, args.timeout_s)
            reference = transformers_loss(hf_dir, overrides, device)
            diff = abs(trainer - reference)
            result.update(trainer_loss=trainer, transformers_loss=reference, abs_diff=diff,
                          seconds=time.monotonic() - began)
            result["status"] = "ok" if diff <= TOLERANCE else (
                f"failed: the trainer's first loss {trainer:.7g} differs from transformers' {reference:.7g} "
                f"by {diff:.3g} > {TOLERANCE}")
        except Exception as e:  # the JSON is the record
            result["status"] = f"failed: {type(e).__name__}: {' '.join(str(e).split())[:400]}"
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"hf-parity: {result['status']}")
    return 0 if result["status"] == "ok" or result["status"].startswith("skipped") else 1


if __name__ == "__main__":
    sys.exit(main())
