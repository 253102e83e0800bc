"""Cold against warm torch.compile for a restart, on the CPU, side by side in one run (docs/benchmarks.md).

Each measurement is a fresh `python -m training` process (one rank, torch.compile on, one step) with its own
empty Inductor cache directory (TORCHINDUCTOR_CACHE_DIR), so nothing is warm but what training/compile_cache.py
brings:

- cold: an empty checkpoint directory: it compiles cold and snapshots its Inductor directory after its first step;
- warm: another checkpoint directory holding a copy of the cold run's compile-cache/ (what a restart's spare finds
  on FSx): it restores the snapshot into its empty Inductor directory and compiles warm.

The compile time is the first step's "compiled" phase less its "checkpoint_loaded" phase (the trainer's own
timeline: the first forward and backward, where torch.compile compiles), the restore included. A third figure,
eager, is the same first step without torch.compile: the forward and backward themselves, which no cache removes.
Runs alternate eager, cold, warm, eager, cold, warm...

    PYTHONPATH=. python3 benchmarks/scripts/compile_cache_bench.py --preset 125m --repeats 2 --json out.json
"""

from __future__ import annotations

import argparse
import datetime
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]


def phase_seconds(phases: dict[str, str], start: str, end: str) -> float:
    def parse(text: str) -> datetime.datetime:
        return datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    return (parse(phases[end]) - parse(phases[start])).total_seconds()


def run_once(workdir: Path, checkpoint_dir: Path, args: argparse.Namespace, *,
             compile_on: bool = True) -> dict[str, object]:
    inductor = Path(tempfile.mkdtemp(dir=workdir, prefix="inductor-"))
    overrides = [f"model.preset={args.preset}", f"parallel.compile={str(compile_on).lower()}", "run.steps=1",
                 f"run.seq_len={args.seq_len}", "run.micro_batch_size=1", "run.grad_accum_steps=1",
                 f"checkpoint.dir={checkpoint_dir}", "checkpoint.interval_steps=1000"]
    cmd = [sys.executable, "-m", "training", "--config", "training/configs/tiny-cpu.toml", "--resume", "none"]
    for item in overrides:
        cmd += ["--set", item]
    env = {**os.environ, "PYTHONPATH": str(REPO), "TORCHINDUCTOR_CACHE_DIR": str(inductor), "PYTHONUNBUFFERED": "1"}
    done = subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=3600)
    if done.returncode != 0:
        raise SystemExit(f"{' '.join(cmd)} exited {done.returncode}:\n{done.stderr[-3000:]}")
    resume = next(json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"event": "resume"'))
    step = next(json.loads(line) for line in done.stdout.splitlines() if line.startswith('{"event": "step"'))
    phases = {**resume["phases"], **step["phases"]}
    return {"compile_s": round(phase_seconds(phases, "checkpoint_loaded", "compiled"), 2), "inductor": str(inductor),
            "restored_cache": "compile cache restored from" in done.stderr,
            "saved_cache": "compile cache saved to" in done.stderr}


def main() -> None:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--preset", default="125m")
    parser.add_argument("--seq-len", type=int, default=256)
    parser.add_argument("--repeats", type=int, default=2)
    parser.add_argument("--json", type=Path, default=None)
    args = parser.parse_args()
    import torch

    eager, cold, warm = [], [], []
    with tempfile.TemporaryDirectory() as tmp:
        workdir = Path(tmp)
        for i in range(args.repeats):
            eager.append(run_once(workdir, workdir / f"eager-{i}", args, compile_on=False))
            first = workdir / f"cold-{i}"
            cold.append(run_once(workdir, first, args))
            second = workdir / f"warm-{i}"
            second.mkdir()
            shutil.copytree(first / "compile-cache", second / "compile-cache")
            warm.append(run_once(workdir, second, args))
    result = {
        "date": datetime.date.today().isoformat(), "preset": args.preset, "seq_len": args.seq_len,
        "torch": torch.__version__, "python": platform.python_version(), "machine": platform.machine(),
        "cpus": os.cpu_count(), "load_average": os.getloadavg(), "eager": eager, "cold": cold, "warm": warm,
        "eager_median_s": round(statistics.median(r["compile_s"] for r in eager), 2),
        "cold_median_s": round(statistics.median(r["compile_s"] for r in cold), 2),
        "warm_median_s": round(statistics.median(r["compile_s"] for r in warm), 2),
    }
    result["warm_over_cold"] = round(result["warm_median_s"] / result["cold_median_s"], 3)
    text = json.dumps(result, indent=2)
    print(text)
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text + "\n")


if __name__ == "__main__":
    main()
