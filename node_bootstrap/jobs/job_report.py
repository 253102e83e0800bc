"""What a job prints is untrusted input (issue 42): the one parser, with its schema, for every value the node
reads from a job's output. The supervisor (its resume and phase records, the hang watch's steps and beats and the
trainer's phase records: a phase started or ended, with its bound), `status`
(the last step and loss, the held-out loss, the resume point, a commcheck's bus bandwidth, NCCL's network) and
through them the job keeper, the job table and the operator's terminal read only what passes here.

The schema: a step is an int (never a bool, a float or a string) in 0..MAX_STEP; a loss or a bandwidth a
finite number in its range; a tier, a compile-cache state or a phase name one of the names the trainer
prints; a phase time the trainer's UTC form; NCCL's network and provider a short name of printable ASCII
letters, digits and `_ . + / - ; :` (no control characters, so no terminal escapes). A value outside it is
dropped, and counted in a Rejections under the field's status name; never raised: a job can lose its own
progress display, never stop a `status`, a keeper round or a terminal.

Finding the lines: the trainer prints one JSON object per line (training/metrics.py), which torchrun may prefix
("[rank0]:"), so the object starts at the first "{". Standard library only (Python >= 3.9).
"""

import json
import math
import re
from collections import Counter
from typing import NamedTuple, Optional

from node_bootstrap.job_contract import (
    BEAT_EVENT,
    COMPILE_CACHE_STATES,
    MAX_PHASE_BOUND_SECONDS,
    MAX_PHASE_SECONDS,
    PHASE_EVENT,
    PHASE_NAMES,
    PHASE_STATES,
)

MAX_STEP = 10**12 - 1  # the export's step=N takes 12 digits (job_contract.EXPORT_OPTION_RE)
MAX_LOSS = 1e6  # a cross-entropy loss is >= 0 and, for any vocabulary, far below this
MAX_BUSBW_GBPS = 1e5  # all_reduce bus bandwidth: ~480 GB/s on 2 x p5 (docs/architecture.md)
MAX_SIZE_BYTES = 2**50  # a commcheck message size
RESUME_TIERS = ("local", "durable")  # training/metrics.py log_resume
# The phases the trainer times (training/metrics.py); "started" is the supervisor's own and never the job's.
TRAINER_PHASES = ("rendezvous_done", "checkpoint_loaded", "compiled", "first_step")
_PHASE_TIME_RE = re.compile(r"^[0-9]{4}-[0-9]{2}-[0-9]{2}T[0-9]{2}:[0-9]{2}:[0-9]{2}(\.[0-9]{1,6})?Z$")
# Names shown to people: printable ASCII, no space at either end, no control characters.
_NETWORK_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+/ -]{0,30}[A-Za-z0-9_.+/-]?$")
_PROVIDER_RE = re.compile(r"^[A-Za-z0-9][A-Za-z0-9_.+;:-]{0,31}$")
_FIELD_RE = re.compile(r"^[A-Za-z][A-Za-z0-9_]{0,63}$")  # a field name in a Rejections

# NCCL prints, at NCCL_DEBUG=INFO with the INIT subsystem, one line per communicator naming the network it
# chose: INFO(NCCL_INIT, "Using network %s", comm->ncclNet->name) in NVIDIA/nccl src/init.cc. src/debug.cc
# prefixes it with "<hostname>:<pid>:<tid> [<cudaDev>] NCCL INFO " (and a timestamp, or torchrun a "[rank0]:",
# where configured), so the pattern is not anchored at the line start. It must end in a newline: a line still
# being written is not read as a shorter name.
NCCL_NETWORK_RE = re.compile(r"NCCL INFO Using network ([^\r\n]+?)[ \t]*\r?\n")
# aws-ofi-nccl, when its plugin initialises: NCCL_OFI_INFO(NCCL_INIT | NCCL_NET, "Selected provider is %s,
# fabric is %s (found %d nics)") (src/nccl_ofi_net.cpp; "Selected Provider is %s (found %d nics)" in older
# releases), prefixed with "NET/OFI " by its logging macro (include/nccl_ofi_log.h).
OFI_PROVIDER_RE = re.compile(r"NCCL INFO NET/OFI Selected [Pp]rovider is ([^\s,]+)")


class Rejections:
    """How many values of each field were dropped for failing the schema ({"lastStep": 2, ...})."""

    def __init__(self) -> None:
        self.counts: Counter = Counter()

    def add(self, field: str) -> None:
        self.counts[field] += 1

    def merge(self, recorded: object) -> None:
        """Add counts recorded elsewhere (the supervisor's, from status.json): only str -> int >= 0 items."""
        if isinstance(recorded, dict):
            for field, count in recorded.items():
                if isinstance(field, str) and _FIELD_RE.fullmatch(field) and _is_int(count) and count > 0:
                    self.counts[field] += min(count, MAX_STEP)

    def as_dict(self) -> dict[str, int]:
        return dict(sorted(self.counts.items()))


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


def _is_number(value: object) -> bool:
    return (isinstance(value, (int, float)) and not isinstance(value, bool)
            and math.isfinite(value))  # type: ignore[arg-type]


def checked_int(value: object, field: str, rejected: Rejections, high: int = MAX_STEP) -> Optional[int]:
    """`value` when it is an int in 0..high; None (absent, or dropped and counted) otherwise."""
    if value is None:
        return None
    if _is_int(value) and 0 <= value <= high:  # type: ignore[operator]
        return int(value)  # type: ignore[call-overload]
    rejected.add(field)
    return None


def checked_number(value: object, field: str, rejected: Rejections, high: float) -> Optional[float]:
    """`value` when it is a finite int or float in 0..high (as a float); None otherwise (counted unless absent)."""
    if value is None:
        return None
    if _is_number(value) and 0 <= value <= high:  # type: ignore[operator]
        return float(value)  # type: ignore[arg-type]
    rejected.add(field)
    return None


def checked_name(value: object, field: str, rejected: Rejections, allowed: tuple[str, ...]) -> Optional[str]:
    """`value` when it is one of `allowed`; None otherwise (counted unless absent)."""
    if value is None:
        return None
    if isinstance(value, str) and value in allowed:
        return value
    rejected.add(field)
    return None


def checked_text(value: object, field: str, rejected: Rejections, pattern: "re.Pattern[str]") -> Optional[str]:
    """`value` when it is a string `pattern` matches whole (short, printable); None otherwise (counted)."""
    if value is None:
        return None
    if isinstance(value, str) and pattern.fullmatch(value):
        return value
    rejected.add(field)
    return None


def checked_phases(value: object, rejected: Rejections) -> dict[str, str]:
    """The trainer's phase times: known names, UTC times; each other item dropped and counted."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        rejected.add("phases")
        return {}
    phases: dict[str, str] = {}
    for name, when in value.items():
        if name in TRAINER_PHASES and isinstance(when, str) and _PHASE_TIME_RE.fullmatch(when):
            phases[name] = when
        elif when:  # the trainer leaves out a phase it did not reach; an empty value is no claim
            rejected.add("phases")
    return phases


def checked_phase_seconds(value: object, rejected: Rejections) -> dict[str, float]:
    """The supervisor's seconds per phase (status "phaseSeconds"): PHASE_NAMES, each a finite number in
    0..MAX_PHASE_SECONDS; each other item dropped and counted as "phaseSeconds"."""
    if value is None:
        return {}
    if not isinstance(value, dict):
        rejected.add("phaseSeconds")
        return {}
    kept: dict[str, float] = {}
    for name, seconds in value.items():
        if name in PHASE_NAMES and _is_number(seconds) and 0 <= seconds <= MAX_PHASE_SECONDS:  # type: ignore[operator]
            kept[name] = float(seconds)  # type: ignore[arg-type]
        else:
            rejected.add("phaseSeconds")
    return kept


def checked_recorded_phases(value: object, rejected: Rejections) -> dict[str, str]:
    """A status.json's phases as `status` returns them: the supervisor's own "started" and the trainer's phases,
    each a UTC time (a status recorded before the supervisor checked them is checked here)."""
    started = value.get("started") if isinstance(value, dict) else None
    phases = {"started": started} if isinstance(started, str) and _PHASE_TIME_RE.fullmatch(started) else {}
    if isinstance(value, dict):
        phases.update(checked_phases({k: v for k, v in value.items() if k != "started"}, rejected))
    return phases


# ----- finding the lines -----


def find_last_event(text: str, events: tuple[str, ...]) -> Optional[dict[str, object]]:
    """The last JSON line in `text` whose "event" is one of `events`, as printed: its values are unchecked, so
    only this module's readers below take values from it."""
    for line in reversed(text.splitlines()):
        start = line.find("{")
        if start < 0 or not any(f'"{name}"' in line for name in events):
            continue
        try:
            event = json.loads(line[start:])
        except (ValueError, RecursionError):  # RecursionError: thousands of nested brackets
            continue
        if isinstance(event, dict) and event.get("event") in events:
            return event
    return None


def find_last_step(text: str) -> Optional[dict[str, object]]:
    """The last trainer progress line, {"event": "step", "step": ..., "loss": ...}, in `text`, as printed."""
    return find_last_event(text, ("step",))


def find_last_validation(text: str) -> Optional[dict[str, object]]:
    """The last trainer line that carries a held-out loss in `text`: a step line with "val_loss" (the trainer's
    [validation] evaluated it after that step), or the baseline's {"event": "validation", "step": 0, ...}
    (before a fresh start's first step); None without one. Later step lines carry none, so the last step
    line alone would not do."""
    for line in reversed(text.splitlines()):
        start = line.find("{")
        if start < 0 or '"val_loss"' not in line:
            continue
        try:
            event = json.loads(line[start:])
        except (ValueError, RecursionError):
            continue
        if isinstance(event, dict) and event.get("event") in ("step", "validation"):
            return event
    return None


def find_resumed_from_step(text: str, rejected: Optional[Rejections] = None) -> Optional[int]:
    """The checkpoint step of the trainer's last resume line, {"event": "resume", "step": N, "path": ...,
    "tier": ...} (training/metrics.py; step 0, path null and no tier when it started fresh), in `text`; None
    before it printed one, or when its step is no int in range (counted in `rejected`)."""
    event = find_last_event(text, ("resume",))
    return resume_report(event, rejected or Rejections()).step if event else None


def find_resumed_from_tier(text: str, rejected: Optional[Rejections] = None) -> Optional[str]:
    """The checkpoint tier of that line: "local" or "durable"; None for a fresh start or before the line."""
    event = find_last_event(text, ("resume",))
    return resume_report(event, rejected or Rejections()).tier if event else None


# ----- the typed records -----


class StepReport(NamedTuple):
    step: Optional[int]
    loss: Optional[float]


class ResumeReport(NamedTuple):
    step: Optional[int]  # the checkpoint step resumed from; 0: a fresh start
    tier: Optional[str]  # RESUME_TIERS; None for a fresh start
    compile_cache: Optional[str]  # COMPILE_CACHE_STATES; None without torch.compile
    phases: dict[str, str]  # TRAINER_PHASES -> UTC time


class PhaseReport(NamedTuple):
    """A trainer's phase record (job_contract.PHASE_EVENT): a phase longer than a step started or ended."""

    phase: str  # PHASE_NAMES
    state: str  # PHASE_STATES
    bound_s: Optional[float]  # the phase's own bound, > 0; None: the trainer knows none


class BusbwReport(NamedTuple):
    busbw_gbps: Optional[float]
    size_bytes: Optional[int]


def step_report(event: Optional[dict[str, object]], rejected: Rejections,
                step_field: str = "lastStep", loss_key: str = "loss", loss_field: str = "lastLoss") -> StepReport:
    if event is None:
        return StepReport(None, None)
    return StepReport(checked_int(event.get("step"), step_field, rejected),
                      checked_number(event.get(loss_key), loss_field, rejected, MAX_LOSS))


def resume_report(event: dict[str, object], rejected: Rejections) -> ResumeReport:
    return ResumeReport(
        step=checked_int(event.get("step"), "resumedFromStep", rejected),
        tier=checked_name(event.get("tier"), "resumedFromTier", rejected, RESUME_TIERS),
        compile_cache=checked_name(event.get("compile_cache"), "compileCache", rejected, COMPILE_CACHE_STATES),
        phases=checked_phases(event.get("phases"), rejected),
    )


def phase_report(event: dict[str, object], rejected: Rejections) -> Optional[PhaseReport]:
    """The phase record `event` as a PhaseReport; None, counted once as "phaseRecord", when any of its values
    fails the schema (a known name, a known state, a bound in (0, MAX_PHASE_BOUND_SECONDS] or none): a record
    half believed could start a phase that never ends."""
    phase, state, bound = event.get("phase"), event.get("state"), event.get("bound_s")
    if (event.get("event") == PHASE_EVENT and isinstance(phase, str) and phase in PHASE_NAMES
            and isinstance(state, str) and state in PHASE_STATES
            and (bound is None or (_is_number(bound) and 0 < bound <= MAX_PHASE_BOUND_SECONDS))):  # type: ignore[operator]
        return PhaseReport(phase, state, None if bound is None else float(bound))  # type: ignore[arg-type]
    rejected.add("phaseRecord")
    return None


def beat_report(event: dict[str, object], rejected: Rejections) -> Optional[int]:
    """The step of the beat `event` (job_contract.BEAT_EVENT); None, counted as "beatRecord", when it is no int
    in 0..MAX_STEP: a malformed beat is no progress."""
    step = event.get("step")
    if event.get("event") == BEAT_EVENT and _is_int(step) and 0 <= step <= MAX_STEP:  # type: ignore[operator]
        return int(step)  # type: ignore[call-overload]
    rejected.add("beatRecord")
    return None


def find_busbw(text: str, rejected: Optional[Rejections] = None) -> Optional[dict[str, object]]:
    """A commcheck's bus bandwidth from its JSON lines (training/commcheck.py): the summary's busbw at the
    largest size once it is printed, before that the newest size's; None before the first size ends."""
    event = find_last_event(text, ("allreduce_summary", "allreduce"))
    if event is None:
        return None
    rejected = rejected if rejected is not None else Rejections()
    size_key = "largest_size_bytes" if event["event"] == "allreduce_summary" else "size_bytes"
    return {"busbwGbps": checked_number(event.get("busbw_gbps"), "busbwGbps", rejected, MAX_BUSBW_GBPS),
            "busbwSizeBytes": checked_int(event.get(size_key), "busbwSizeBytes", rejected, MAX_SIZE_BYTES)}


def checked_network(name: Optional[str], rejected: Rejections) -> Optional[str]:
    return checked_text(name, "ncclNetwork", rejected, _NETWORK_RE)


def checked_provider(name: Optional[str], rejected: Rejections) -> Optional[str]:
    return checked_text(name, "ncclProvider", rejected, _PROVIDER_RE)
