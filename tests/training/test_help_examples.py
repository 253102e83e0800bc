"""`python -m training --help` and `python -m training.export --help` end with example lines, kept whole (never
wrapped), that their own parsers accept: what a user copies runs."""

from __future__ import annotations

import shlex
import subprocess
import sys
from pathlib import Path

import pytest

from training import __main__ as training_main
from training import export as training_export
from training.config.help_text import EXAMPLE_PREFIX

REPO = Path(__file__).resolve().parents[2]


def help_examples(module: str) -> list[str]:
    shown = subprocess.run([sys.executable, "-m", module, "--help"], cwd=REPO, capture_output=True, text=True,
                           timeout=120, env={"COLUMNS": "80", "PATH": "/usr/bin:/bin"})
    assert shown.returncode == 0, shown.stderr
    lines = shown.stdout.rstrip("\n").splitlines()
    examples = [line[len(EXAMPLE_PREFIX):] for line in lines if line.startswith(EXAMPLE_PREFIX)]
    assert examples and lines[-len(examples):] == [EXAMPLE_PREFIX + e for e in examples]  # last, one line each
    return examples


@pytest.mark.parametrize(("module", "parser", "entry"), [
    ("training", training_main.build_parser, "training"),
    ("training.export", training_export.build_parser, "training.export"),
])
def test_help_ends_with_examples_its_parser_accepts(module, parser, entry):
    for example in help_examples(module):
        words = shlex.split(example)
        argv = words[words.index(entry) + 1:]  # after `python -m MODULE` or `torchrun ... -m MODULE`
        parser().parse_args(argv)  # SystemExit on anything it does not take
