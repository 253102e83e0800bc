"""What a node answers about a job is untrusted input (issue 42): the one parser, with its schema, between a
node's JSON answer (node_bootstrap.jobs status/start/cancel through SSM) and everything on this side that keeps
or shows it: the job keeper's round, the job table, `clusterctl status`, `cancel`, `jobs` and `top`.

The values come from what a job printed (its steps, losses, NCCL lines, resume records) as well as from the
node's supervisor, and a job can print anything. The schema: a step, an attempt or a size is an int (never a
bool, a float or a string) in its range; a loss or a bandwidth a finite number in its range; a state, tier or
compile-cache state one of the contract's names; a time the nodes' UTC form; NCCL's network and provider a short
name of printable ASCII; a detail (an error, what cancel did) at most MAX_DETAIL_CHARS printable characters.
A value outside it is dropped (None) and named in `dropped` ("lastStep: a float, not an int in
0..999999999999"), which the record keeps: a warning, never an exception, and never the value itself (it may
hold escape sequences or be megabytes long). So a job can lose its own progress display, but never stop a
keeper round (DynamoDB's serializer refuses a float), a `status`, a `cancel` or a `jobs`.

The node side parses the job's lines with the same limits first (node_bootstrap/jobs/job_report.py); this side
does not trust that it did: an old node, or an answer that did not come from node_bootstrap.jobs at all.
"""

from __future__ import annotations

import math
import re
from collections.abc import Mapping
from typing import Any

from node_bootstrap import job_contract

MAX_STEP = 10**12 - 1  # 12 digits, as the export's step=N (job_contract.EXPORT_OPTION_RE) and the node's parser
MAX_LOSS = 1e6  # a cross-entropy loss is >= 0 and, for any vocabulary, far below this
MAX_BUSBW_GBPS = 1e5  # all_reduce bus bandwidth: ~480 GB/s on 2 x p5 (docs/architecture.md)
MAX_SIZE_BYTES = 2**50  # a commcheck message size
MIN_EXIT_CODE, MAX_EXIT_CODE = -255, 255  # a process exit status, or minus the signal that killed it
# A job record holds every attempt's node reports in one DynamoDB item (400 KB at most): 64 nodes x 10
# attempts x this is well inside it, and an error or a cancel's outcome is one sentence.
MAX_DETAIL_CHARS = 400
RESUME_TIERS = ("local", "durable")  # training/metrics.py log_resume
TIME_RE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?Z$")
# NCCL's network ("Libfabric", "Socket", "IB", "AWS Libfabric") and aws-ofi-nccl's provider ("efa", "efa;ofi_rxm")
NAME_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+/;: -]{0,30}[A-Za-z0-9_.+/;:-]?$")
# The restart phases a node reports (cluster_jobs/timeline.py NODE_PHASES: the supervisor's start, the trainer's)
PHASE_NAMES = ("started", "rendezvous_done", "checkpoint_loaded", "compiled", "first_step")

Dropped = list[str]


def _what(value: object) -> str:
    """The kind of a dropped value, for its warning: its type and size, never its content."""
    if isinstance(value, str):
        return f"a string of {len(value)} characters"
    if isinstance(value, (dict, list)):
        return f"a {type(value).__name__} of {len(value)} items"
    return f"a {type(value).__name__}"


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def whole(payload: Mapping[str, Any], key: str, dropped: Dropped, low: int = 0, high: int = MAX_STEP) -> int | None:
    value = payload.get(key)
    if value is None:
        return None
    if _is_int(value) and low <= value <= high:
        return int(value)
    dropped.append(f"{key}: {_what(value) if not _is_int(value) else 'an int out of range'}, not an int in "
                   f"{low}..{high}")
    return None


def number(payload: Mapping[str, Any], key: str, dropped: Dropped, high: float) -> float | None:
    value = payload.get(key)
    if value is None:
        return None
    if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) and 0 <= value <= high:
        return float(value)
    dropped.append(f"{key}: {_what(value)}, not a finite number in 0..{high:g}")
    return None


def one_of(payload: Mapping[str, Any], key: str, dropped: Dropped, allowed: tuple[str, ...]) -> str | None:
    value = payload.get(key)
    if value is None:
        return None
    if isinstance(value, str) and value in allowed:
        return value
    dropped.append(f"{key}: {_what(value)}, not one of {', '.join(allowed)}")
    return None


def matching(payload: Mapping[str, Any], key: str, dropped: Dropped, pattern: re.Pattern[str],
             allowed: str) -> str | None:
    value = payload.get(key)
    if value is None:
        return None
    if isinstance(value, str) and pattern.fullmatch(value):
        return value
    dropped.append(f"{key}: {_what(value)}, not {allowed}")
    return None


def is_shown_text(value: object, max_chars: int = MAX_DETAIL_CHARS) -> bool:
    """Text fit to keep and show: a string of at most `max_chars` printable characters (no control, format or
    separator characters: no escape sequence, no bidirectional override, no line break)."""
    return isinstance(value, str) and len(value) <= max_chars and value.isprintable()


def text(payload: Mapping[str, Any], key: str, dropped: Dropped) -> str | None:
    value = payload.get(key)
    if value is None or value == "":
        return None
    if is_shown_text(value):
        return value
    dropped.append(f"{key}: {_what(value)}, not at most {MAX_DETAIL_CHARS} printable characters")
    return None


def phases(payload: Mapping[str, Any], dropped: Dropped) -> dict[str, str] | None:
    value = payload.get("phases")
    if value is None:
        return None
    if not isinstance(value, dict):
        dropped.append(f"phases: {_what(value)}, not an object")
        return None
    kept = {name: when for name, when in value.items()
            if name in PHASE_NAMES and isinstance(when, str) and TIME_RE.fullmatch(when)}
    if len(kept) < len(value):
        dropped.append(f"phases: {len(value) - len(kept)} of {len(value)} items not a known phase with a UTC time")
    return kept


def phase_seconds(payload: Mapping[str, Any], dropped: Dropped) -> dict[str, float] | None:
    """The supervisor's seconds per phase after the first step ("phaseSeconds"): the contract's phase names,
    each a finite number in 0..MAX_PHASE_SECONDS; the other items dropped, counted in one warning."""
    value = payload.get("phaseSeconds")
    if value is None:
        return None
    if not isinstance(value, dict):
        dropped.append(f"phaseSeconds: {_what(value)}, not an object")
        return None
    high = job_contract.MAX_PHASE_SECONDS
    kept = {name: float(s) for name, s in value.items()
            if name in job_contract.PHASE_NAMES and isinstance(s, (int, float)) and not isinstance(s, bool)
            and math.isfinite(s) and 0 <= s <= high}
    if len(kept) < len(value):
        dropped.append(f"phaseSeconds: {len(value) - len(kept)} of {len(value)} items not a known phase with a "
                       f"finite number of seconds in 0..{high}")
    return kept


def parse_payload(payload: Mapping[str, Any]) -> tuple[dict[str, Any], list[str]]:
    """A node's answer (state in job_contract.STATES) as NodeJobState's fields past its instance id and
    state, and the warnings for what was dropped."""
    dropped: Dropped = []
    times = "a UTC time (2026-11-20T23:15:02Z)"
    fields: dict[str, Any] = {
        "exit_code": whole(payload, "exitCode", dropped, MIN_EXIT_CODE, MAX_EXIT_CODE),
        "last_step": whole(payload, "lastStep", dropped),
        "last_loss": number(payload, "lastLoss", dropped, MAX_LOSS),
        "started_at": matching(payload, "startedAt", dropped, TIME_RE, times),
        "ended_at": matching(payload, "endedAt", dropped, TIME_RE, times),
        # what cancel did, or the node's error: the first of them that is there
        "detail": text(payload, "cancel" if payload.get("cancel") else "error", dropped),
        "nccl_network": matching(payload, "ncclNetwork", dropped, NAME_RE, "a short printable name"),
        "nccl_provider": matching(payload, "ncclProvider", dropped, NAME_RE, "a short printable name"),
        "module": one_of(payload, "module", dropped, job_contract.MODULES),
        "busbw_gbps": number(payload, "busbwGbps", dropped, MAX_BUSBW_GBPS),
        "busbw_size_bytes": whole(payload, "busbwSizeBytes", dropped, 0, MAX_SIZE_BYTES),
        "attempt": whole(payload, "attempt", dropped, 1, job_contract.MAX_ATTEMPT),
        "resumed_from_step": whole(payload, "resumedFromStep", dropped),
        "resumed_from_tier": one_of(payload, "resumedFromTier", dropped, RESUME_TIERS),
        "compile_cache": one_of(payload, "compileCache", dropped, job_contract.COMPILE_CACHE_STATES),
        "last_val_loss": number(payload, "lastValLoss", dropped, MAX_LOSS),
        "last_val_step": whole(payload, "lastValStep", dropped),
        "phases": phases(payload, dropped),
        "phase_seconds": phase_seconds(payload, dropped),
        "last_output_at": matching(payload, "lastOutputAt", dropped, TIME_RE, times),
        # a hung job's: where its supervisor found the hang, and what it saw (node_bootstrap/jobs/hang_origin.py)
        "hang_origin": one_of(payload, "hangOrigin", dropped, job_contract.HANG_ORIGINS),
        "hang_evidence": text(payload, "hangEvidence", dropped),
        # a hung job's: its supervisor's last record of progress (its own clock), when the job went quiet
        "quiet_since": matching(payload, "quietSince", dropped, TIME_RE, times),
    }
    return fields, dropped


def node_error(error: str) -> str:
    """An SSM-level error line (Invocation.error, which may end in the node's last output line) as a detail:
    the line when it is shown text, else only SSM's own part of it ("SSM Failed (exit code 1)")."""
    if is_shown_text(error):
        return error
    head = error.split(": ", 1)[0]
    if error.startswith("SSM ") and is_shown_text(head):
        return f"{head}: (the node's output was not shown text: dropped)"
    return "an answer that is not shown text (dropped)"
