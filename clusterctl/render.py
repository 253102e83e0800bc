"""Output: aligned text tables for people, JSON for scripts (--json)."""

from __future__ import annotations

import dataclasses
import datetime
import json
import unicodedata
from collections.abc import Sequence
from typing import Any

from cluster_aws.stack_outputs import DEFAULT_STACK_NAME


def deploy_command(stack: str, context: Sequence[str]) -> str:
    """The command that deploys the stack with these `-c key=value` settings: the Makefile's deploy target (README,
    "Deploy"), which runs the pinned CDK CLI without jsii's Node banner; STACK only when it is not the default."""
    stack_arg = "" if stack == DEFAULT_STACK_NAME else f" STACK={stack}"
    return f'make deploy{stack_arg} CDK_ARGS="{" ".join(context)}"'


def format_table(headers: Sequence[str], rows: Sequence[Sequence[object]]) -> str:
    """Left-aligned columns separated by two spaces; None prints as "-"."""
    cells = [[str(h) for h in headers]] + [["-" if v is None else str(v) for v in row] for row in rows]
    widths = [max(len(row[i]) for row in cells) for i in range(len(headers))]
    return "\n".join(
        "  ".join(c.ljust(w) for c, w in zip(row, widths, strict=True)).rstrip() for row in cells
    )


def _default(value: Any) -> Any:
    if isinstance(value, datetime.datetime):
        return format_time(value)
    if dataclasses.is_dataclass(value) and not isinstance(value, type):
        return dataclasses.asdict(value)
    raise TypeError(f"cannot serialise {type(value).__name__}")


def to_json(value: Any) -> str:
    return json.dumps(value, default=_default, indent=2, sort_keys=True)


def format_time(value: datetime.datetime | None) -> str | None:
    """UTC, ISO 8601 to the second: 2026-11-20T23:15:02Z."""
    if value is None:
        return None
    if value.tzinfo is None:
        value = value.replace(tzinfo=datetime.UTC)
    return value.astimezone(datetime.UTC).strftime("%Y-%m-%dT%H:%M:%SZ")


def terminal_safe(text: str) -> str:
    """`text` with every control character but newline and tab written out as an escape (ESC as \\x1b, a
    carriage return as \\x0d, the C1 controls U+0080-U+009F as \\x80-\\x9f): text a job wrote is shown, never
    obeyed by the terminal (no cursor moves, title or clipboard sequences, no line rewritten by a return)."""
    return "".join(c if c in "\n\t" or unicodedata.category(c) != "Cc" else f"\\x{ord(c):02x}" for c in text)


def format_usd(amount: float) -> str:
    return f"${amount:,.2f}"
