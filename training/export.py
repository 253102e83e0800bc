"""``python -m training.export``: a checkpoint -> a Hugging Face model directory (training.hf.export).

    python -m training.export --checkpoint /fsx/checkpoints/JOB [--step N] --out /fsx/checkpoints/JOB/hf-step-N

Runs on any machine with torch and safetensors: no GPU, no torchrun; it reads the checkpoint one group of
tensors at a time. Exit codes: 0 written, 2 bad input (one line on stderr), 1 anything else.
"""

from __future__ import annotations

import argparse
import logging
import sys

from training.config.help_text import HelpFormatter, examples
from training.errors import ConfigError

EXIT_OK, EXIT_FAILED, EXIT_CONFIG = 0, 1, 2
# On the cluster, `clusterctl export JOB [--step N]` runs this as a job of its own (README, "Continue training a
# Llama checkpoint"), with --checkpoint the job's directory and --out its own.
EXAMPLE = "python -m training.export --checkpoint /tmp/ckpt --step 20 --out /tmp/hf-step-20"


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training.export",
        description="Write a Hugging Face Llama directory (bf16 safetensors shards with their index, config.json, "
        "generation_config.json, the init directory's tokenizer files) from a complete checkpoint. "
        "transformers' AutoModelForCausalLM.from_pretrained and vLLM load it. On the cluster: clusterctl "
        "export JOB [--step N].",
        epilog=examples(EXAMPLE),
        formatter_class=HelpFormatter,
    )
    parser.add_argument("--checkpoint", required=True, metavar="DIR",
                        help="a job's checkpoint directory (holding step-<N>/) or one complete step-<N> directory")
    parser.add_argument("--step", type=int, metavar="N",
                        help="the step to export (default: the newest complete one)")
    parser.add_argument("--out", required=True, metavar="DIR", help="the directory to write (created if missing)")
    parser.add_argument("--max-shard-gb", type=float, default=5.0, metavar="GB",
                        help="largest safetensors file, in GB of bf16 weights (default 5; memory use is about "
                        "one file plus 1 GB)")
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    logging.basicConfig(level=logging.INFO, format="%(asctime)s %(levelname)s %(name)s: %(message)s",
                        stream=sys.stderr)
    if not args.max_shard_gb > 0:
        print(f"config error: --max-shard-gb={args.max_shard_gb}: allowed: a number > 0", file=sys.stderr)
        return EXIT_CONFIG
    try:
        from training.hf.export import export_checkpoint  # torch loads only after the arguments are valid

        result = export_checkpoint(args.checkpoint, args.out, step=args.step,
                                   max_shard_bytes=int(args.max_shard_gb * 1e9))
    except ConfigError as exc:
        print(f"config error: {exc}", file=sys.stderr)
        return EXIT_CONFIG
    print(result.out_dir)
    return EXIT_OK


if __name__ == "__main__":
    sys.exit(main())
