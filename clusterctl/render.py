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
    """Left-aligned columns separated by two spaces; None prints as "-"; control characters as escapes."""
    # every cell through terminal_safe, newline and tab too: a node's DETAIL or NETWORK cannot break the rows
    cells = [[str(h) for h in headers]] + [["-" if v is None else terminal_safe(str(v), keep="") for v in row]
                                           for row in rows]
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


# Shown as escapes: control characters (C0, DEL, C1: ESC starts every terminal sequence, C1 CSI/OSC too), format
# characters (bidirectional overrides that reorder what is read, zero-width ones) and the Unicode line and
# paragraph separators.
_ESCAPED_CATEGORIES = ("Cc", "Cf", "Zl", "Zp")


def terminal_safe(text: str, keep: str = "\n\t") -> str:
    """`text` with every control character but those in `keep` written out as an escape (ESC as \\x1b, a
    carriage return as \\x0d, the C1 controls U+0080-U+009F as \\x80-\\x9f, a bidirectional override as
    \\u202e): text a job wrote is shown, never obeyed by the terminal (no cursor moves, title or clipboard
    sequences, no line rewritten by a return). The one escape for job-derived text: every line clusterctl
    prints (runtime.say, note and the error line), every table cell (format_table, keep="") and `top`'s panels
    go through it."""
    return "".join(c if c in keep or unicodedata.category(c) not in _ESCAPED_CATEGORIES else _escape(c)
                   for c in text)


def _escape(c: str) -> str:
    code = ord(c)
    return f"\\x{code:02x}" if code <= 0xFF else f"\\u{code:04x}" if code <= 0xFFFF else f"\\U{code:08x}"


def format_usd(amount: float) -> str:
    return f"${amount:,.2f}"
