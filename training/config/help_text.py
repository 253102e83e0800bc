"""The --help layout of the training commands (python -m training, python -m training.export): argparse's,
except that the epilog keeps its lines and an example line is never wrapped, so it can be copied whole."""

from __future__ import annotations

import argparse

EXAMPLE_PREFIX = "Example: "


def examples(*commands: str) -> str:
    """An epilog of example lines, one per command."""
    return "\n".join(EXAMPLE_PREFIX + command for command in commands)


class HelpFormatter(argparse.HelpFormatter):
    def _fill_text(self, text: str, width: int, indent: str) -> str:
        fill = super()._fill_text
        return "\n".join(indent + line if not line or line.startswith(EXAMPLE_PREFIX) else fill(line, width, indent)
                         for line in text.split("\n"))
