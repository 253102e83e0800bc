"""Hugging Face import and export on the CPU: time and peak memory, side by side with safetensors alone.

    PYTHONPATH=. python3 benchmarks/scripts/hf_io_bench.py --json benchmarks/cpu-2026-11-27/hf-io.json

No download: a random Llama-shaped model (default ~500M parameters, ~1 GB in bf16) is built with the trainer's
build_model and saved as a step-0 checkpoint (fp32, DCP); ``python -m training.export`` makes the Hugging Face
directory of it (several bf16 safetensors files with their index), which the import then reads. Each
measurement is a fresh process (hf_io_measure.py), repeated ``--repeats`` times, interleaved:

- ``export``: training.export.main (the CLI's code), checkpoint -> HF directory; against ``save_file``: one
  safetensors save_file of the whole bf16 state dict, already in memory.
- ``import``: training.hf.load.load_hf_weights on ``--nproc`` CPU ranks under torchrun (gloo, FSDP2), each
  rank reading its own shards through DCP's HuggingFaceStorageReader; against ``read``: safetensors' load_file
  of every file, one process. Every rank then checks its shards against the files' rows (``weights_match``).

Seconds are of the call alone (imports and the model's build excluded; ``process_wall_s`` includes them), min
and median over the repeats. ``peak_bytes`` is the process's peak RSS during the call (hf_io_measure.py says
how), ``rss_before_bytes`` its RSS when the call began: for the import, the rank's allocated model shard (fp32)
plus torch; the difference is what the call itself added. The files are read from the page cache (just
written): disk or FSx speed is not measured. The load average at the start and end says how busy the machine
was. docs/benchmarks.md ("Hugging Face import and export") has the results and what they mean.
"""

from __future__ import annotations

import argparse
import json
import os
import platform
import shutil
import statistics
import subprocess
import sys
import tempfile
import time
from datetime import UTC, datetime
from importlib import metadata
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
MEASURE = Path(__file__).with_name("hf_io_measure.py")
# Llama-shaped, ~501M parameters: ~1.0 GB in bf16, ~2.0 GB in fp32
DEFAULT_SHAPE = dict(dim=1536, n_layers=16, n_heads=12, n_kv_heads=4, ffn_dim=4096, vocab_size=32000)
RUN_TIMEOUT_S = 1800  # one measured process; a hung collective ends the run instead of waiting forever


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(prog="hf_io_bench.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("--model", default=json.dumps(DEFAULT_SHAPE), metavar="JSON",
                        help=f"the [model] fields as a JSON object (default: {json.dumps(DEFAULT_SHAPE)})")
    parser.add_argument("--max-shard-gb", type=float, default=0.25,
                        help="largest safetensors file of the export, GB (default 0.25: several files)")
    parser.add_argument("--repeats", type=int, default=3, help="runs of each measurement (default 3)")
    parser.add_argument("--nproc", type=int, default=2, help="ranks of the import (default 2)")
    parser.add_argument("--work", type=Path, help="directory for the checkpoint and the files (default: a "
                        "temporary directory, removed at the end)")
    parser.add_argument("--json", type=Path, metavar="PATH", help="also write the results to PATH")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        shape = json.loads(args.model)
    except ValueError:
        shape = None
    for flag, value, ok, allowed in (
            ("--repeats", args.repeats, args.repeats >= 1, "an integer >= 1"),
            ("--nproc", args.nproc, args.nproc >= 1, "an integer >= 1"),
            ("--max-shard-gb", args.max_shard_gb, args.max_shard_gb > 0, "a number > 0"),
            ("--model", args.model, isinstance(shape, dict), "a JSON object of [model] fields")):
        if not ok:
            print(f"{flag}={value}: allowed: {allowed}", file=sys.stderr)
            return 2
    work = args.work or Path(tempfile.mkdtemp(prefix="hf-io-bench-"))
    work.mkdir(parents=True, exist_ok=True)
    try:
        report = run(shape, work, args)
    finally:
        if args.work is None:
            shutil.rmtree(work, ignore_errors=True)
    print(format_table(report))
    text = json.dumps(report, indent=2) + "\n"
    if args.json:
        args.json.parent.mkdir(parents=True, exist_ok=True)
        args.json.write_text(text)
    else:
        print(text)
    return 0 if report["import"]["weights_match"] else 1


def run(shape: dict, work: Path, args: argparse.Namespace) -> dict:
    load_start = os.getloadavg()
    started = datetime.now(UTC)
    ckpt, hf_dir = work / "checkpoint", work / "hf"
    _, setup = _measure("checkpoint", work, "--out", ckpt, "--model", json.dumps(shape))
    runs: dict[str, list[dict]] = {"export": [], "save_file": [], "read": [], "import": []}
    for _ in range(args.repeats):  # interleaved: a busy spell of the shared machine falls on every kind alike
        runs["export"].append(_timed(*_measure("export", work, "--checkpoint", ckpt, "--out", hf_dir,
                                               "--max-shard-gb", args.max_shard_gb)))
        runs["save_file"].append(_timed(*_measure("save-file", work, "--hf-dir", hf_dir, "--out", work / "plain")))
        runs["read"].append(_timed(*_measure("read", work, "--hf-dir", hf_dir)))
        runs["import"].append(_import(work, hf_dir, args.nproc))
    params = setup["params"]
    files = sorted(hf_dir.glob("*.safetensors"))
    model = {"shape": shape, "params": params, "bytes_bf16": 2 * params, "bytes_fp32": 4 * params,
             "hf_files": len(files), "hf_file_bytes": sum(f.stat().st_size for f in files),
             "max_shard_gb": args.max_shard_gb}
    report = {
        "benchmark": "hf-io", "date": started.isoformat(timespec="seconds"), "machine": machine(),
        "versions": versions(), "load_average": {"start": load_start, "end": os.getloadavg()},
        "repeats": args.repeats, "model": model, "setup_checkpoint_s": setup["seconds"],
        "import": _summary_import(runs["import"], args.nproc),
        "read": _summary(runs["read"]), "export": _summary(runs["export"]), "save_file": _summary(runs["save_file"]),
    }
    report["ratios"] = _ratios(report)
    return report


def _measure(command: str, work: Path, *options: object, torchrun_nproc: int = 0) -> tuple[float, dict]:
    """Run hf_io_measure.py ``command`` in a fresh process (under torchrun with ``torchrun_nproc`` ranks):
    its wall-clock seconds and its result (a list of the ranks' under torchrun)."""
    result = work / f"{command}.json"
    for stale in work.glob(f"{command}*.json"):
        stale.unlink()
    env = {**os.environ, "PYTHONPATH": str(REPO)}
    cmd = [sys.executable, str(MEASURE), command, "--result", str(result), *map(str, options)]
    if torchrun_nproc:
        # the cores split between the ranks, as the trainer's ranks split a node's
        env["OMP_NUM_THREADS"] = str(max(1, (os.cpu_count() or 1) // torchrun_nproc))
        cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", f"--nproc_per_node={torchrun_nproc}",
               *cmd[1:]]
    began = time.perf_counter()
    proc = subprocess.run(cmd, cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                          timeout=RUN_TIMEOUT_S)
    wall = time.perf_counter() - began
    if proc.returncode != 0:
        raise RuntimeError(f"{' '.join(cmd)} exited {proc.returncode}:\n{proc.stdout[-4000:]}")
    if torchrun_nproc:
        return wall, [json.loads(p.read_text()) for p in sorted(work.glob(f"{command}.rank*.json"))]
    return wall, json.loads(result.read_text())


def _timed(wall: float, result: dict) -> dict:
    return {**result, "process_wall_s": wall}


def _import(work: Path, hf_dir: Path, nproc: int) -> dict:
    wall, ranks = _measure("import", work, "--hf-dir", hf_dir, torchrun_nproc=nproc)
    return {"process_wall_s": wall, "seconds": max(r["seconds"] for r in ranks), "ranks": ranks}


def _stats(values: list[float]) -> dict:
    return {"min": min(values), "median": statistics.median(values), "all": values}


def _summary(runs: list[dict]) -> dict:
    """Seconds (min, median), and the largest peak over the repeats."""
    return {"seconds": _stats([r["seconds"] for r in runs]),
            "process_wall_s": _stats([r["process_wall_s"] for r in runs]),
            "peak_bytes": max(r["peak_bytes"] for r in runs),
            "rss_before_bytes": max(r["rss_before_bytes"] for r in runs),
            "added_bytes": max(r["peak_bytes"] - r["rss_before_bytes"] for r in runs),
            "ru_maxrss_bytes": max(r["ru_maxrss_bytes"] for r in runs),
            "reset_peak": all(r["reset_peak"] for r in runs),
            # what the peak is made of: the process's own memory and mapped file pages (sampled, hf_io_measure)
            "sampled_peak_anon_bytes": max(r["sampled_peak_anon_bytes"] for r in runs),
            "sampled_peak_file_bytes": max(r["sampled_peak_file_bytes"] for r in runs),
            "added_file_bytes": max(r["sampled_peak_file_bytes"] - r["rss_file_before_bytes"] for r in runs),
            **({"bytes": runs[0]["bytes"]} if "bytes" in runs[0] else {})}  # read, save_file: tensor bytes


def _summary_import(runs: list[dict], nproc: int) -> dict:
    """The import's seconds (the slowest rank's, each repeat) and each rank's figures over the repeats."""
    per_rank = []
    for rank in range(nproc):
        mine = [next(r for r in run["ranks"] if r["rank"] == rank) | {"process_wall_s": run["process_wall_s"]}
                for run in runs]
        phases = {key: _stats([r[key] for r in mine]) for key in ("build_model_s", "check_headers_s",
                                                                  "read_metadata_s")}
        per_rank.append({"rank": rank, "shard_bytes": mine[0]["shard_bytes"], **_summary(mine), **phases})
    checks = [r for run in runs for r in run["ranks"]]
    return {"nproc": nproc, "seconds": _stats([run["seconds"] for run in runs]),
            "process_wall_s": _stats([run["process_wall_s"] for run in runs]), "per_rank": per_rank,
            "tensors_checked": checks[0]["tensors_checked"],
            "weights_match": all(len(r["ranks"]) == nproc for r in runs) and not any(r["mismatched"] for r in checks),
            "mismatched": sorted({name for r in checks for name in r["mismatched"]})}


def _ratios(report: dict) -> dict:
    model, imp = report["model"], report["import"]
    return {
        "import_over_read_s": imp["seconds"]["median"] / report["read"]["seconds"]["median"],
        "export_over_save_file_s": report["export"]["seconds"]["median"] / report["save_file"]["seconds"]["median"],
        "import_peak_max_rank_over_fp32": max(r["peak_bytes"] for r in imp["per_rank"]) / model["bytes_fp32"],
        "import_added_max_rank_over_bf16": max(r["added_bytes"] for r in imp["per_rank"]) / model["bytes_bf16"],
        "read_peak_over_bf16": report["read"]["peak_bytes"] / model["bytes_bf16"],
        "export_peak_over_bf16": report["export"]["peak_bytes"] / model["bytes_bf16"],
        "save_file_peak_over_bf16": report["save_file"]["peak_bytes"] / model["bytes_bf16"],
    }


def machine() -> dict:
    info = {"nproc": os.cpu_count(), "platform": platform.platform()}
    for line in Path("/proc/meminfo").read_text().splitlines():
        if line.startswith("MemTotal:"):
            info["memory_bytes"] = int(line.split()[1]) * 1024
    for line in Path("/proc/cpuinfo").read_text().splitlines():
        if line.startswith("model name"):
            info["cpu_model"] = line.split(":", 1)[1].strip()
            break
    return info


def versions() -> dict:
    found: dict[str, str | None] = {"python": platform.python_version()}
    for package in ("torch", "safetensors", "transformers"):
        try:
            found[package] = metadata.version(package)
        except metadata.PackageNotFoundError:
            found[package] = None
    return found


def format_table(report: dict) -> str:
    model = report["model"]
    gb = 1e9
    lines = [f"{model['params'] / 1e6:.0f}M params: {model['bytes_bf16'] / gb:.2f} GB bf16, "
             f"{model['bytes_fp32'] / gb:.2f} GB fp32, {model['hf_files']} files | {report['repeats']} repeats | "
             f"load average {report['load_average']['start'][0]:.1f} -> {report['load_average']['end'][0]:.1f}",
             f"{'measurement':<26} {'s min':>7} {'s median':>9} {'peak GB':>8} {'added GB':>9} {'file GB':>8}"]
    rows = [(f"import, rank {r['rank']} of {report['import']['nproc']}", report["import"]["seconds"], r)
            for r in report["import"]["per_rank"]]
    rows += [("read (safetensors)", report["read"]["seconds"], report["read"]),
             ("export", report["export"]["seconds"], report["export"]),
             ("save_file (safetensors)", report["save_file"]["seconds"], report["save_file"])]
    for name, seconds, mem in rows:
        lines.append(f"{name:<26} {seconds['min']:>7.2f} {seconds['median']:>9.2f} {mem['peak_bytes'] / gb:>8.2f} "
                     f"{mem['added_bytes'] / gb:>9.2f} {mem['added_file_bytes'] / gb:>8.2f}")
    lines.append("peak: the process's peak RSS during the call; added: above its RSS when the call began; "
                 "file: of that, mapped file pages (sampled)")
    lines.append(f"import weights match the files: {report['import']['weights_match']} "
                 f"({report['import']['tensors_checked']} tensors on each rank)")
    return "\n".join(lines)


if __name__ == "__main__":
    sys.exit(main())
