"""One health check's result: the unit the gate, `check` and the monitor report in."""

from __future__ import annotations

from dataclasses import dataclass

OK, WARN, FAIL = "ok", "warn", "fail"  # only a fail makes the node unhealthy


@dataclass(frozen=True)
class Check:
    name: str
    status: str  # ok | warn | fail
    detail: str
