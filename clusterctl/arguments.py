"""argparse value types shared by the command groups: each checks one argument before any AWS call and says
what is allowed; AddCommand, the helper cli.build_parser hands each group to add its subcommands; and the
help layout every command shares (its help ends with one example line)."""

from __future__ import annotations

import argparse
import datetime
import math
from collections.abc import Callable

from instance_catalog.instance_types import INSTANCE_TYPES

# cli.build_parser's `add(name, help_text, example=..., **kwargs)`: a subcommand parser that already has the
# global options, whose help ends with the example.
AddCommand = Callable[..., argparse.ArgumentParser]

EXAMPLE_PREFIX = "Example: "
JOB_ID_EXAMPLE = "j-20261120-231502-ab12"  # the shape `clusterctl submit` prints, for the examples


def with_example(epilog: str | None, example: str) -> str:
    """A command's epilog with its example as the last line, on a line of its own."""
    line = f"{EXAMPLE_PREFIX}{example}"
    return f"{epilog}\n\n{line}" if epilog else line


class HelpFormatter(argparse.HelpFormatter):
    """argparse's layout, except that the description and epilog keep their line breaks and the example line
    is never wrapped (so it can be copied as one command)."""

    def _fill_text(self, text: str, width: int, indent: str) -> str:
        fill = super()._fill_text
        return "\n".join(
            indent + line if not line or line.startswith(EXAMPLE_PREFIX) else fill(line, width, indent)
            for line in text.split("\n")
        )


def positive_int(text: str) -> int:
    value = _integer(text, "an integer >= 1")
    if value < 1:
        raise argparse.ArgumentTypeError(f"{text}: must be 1 or more")
    return value


def non_negative_int(text: str) -> int:
    value = _integer(text, "an integer >= 0")
    if value < 0:
        raise argparse.ArgumentTypeError(f"{text}: must be 0 or more")
    return value


def positive_float(text: str) -> float:
    """A finite number > 0."""
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 < value < math.inf:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: a number > 0")
    return value


def non_negative_hours(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = math.nan
    if not 0 <= value < math.inf:  # false for nan: float() accepts "nan" and "inf"
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: a number of hours >= 0")
    return value


def sizes_mib(text: str) -> str:
    """Comma-separated whole MiB, as training.commcheck --sizes-mib takes them (checked here, before any
    node runs it)."""
    parts = text.split(",")
    if not all(p.isascii() and p.isdigit() and 1 <= int(p) <= 65536 for p in parts):
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: comma-separated MiB of 1-65536, e.g. 64,1024")
    return ",".join(str(int(p)) for p in parts)


def utc_time(text: str) -> datetime.datetime:
    try:
        value = datetime.datetime.fromisoformat(text.replace("Z", "+00:00"))
    except ValueError:
        raise argparse.ArgumentTypeError(
            f"{text!r}: expected an ISO 8601 date or time, e.g. 2026-12-01 or 2026-12-01T11:30:00Z"
        ) from None
    return value if value.tzinfo else value.replace(tzinfo=datetime.UTC)


def instance_type(text: str) -> str:
    if text not in INSTANCE_TYPES:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: {', '.join(sorted(INSTANCE_TYPES))}")
    return text


def _integer(text: str, allowed: str) -> int:
    try:
        return int(text)
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: {allowed}") from None
