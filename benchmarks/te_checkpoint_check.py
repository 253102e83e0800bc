"""FP8 checkpoint and resume check on a GPU, for what the CPU tests cannot run (Transformer Engine, torchao's
real FP8 kernels): one PASS / FAIL / SKIP / INCONCLUSIVE line per check, exit status 1 if any FAIL.

    python benchmarks/te_checkpoint_check.py                 # every combination, all visible GPUs (<= 8)
    python benchmarks/te_checkpoint_check.py --only te --nproc 2
    python benchmarks/te_checkpoint_check.py --cpu        # the harness itself, on 2 CPU ranks (torchao emulated)

Each combination (none; torchao tensorwise with and without FP8 all-gather, rowwise; te delayed and current,
each with and without activation checkpointing) trains the tiny preset in bf16 on synthetic data with
``python -m training`` under torchrun:

1. a straight run of --steps steps with asynchronous checkpoints every 3 steps and a blocking final one;
2. a run resumed from the straight run's step-3 (an asynchronous checkpoint) to the end.

resume: PASS when the resumed run's losses and gradient norms equal the straight run's bit for bit and its
final checkpoint equals the straight run's tensor for tensor (TE's extra state byte for byte). Otherwise the
first resumed step decides first: its loss comes from the loaded weights (and, for TE's delayed scaling, the
loaded FP8 scales) through forward kernels that are deterministic, so it must equal the straight run's
(FAIL if not: the load lost state). Later steps may drift on a GPU even without a resume (attention backward
kernels accumulate with atomics), so a second straight run decides: if it differs from the first too, the
verdict is INCONCLUSIVE with both differences (a resume drift no larger than the run-to-run drift is no sign
of lost state); if two straight runs are bit-exact, the resume lost state (FAIL).
te-ac: for TE with activation checkpointing, the losses against the same recipe without it: activation
checkpointing through te.checkpoint recomputes under the same FP8 recipe, so they should agree (PASS when
bit-exact or within 1e-3 relative, with the figure).

Record the output in docs/benchmarks.md; once a TE combination passes, add it to training/fp8.py's
TE_VERIFIED_ON_GPU so the start-up log stops naming it. Needs the repository root as the working directory
or on PYTHONPATH; writes only under a temporary directory.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import os
import shutil
import subprocess
import sys
import tempfile
from dataclasses import dataclass
from pathlib import Path

REPO = Path(__file__).resolve().parents[1]
SHAPE = ["run.seq_len=128", "run.micro_batch_size=8", "run.grad_accum_steps=1", "run.log_interval_steps=1",
         "parallel.param_dtype=bfloat16", "parallel.reduce_dtype=float32", "metrics.nvml=false"]
# warmup longer than the run: a step's learning rate does not depend on run.steps
SCHEDULE = ["optim.lr=3e-3", "optim.warmup_steps=1000", "optim.min_lr=3e-3"]
COMBINATIONS: dict[str, list[str]] = {
    "none": ["fp8.backend=none"],
    "torchao-tensorwise-fp8-all-gather": ["fp8.backend=torchao", "fp8.torchao_recipe=tensorwise",
                                          "fp8.fsdp_float8_all_gather=true"],
    "torchao-tensorwise": ["fp8.backend=torchao", "fp8.torchao_recipe=tensorwise",
                           "fp8.fsdp_float8_all_gather=false"],
    "torchao-rowwise": ["fp8.backend=torchao", "fp8.torchao_recipe=rowwise", "fp8.fsdp_float8_all_gather=false"],
    "te-delayed": ["fp8.backend=te", "fp8.te_recipe=delayed"],
    "te-current": ["fp8.backend=te", "fp8.te_recipe=current"],
    "te-delayed-ac": ["fp8.backend=te", "fp8.te_recipe=delayed", "parallel.activation_checkpointing=true"],
    "te-current-ac": ["fp8.backend=te", "fp8.te_recipe=current", "parallel.activation_checkpointing=true"],
}
AC_TOLERANCE = 1e-3


@dataclass
class Run:
    returncode: int
    output: str
    steps: dict[int, dict]


def main() -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--nproc", type=int, default=0, help="ranks (GPUs); default: all visible, at most 8")
    parser.add_argument("--steps", type=int, default=12, help="steps of each run (>= 6)")
    parser.add_argument("--only", default="", help="comma-separated name prefixes, e.g. te,torchao")
    parser.add_argument("--keep", action="store_true", help="keep the checkpoints (the directory is printed)")
    parser.add_argument("--cpu", action="store_true",
                        help="run the none and torchao combinations on 2 CPU ranks (torchao emulated, float32): "
                        "checks this script, not a GPU")
    args = parser.parse_args()

    import torch

    extra: list[str] = []
    if args.cpu:
        nproc, extra = 2, ["parallel.param_dtype=float32", "run.seq_len=32", "run.micro_batch_size=4"]
        names = [n for n in COMBINATIONS if not n.startswith("te")]
        COMBINATIONS.update({n: COMBINATIONS[n] + ["fp8.emulate=true"] for n in names if n.startswith("torchao")})
        os.environ["OMP_NUM_THREADS"] = "1"
    elif not torch.cuda.is_available():
        print("SKIP all: no CUDA GPU (the CPU tests cover none and torchao in emulate mode; --cpu checks this "
              "script)")
        return 0
    else:
        nproc = args.nproc or min(torch.cuda.device_count(), 8)
        names = list(COMBINATIONS)
    names = [n for n in names if not args.only or any(n.startswith(p) for p in args.only.split(","))]
    work = Path(tempfile.mkdtemp(prefix="fp8-resume-check-"))
    device = "cpu" if args.cpu else torch.cuda.get_device_name()
    print(f"device {device} x {nproc}, torch {torch.__version__}, {_versions()}, work dir {work}")
    results: list[str] = []
    straight_losses: dict[str, dict[int, float]] = {}
    for name in names:
        skip = _skip_reason(name)
        if skip:
            results.append(_line("SKIP", f"{name} resume", skip))
            continue
        line, losses = check_resume(name, COMBINATIONS[name] + extra, work / name, nproc, args.steps)
        results.append(line)
        if losses:
            straight_losses[name] = losses
    for name in names:
        if name.endswith("-ac") and name in straight_losses and name[:-3] in straight_losses:
            results.append(check_ac(name, straight_losses[name], straight_losses[name[:-3]]))
    if not args.keep:
        shutil.rmtree(work, ignore_errors=True)
    failed = sum(line.startswith("FAIL") for line in results)
    print(f"summary: {len(results)} checks, {failed} failed")
    return 1 if failed else 0


def check_resume(name: str, overrides: list[str], root: Path, nproc: int,
                 steps: int) -> tuple[str, dict[int, float] | None]:
    common = SHAPE + SCHEDULE + overrides + [f"run.steps={steps}", "checkpoint.interval_steps=3",
                                             "checkpoint.keep_last=100", "checkpoint.async_save=true"]
    straight = torchrun(common + [f"checkpoint.dir={root / 'straight'}"], nproc, resume="none")
    if straight.returncode != 0:
        return _line("FAIL", f"{name} resume", f"the straight run failed:\n{_tail(straight.output)}"), None
    resumed_root = root / "resumed"
    resumed_root.mkdir(parents=True)
    shutil.copytree(root / "straight" / "step-3", resumed_root / "step-3")
    resumed = torchrun(common + [f"checkpoint.dir={resumed_root}"], nproc, resume="auto")
    losses = {s: r["loss"] for s, r in straight.steps.items()}
    if resumed.returncode != 0:
        return _line("FAIL", f"{name} resume", f"the resumed run failed:\n{_tail(resumed.output)}"), losses
    if "resumed from" not in resumed.output:
        return _line("FAIL", f"{name} resume", "the resumed run did not load step-3"), losses
    diff = _step_diff(straight.steps, resumed.steps)
    tensors = _checkpoint_diff(root / "straight" / f"step-{steps}", resumed_root / f"step-{steps}")
    if diff == 0 and not tensors:
        return _line("PASS", f"{name} resume",
                     f"steps 4-{steps} bit-exact (losses, grad norms), final checkpoint identical"), losses
    detail = f"resumed vs straight: max |diff| {diff:.3g}, {len(tensors)} checkpoint entries differ {tensors[:3]}"
    first = min(resumed.steps)
    if resumed.steps[first]["loss"] != straight.steps[first]["loss"]:
        return _line("FAIL", f"{name} resume", f"the first resumed step ({first}) differs: {detail}"), losses
    again = torchrun(common + [f"checkpoint.dir={root / 'again'}"], nproc, resume="none")
    baseline = _step_diff(straight.steps, again.steps)
    if baseline:
        return _line("INCONCLUSIVE", f"{name} resume",
                     f"first resumed step ({first}) bit-exact; {detail}; two straight runs differ by "
                     f"{baseline:.3g} (the GPU run is not deterministic)"), losses
    return _line("FAIL", f"{name} resume", f"{detail}; two straight runs are bit-exact"), losses


def check_ac(name: str, with_ac: dict[int, float], without: dict[int, float]) -> str:
    worst = max(abs(with_ac[s] - without[s]) / abs(without[s]) for s in without)
    if worst == 0:
        return _line("PASS", f"{name} te-ac", "losses bit-exact with the run without activation checkpointing")
    verdict = "PASS" if worst <= AC_TOLERANCE else "FAIL"
    return _line(verdict, f"{name} te-ac", f"losses within {worst:.3g} (relative) of the run without it")


def torchrun(overrides: list[str], nproc: int, *, resume: str) -> Run:
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={nproc}",
           "-m", "training", "--resume", resume]
    for override in overrides:
        cmd += ["--set", override]
    env = {**os.environ, "PYTHONPATH": f"{REPO}{os.pathsep}{os.environ.get('PYTHONPATH', '')}",
           "PYTHONUNBUFFERED": "1", "CUBLAS_WORKSPACE_CONFIG": ":4096:8"}
    proc = subprocess.run(cmd, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=900)
    steps = {}
    for line in proc.stdout.splitlines():
        if line.startswith("{") and '"event": "step"' in line:
            record = json.loads(line)
            steps[record["step"]] = record
    return Run(proc.returncode, proc.stdout, steps)


def _step_diff(a: dict[int, dict], b: dict[int, dict]) -> float:
    """Largest |difference| of loss or grad norm over the steps both logged (inf if one is missing)."""
    common = a.keys() & b.keys()
    if not common:
        return float("inf")
    return max(abs(a[s][k] - b[s][k]) if a[s][k] is not None and b[s][k] is not None else float("inf")
               for s in common for k in ("loss", "grad_norm"))


def _checkpoint_diff(a: Path, b: Path) -> list[str]:
    """Keys whose values differ between two checkpoints (bytes values compared byte for byte)."""
    import torch
    from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

    from training.checkpoint.state import iter_leaves

    with tempfile.TemporaryDirectory() as tmp:
        flat = []
        for path in (a, b):
            out = Path(tmp) / f"{path.parent.name}.pt"
            dcp_to_torch_save(path, out)
            flat.append(dict(iter_leaves(torch.load(out, weights_only=False))))
    left, right = flat
    differ = sorted(left.keys() ^ right.keys())
    for key in left.keys() & right.keys():
        x, y = left[key], right[key]
        same = torch.equal(x, y) if isinstance(x, torch.Tensor) and isinstance(y, torch.Tensor) else x == y
        if not same:
            differ.append(key)
    return differ


def _skip_reason(name: str) -> str:
    if name.startswith("te") and importlib.util.find_spec("transformer_engine") is None:
        return "Transformer Engine not installed (pip install --no-build-isolation 'transformer_engine[pytorch]>=2.16')"
    if name.startswith("torchao") and importlib.util.find_spec("torchao") is None:
        return "torchao not installed"
    return ""


def _versions() -> str:
    found = []
    for module in ("transformer_engine", "torchao"):
        try:
            found.append(f"{module} {__import__(module).__version__}")
        except Exception:  # not installed, or not importable here (a TE built against another torch)
            found.append(f"{module} -")
    return ", ".join(found)


def _line(verdict: str, check: str, detail: str) -> str:
    line = f"{verdict} {check}: {detail}"
    print(line, flush=True)
    return line


def _tail(text: str, lines: int = 30) -> str:
    return "\n".join(text.splitlines()[-lines:])


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    sys.exit(main())
