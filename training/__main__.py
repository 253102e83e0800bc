"""``python -m training``: train a model (under torchrun on the cluster, or as one process on a CPU).

    torchrun --nproc_per_node=8 --nnodes=N ... -m training --config 1b --set run.steps=1000
    python -m training      # the embedded default, training/configs/tiny-cpu.toml, on the CPU

Exit codes: 0 done (also after a SIGTERM or a Ctrl-C that saved a checkpoint), 2 configuration error (one line on
stderr, no traceback), 130 a second Ctrl-C (stopped at once, one line, nothing saved), 1 anything else (with its
traceback). They are what torchrun and the job's supervisor see: before
the interpreter's shutdown, cli() frees the process groups, whose threads would otherwise outlive the run and
could abort the exit (parallel.process_group.release_process_groups).
"""

from __future__ import annotations

import argparse
import logging
import os
import sys

from training.config import packaged_config_names  # no torch: the config layer imports none
from training.config.help_text import HelpFormatter, examples
from training.errors import ConfigError
from training.goodput_line import STARTED_S  # noqa: F401  (imported first: the process's goodput clock starts)
from training.startup import frozen_imports

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_CONFIG = 2
EXIT_INTERRUPTED = 130  # the shell's 128 + SIGINT: stopped at once by a second Ctrl-C


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training",
        description="Train a Llama-style decoder with FSDP2 (run it under torchrun for several processes). "
        "Per-step metrics go to rank 0's stdout as JSON lines, a progress line and logs to stderr. "
        "Start from a Hugging Face Llama directory with --set init.hf_dir=DIR (its config.json gives the shape), "
        "write one at the end with --set export.hf_dir=DIR, or any time with python -m training.export "
        "(docs/weights.md).",
        epilog=examples(
            "OMP_NUM_THREADS=1 python -m training --config tiny-cpu --set run.steps=20 --set checkpoint.dir=/tmp/ckpt",
            "torchrun --nproc-per-node 8 -m training --config llama3-8b --set init.hf_dir=/fsx/data/Llama-3.1-8B",
        ),
        formatter_class=HelpFormatter,
    )
    parser.add_argument(
        "--config", metavar="TOML",
        help=f"a TOML file, or the name of a packaged config ({', '.join(packaged_config_names())}); "
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
    parser.add_argument(
        "--overwrite-checkpoints", action="store_true",
        help="with --resume none or PATH: delete the checkpoints of checkpoint.dir newer than the start first "
        "(without it such a start is refused: its saves would be mixed with another run's, and keep_last "
        "deletes by step number)",
    )
    return parser


def _setup_logging() -> None:
    rank = int(os.environ.get("RANK", "0"))
    logging.basicConfig(
        level=logging.INFO if rank == 0 else logging.WARNING,  # one copy of the routine messages
        format=f"%(asctime)s [rank {rank}] %(levelname)s %(name)s: %(message)s",
        stream=sys.stderr,
    )


def main(argv: list[str] | None = None, *, freeze_imports: bool = False) -> int:
    """The run. ``freeze_imports``: this process does nothing else (cli): the trainer's imports run without the
    cycle collector and what they built is frozen before training (training/startup.py). A caller that goes on
    after main() (a test) leaves it off: what is alive when the freeze comes is never collected."""
    args = build_parser().parse_args(argv)
    _setup_logging()
    try:
        from training.config import load_config

        cfg = load_config(args.config, args.overrides)
        with frozen_imports(freeze_imports):  # torch and the model load only after the config is valid
            from training.checkpoint.resume import resume_with_fallback
            from training.train import train

        resume = resume_with_fallback(args.resume, cfg.checkpoint.dir, args.resume_from_dir)
        result = train(cfg, resume=resume, local_resume=args.resume == "auto",
                       overwrite_checkpoints=args.overwrite_checkpoints)
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    except KeyboardInterrupt:  # a second Ctrl-C (training.faults), or one before the trainer was started
        print("interrupted: stopped at once, without saving a checkpoint (the newest complete one stays)",
              file=sys.stderr)
        return EXIT_INTERRUPTED
    if result.stopped_by_signal:
        logging.getLogger("training").warning("stopped by %s after step %d (checkpoint saved)", result.stop_signal,
                                              result.steps_done)
    return EXIT_OK


def cli(argv: list[str] | None = None) -> int:
    """The process's entry point: main(), then nothing of the run left running into the interpreter's
    shutdown, so the process exits with main's code (parallel.process_group.release_process_groups says why)."""
    try:
        code = main(argv, freeze_imports=True)
    except BaseException:  # exit 1, with the traceback Python prints after this
        _release(after_error=True)
        raise
    _release(after_error=False)
    return code


def _release(*, after_error: bool) -> None:
    if "torch.distributed" not in sys.modules:  # stopped before the trainer was imported: nothing was built
        return
    import torch

    from training.parallel.process_group import release_process_groups

    # after an error on CUDA the group stays: NCCL's teardown may wait on a collective a failed peer never joins
    release_process_groups(destroy=not (after_error and torch.cuda.is_available()))


if __name__ == "__main__":
    sys.exit(cli())
