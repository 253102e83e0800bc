"""``python -m training``: train a model (under torchrun on the cluster, or as one process on a CPU).

    torchrun --nproc_per_node=8 --nnodes=N ... -m training --config 1b --set run.steps=1000
    python -m training      # the embedded default, training/configs/tiny-cpu.toml, on the CPU

Exit codes: 0 done (also after a SIGTERM that saved a checkpoint), 2 configuration error (one line on stderr,
no traceback), 1 anything else (with its traceback).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from training.errors import ConfigError

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training",
        description="Train a Llama-style decoder with FSDP2 (run it under torchrun for several processes). "
        "Per-step metrics go to rank 0's stdout as JSON lines, a progress line and logs to stderr. "
        "Start from a Hugging Face Llama directory with --set init.hf_dir=DIR (its config.json gives the shape), "
        "write one at the end with --set export.hf_dir=DIR, or any time with python -m training.export "
        "(docs/weights.md).",
    )
    parser.add_argument(
        "--config", metavar="TOML",
        help="a TOML file, or the name of a packaged config (tiny-cpu, 125m, 1b, llama3-8b, llama3-70b); "
        "default: the embedded tiny-cpu.toml",
    )
    parser.add_argument(
        "--set", dest="overrides", action="append", default=[], metavar="SECTION.FIELD=VALUE",
        help="override one config field, e.g. --set run.steps=100 (repeatable; wins over the file)",
    )
    parser.add_argument(
        "--resume", default="auto", metavar="auto|none|PATH",
        help="auto (default): continue from the newest complete checkpoint under checkpoint.dir, or from a "
        "step of the local tier (checkpoint.local_dir) at least as new whose every rank's shard is on some node; "
        "none: start fresh; PATH: load that checkpoint directory (step-<N>), which must be complete",
    )
    parser.add_argument(
        "--resume-from-dir", metavar="DIR",
        help="with --resume auto: when checkpoint.dir holds no complete checkpoint, start from the newest "
        "complete one in DIR (another job's checkpoint directory; saves still go to checkpoint.dir)",
    )
    return parser


def _setup_logging() -> None:
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,  # one copy of the routine messages
        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    _setup_logging()
    try:
        from training.config import load_config

        cfg = load_config(args.config, args.overrides)
        from training.checkpoint.resume import resume_with_fallback
        from training.train import train  # torch and the model load only after the config is valid

        resume = resume_with_fallback(args.resume, cfg.checkpoint.dir, args.resume_from_dir)
        result = train(cfg, resume=resume, local_resume=args.resume == "auto")
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    if result.stopped_by_signal:
        logging.getLogger("training").warning("stopped by SIGTERM after step %d (checkpoint saved)",
                                              result.steps_done)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
