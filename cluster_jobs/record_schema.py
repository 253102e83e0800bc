"""Reading a job record back: every stored value checked against its dataclass field's declared type before it
becomes part of a JobRecord (issue 42).

The job table is written by clusterctl and the job keeper, but a record written before the nodes' answers
were parsed (cluster_jobs/node_answer.py) can hold what a job printed: a float step (which DynamoDB's
serializer then refuses on every later save), a string `resumedFromStep` (which made `status` and `jobs`
raise). A value that does not fit its field is dropped (the field's default) and named in the record's
`dropped_on_read`, never raised, so a `status`, a `jobs` and a keeper round read such a record and the next
save writes it back clean. Only a field with no default (a record's id, state or node count, an attempt's
number) that does not fit makes the record unreadable: UnreadableRecord, one line naming the field.
"""

from __future__ import annotations

import dataclasses
import math
import types
import typing
from collections.abc import Mapping
from typing import Any

MAX_INT = 10**12  # larger than any step, attempt, node count or version a record holds

T = typing.TypeVar("T")


class UnreadableRecord(ValueError):
    """A record whose required field does not fit: the message names the field and what it holds."""


def describe(value: object) -> str:
    """A value's kind for a warning: its type and size, never its content (it may hold escape sequences)."""
    if isinstance(value, str):
        return f"a string of {len(value)} characters"
    if isinstance(value, (dict, list)):
        return f"a {type(value).__name__} of {len(value)} items"
    return f"a {type(value).__name__}"


def fits(value: object, hint: Any) -> bool:
    """`value` is of the declared type `hint` (int | None, list[str], dict[str, str], a dataclass, ...)."""
    origin, args = typing.get_origin(hint), typing.get_args(hint)
    if origin in (typing.Union, types.UnionType):
        return any(fits(value, arg) for arg in args)
    if hint is type(None):
        return value is None
    if hint is bool:
        return isinstance(value, bool)
    if hint is int:
        return isinstance(value, int) and not isinstance(value, bool) and -MAX_INT <= value <= MAX_INT
    if hint is float:
        return isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value)
    if hint is str:
        return isinstance(value, str)
    if origin is list:
        return isinstance(value, list) and all(fits(v, args[0]) for v in value)
    if origin is dict:
        return isinstance(value, dict) and all(fits(k, args[0]) and fits(v, args[1]) for k, v in value.items())
    return isinstance(value, hint)


def build(cls: type[T], data: Mapping[str, Any], where: str, dropped: list[str]) -> T:
    """A `cls` from the stored fields `data` (snake_case names; unknown ones, a newer writer's, are skipped):
    a value that does not fit is dropped and named in `dropped`; UnreadableRecord when a required one does not
    fit or is missing."""
    hints = typing.get_type_hints(cls)
    kwargs: dict[str, Any] = {}
    for f in dataclasses.fields(cls):
        if not f.init:
            continue
        required = f.default is dataclasses.MISSING and f.default_factory is dataclasses.MISSING
        if f.name not in data:
            if required:
                raise UnreadableRecord(f"{where}{f.name}: missing")
            continue
        value = data[f.name]
        if fits(value, hints[f.name]):
            kwargs[f.name] = value
        elif required:
            raise UnreadableRecord(f"{where}{f.name}: {describe(value)}, not {_name(hints[f.name])}")
        else:
            dropped.append(f"{where}{f.name}: {describe(value)}, not {_name(hints[f.name])}: dropped")
    return cls(**kwargs)


def _name(hint: Any) -> str:
    """int, str | None, list[str]: the type as it is declared."""
    text = hint.__name__ if isinstance(hint, type) and not typing.get_args(hint) else str(hint)
    return text.replace("typing.", "").replace("NoneType", "None")
