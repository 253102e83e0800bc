"""The measured processes of benchmarks/scripts/hf_io_bench.py, one fresh process per measurement, so that each
peak resident set size is that measurement's alone. Each writes one JSON object to ``--result``.

    checkpoint   a random model (build_model, seed 0) saved as a step-0 checkpoint: the export's input (setup)
    export       training.export.main, what ``python -m training.export`` runs: DCP checkpoint -> HF directory
    save-file    baseline of export: safetensors' save_file of the whole bf16 state dict, held in memory
    read         baseline of import: safetensors' load_file of every shard of the HF directory, one process
    import       one rank under torchrun: build_model (seed 1, so a load that did nothing shows), then
                 training.hf.load.load_hf_weights, then a check of every local shard against the files' rows

Memory: VmRSS and VmHWM from /proc/self/status, ru_maxrss from getrusage (the process's lifetime peak).
``peak_bytes`` is the peak of the measured call alone: VmHWM after writing "5" to /proc/self/clear_refs (Linux
resets the high-water mark to the current RSS), so what the process did before (torch's import, the model's
random init) does not count; ``reset_peak`` says whether the reset worked (else it is the lifetime peak).
"""

from __future__ import annotations

import argparse
import json
import os
import resource
import sys
import threading
import time
from pathlib import Path

import torch

SAMPLE_S = 0.005

def _status() -> dict[str, int]:
    """/proc/self/status's memory lines, in bytes."""
    fields = {}
    for line in Path("/proc/self/status").read_text().splitlines():
        key, _, value = line.partition(":")
        if key in ("VmRSS", "VmHWM", "RssAnon", "RssFile"):
            fields[key] = int(value.split()[0]) * 1024
    return fields


def memory_now() -> dict[str, int]:
    """This process's VmRSS and VmHWM (bytes) and getrusage's ru_maxrss (Linux reports KiB)."""
    fields = _status()
    return {"rss_bytes": fields["VmRSS"], "hwm_bytes": fields["VmHWM"],
            "ru_maxrss_bytes": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024}


class _Sampler(threading.Thread):
    """The largest RssAnon (the process's own memory) and RssFile (mapped file pages: safetensors maps its
    files, and the pages a read touches count in the RSS while the file is open) seen every SAMPLE_S: which
    of the two the peak is made of. Sampled, so a spike shorter than SAMPLE_S may be missed."""

    def __init__(self) -> None:
        super().__init__(daemon=True)
        self.stop = threading.Event()
        self.anon = self.file = 0

    def run(self) -> None:
        while True:
            fields = _status()
            self.anon, self.file = max(self.anon, fields["RssAnon"]), max(self.file, fields["RssFile"])
            if self.stop.wait(SAMPLE_S):
                return


def reset_peak() -> bool:
    """Reset VmHWM to the current RSS (Linux >= 4.0); False where the kernel refuses."""
    try:
        Path("/proc/self/clear_refs").write_text("5")
    except OSError:
        return False
    return True


def measured(call) -> dict:
    """Run ``call()`` with its own peak: RSS before, peak during (see the module docstring), seconds."""
    before = _status()
    reset = reset_peak()
    sampler = _Sampler()
    sampler.start()
    started = time.perf_counter()
    call()
    seconds = time.perf_counter() - started
    sampler.stop.set()
    sampler.join()
    after = memory_now()
    return {"seconds": seconds, "rss_before_bytes": before["VmRSS"], "peak_bytes": after["hwm_bytes"],
            "ru_maxrss_bytes": after["ru_maxrss_bytes"], "reset_peak": reset,
            "rss_anon_before_bytes": before["RssAnon"], "rss_file_before_bytes": before["RssFile"],
            "sampled_peak_anon_bytes": sampler.anon, "sampled_peak_file_bytes": sampler.file}


def make_checkpoint(args: argparse.Namespace) -> dict:
    from training.checkpoint.checkpointer import Checkpointer
    from training.config import load_config
    from training.fp8 import NoFp8
    from training.optim import build_optimizer
    from training.parallel.process_group import destroy_distributed, init_distributed
    from training.train import build_model

    shape = json.loads(args.model)
    cfg = load_config(None, ["model.preset=", f"checkpoint.dir={args.out}",
                             *(f"model.{key}={value}" for key, value in shape.items())])
    info = init_distributed()  # a one-process group: the Checkpointer saves through DCP
    model = build_model(cfg.model, cfg.parallel, NoFp8(), info, seed=0)
    optimizer = build_optimizer(model, cfg.optim)  # the checkpoint holds AdamW's moments too (zeros): 3x fp32
    checkpointer = Checkpointer(cfg.checkpoint, rank=0, world_size=1, config_snapshot=cfg.to_dict())
    started = time.perf_counter()
    checkpointer.save(0, model, optimizer, blocking=True)
    checkpointer.close()
    destroy_distributed()
    return {"seconds": time.perf_counter() - started,
            "params": sum(p.numel() for p in model.parameters())}


def export(args: argparse.Namespace) -> dict:
    import training.hf.export  # noqa: F401  main() imports it: loaded first, so the seconds are the export's own
    from training.export import main

    codes = []
    result = measured(lambda: codes.append(main(["--checkpoint", args.checkpoint, "--out", args.out,
                                                 "--max-shard-gb", str(args.max_shard_gb)])))
    if codes != [0]:
        raise SystemExit(f"python -m training.export exited {codes[0]}")
    return result


def save_file_baseline(args: argparse.Namespace) -> dict:
    from safetensors.torch import load_file, save_file

    tensors: dict[str, torch.Tensor] = {}
    for path in sorted(Path(args.hf_dir).glob("*.safetensors")):  # untimed: the state dict the save starts from
        tensors.update({name: t.clone() for name, t in load_file(path).items()})  # in memory, not mapped
    out = Path(args.out)
    out.mkdir(parents=True, exist_ok=True)
    result = measured(lambda: save_file(tensors, str(out / "model.safetensors"), metadata={"format": "pt"}))
    result["bytes"] = sum(t.numel() * t.element_size() for t in tensors.values())
    return result


def read_baseline(args: argparse.Namespace) -> dict:
    from safetensors.torch import load_file

    tensors: dict[str, torch.Tensor] = {}

    def read() -> None:
        for path in sorted(Path(args.hf_dir).glob("*.safetensors")):
            # load_file maps the file and reads nothing yet (1 GB in ~10 ms): the copy reads every byte
            tensors.update({name: t.clone() for name, t in load_file(path).items()})

    result = measured(read)
    result["bytes"] = sum(t.numel() * t.element_size() for t in tensors.values())
    return result


def import_rank(args: argparse.Namespace) -> dict:
    import torch.distributed as dist

    from training.config import load_config
    from training.fp8 import NoFp8
    from training.hf.load import load_hf_weights, resolve_init_model
    from training.parallel.process_group import destroy_distributed, init_distributed
    from training.train import build_model

    info = init_distributed()
    cfg = resolve_init_model(load_config(None, [f"init.hf_dir={args.hf_dir}", "model.preset=", "checkpoint.dir="]))
    started = time.perf_counter()
    model = build_model(cfg.model, cfg.parallel, NoFp8(), info, seed=1)  # the trainer's order: built, then loaded
    build_s = time.perf_counter() - started
    dist.barrier()  # both ranks start the load together
    result = measured(lambda: load_hf_weights(model, cfg, rank=info.rank))
    result.update(rank=info.rank, world_size=info.world_size, build_model_s=build_s, **_phases(cfg, args.hf_dir),
                  shard_bytes=sum(p.to_local().numel() * p.element_size() for p in model.parameters()),
                  **check_shards(model, cfg, Path(args.hf_dir), info.rank, info.world_size))
    destroy_distributed()
    return result


def _phases(cfg, hf_dir: str) -> dict:
    """Two parts of the load, timed again on their own after it: rank 0's check of the files' headers
    (training.hf.files.check_hf_dir) and the reader's metadata (every rank opens every file)."""
    from torch.distributed.checkpoint import HuggingFaceStorageReader

    from training.hf.files import check_hf_dir

    started = time.perf_counter()
    check_hf_dir(hf_dir, cfg.model)
    checked = time.perf_counter()
    HuggingFaceStorageReader(hf_dir).read_metadata()
    return {"check_headers_s": checked - started, "read_metadata_s": time.perf_counter() - checked}


def check_shards(model, cfg, hf_dir: Path, rank: int, world_size: int) -> dict:
    """Every local shard equals its rows of the safetensors files (bf16 -> fp32 is exact), read by row range
    with safe_open: the right tensor, at the right rows, on every rank."""
    from safetensors import safe_open

    from training.checkpoint.state import model_state
    from training.hf.files import scan
    from training.hf.names import expected_shapes, to_hf

    stored = scan(hf_dir)
    state = model_state(model)
    mismatched = []
    for name, shape in expected_shapes(cfg.model).items():
        local = state[name].to_local()
        rows_per_rank = -(-shape[0] // world_size)  # FSDP2's Shard(0): torch.chunk's split of the rows
        start = min(rank * rows_per_rank, shape[0])
        with safe_open(hf_dir / stored[to_hf(name)].file, framework="pt") as f:
            expected = f.get_slice(to_hf(name))[start:start + local.shape[0]]
        if not (local.shape[0] == min(rows_per_rank, shape[0] - start)
                and torch.equal(local, expected.to(torch.float32))):
            mismatched.append(name)
    return {"tensors_checked": len(expected_shapes(cfg.model)), "mismatched": mismatched}


COMMANDS = {"checkpoint": make_checkpoint, "export": export, "save-file": save_file_baseline,
            "read": read_baseline, "import": import_rank}


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(prog="hf_io_measure.py", description=__doc__.split("\n\n")[0])
    parser.add_argument("command", choices=list(COMMANDS))
    parser.add_argument("--result", required=True, type=Path, help="JSON file to write (import: one per rank, "
                        "RESULT.rank<N>.json)")
    parser.add_argument("--model", help="checkpoint: the [model] fields as a JSON object")
    parser.add_argument("--checkpoint", help="export: the checkpoint directory")
    parser.add_argument("--hf-dir", help="save-file, read, import: the Hugging Face directory")
    parser.add_argument("--out", help="checkpoint, export, save-file: the directory to write")
    parser.add_argument("--max-shard-gb", type=float, default=5.0, help="export: largest output file")
    args = parser.parse_args(argv)
    result = COMMANDS[args.command](args)
    path = args.result
    if args.command == "import":
        path = path.with_name(f"{path.stem}.rank{os.environ.get('RANK', '0')}{path.suffix}")
    path.write_text(json.dumps(result) + "\n")
    return 0


if __name__ == "__main__":
    sys.exit(main())
