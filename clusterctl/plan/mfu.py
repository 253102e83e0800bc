"""Which model FLOPs utilization (MFU) `clusterctl plan` turns FLOPs into hours with, and where it came from.

In order: `--mfu`; a figure measured with `python -m training.bench` for the same preset, GPU and FP8 backend
(benchmarks/mfu.json, the machine-readable copy of docs/benchmarks.md's tables); else DEFAULT_MFU. The plan
prints which one it used.

MFU here is the trainer's: model FLOPs (training.shapes.flops_per_token: 6 x parameters + attention) per
second over the dense BF16 peak, also for FP8 runs. Full activation checkpointing recomputes each block's
forward, one third more work than the model FLOPs count (Korthikanti et al. 2022, "Reducing Activation
Recomputation in Large Transformer Models", section 5: forward 2, backward 4, recomputed forward 2 units per
parameter and token), so a figure measured without it is worth 3/4 of itself with it, and the reverse.
"""

from __future__ import annotations

import json
import math
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from cluster_aws.errors import EXIT_USAGE, ClusterctlError

MEASURED_MFU_PATH = Path(__file__).resolve().parents[2] / "benchmarks" / "mfu.json"
# The default when nothing was measured: MFU without activation checkpointing. torchtitan's published FSDP2
# figures (docs/performance.md): Llama 3.1 8B in bf16 on 8 to 128 H100s, 33-39%; Llama 3 8B and 70B on 64
# A100s, 50.5-58.2%. 0.40 sits at the top of the H100 range and below the A100 one: a planning figure, not a
# promise. Override it with --mfu, or measure (docs/benchmarks.md).
DEFAULT_MFU = 0.40
RECOMPUTE_FACTOR = 4 / 3  # (6 + 2) / 6: training FLOPs per token with the forward recomputed, over without


@dataclass(frozen=True)
class Measurement:
    """One row of benchmarks/mfu.json."""

    preset: str
    gpu: str  # the catalog's gpu_model: A100, H100, H200, B200
    fp8_backend: str  # none | torchao | te
    fp8_recipe: str  # torchao: tensorwise | rowwise; te: delayed | current; "" with none
    seq_len: int
    micro_batch_size: int
    activation_checkpointing: bool
    compile: bool
    mfu: float
    tokens_per_s: float
    date: str  # ISO date of the measurement
    source: str  # where in docs/benchmarks.md the row is


@dataclass(frozen=True)
class MfuChoice:
    """An MFU and where it came from."""

    value: float  # MFU at the activation-checkpointing setting below
    activation_checkpointing: bool  # the setting `value` was measured (or is meant) at
    source: str  # "--mfu", "measured", "default"
    detail: str  # one line for the output
    measurement: Measurement | None = None  # the benchmarks/mfu.json row, where measured

    def at(self, activation_checkpointing: bool) -> float:
        """The MFU expected with (or without) full activation checkpointing."""
        if activation_checkpointing == self.activation_checkpointing:
            return self.value
        return self.value / RECOMPUTE_FACTOR if activation_checkpointing else self.value * RECOMPUTE_FACTOR


def load_measurements(path: Path | None = None) -> list[Measurement]:
    """The measured figures (benchmarks/mfu.json by default); none when the file is absent (clusterctl
    installed without the checkout)."""
    path = path or MEASURED_MFU_PATH
    try:
        data = json.loads(path.read_text())
    except FileNotFoundError:
        return []
    except (OSError, ValueError) as error:
        raise ClusterctlError(f"{path}: unreadable: {error}", EXIT_USAGE) from None
    rows = data.get("measurements") if isinstance(data, dict) else None
    if not isinstance(rows, list):
        raise ClusterctlError(f"{path}: expected an object with a 'measurements' list", EXIT_USAGE)
    return [_measurement(path, i, row) for i, row in enumerate(rows)]


@dataclass(frozen=True)
class MfuQuery:
    """What a measurement must match (preset, GPU, FP8 backend and recipe) and what makes one closer."""

    preset: str  # "" for a custom shape: no measurement applies
    gpu: str
    fp8_backend: str
    fp8_recipe: str
    seq_len: int
    compile: bool
    micro_batch_size: int


def choose_mfu(*, override: float | None, query: MfuQuery, measurements: list[Measurement]) -> MfuChoice:
    if override is not None:
        return MfuChoice(override, False, "--mfu", f"{override:.2f} from --mfu (without activation checkpointing)")
    q = query
    matches = [
        m for m in measurements
        if q.preset and (m.preset, m.gpu, m.fp8_backend, m.fp8_recipe) == (q.preset, q.gpu, q.fp8_backend,
                                                                            q.fp8_recipe)
    ]
    if matches:
        # the same sequence length first, then the same torch.compile setting (it moves MFU most: eager
        # torchao FP8 ran at a third of compiled), then the same micro-batch, then the most recent
        best = max(matches, key=lambda m: (m.seq_len == q.seq_len, m.compile == q.compile,
                                           m.micro_batch_size == q.micro_batch_size, m.date))
        return MfuChoice(
            best.mfu,
            best.activation_checkpointing,
            "measured",
            f"{best.mfu:.3f} measured {best.date}: {best.preset} on one {best.gpu}, fp8 "
            f"{_backend(best.fp8_backend, best.fp8_recipe)}, seq {best.seq_len} x micro-batch "
            f"{best.micro_batch_size}, compile {'on' if best.compile else 'off'}, activation checkpointing "
            f"{'on' if best.activation_checkpointing else 'off'} ({best.source}); one GPU, so multi-node "
            "communication is not in it",
            best,
        )
    what = f"{q.preset or 'this model'} on {q.gpu} with fp8 {_backend(q.fp8_backend, q.fp8_recipe)}"
    return MfuChoice(
        DEFAULT_MFU,
        False,
        "default",
        f"{DEFAULT_MFU:.2f} default (no measured figure for {what} in benchmarks/mfu.json; torchtitan publishes "
        "33-39% on H100, 50-58% on A100 with FSDP2; --mfu to override)",
    )


def _backend(backend: str, recipe: str) -> str:
    return f"{backend} {recipe}" if recipe else backend


_FIELDS: dict[str, type | tuple[type, ...]] = {
    "preset": str,
    "gpu": str,
    "fp8_backend": str,
    "fp8_recipe": str,
    "seq_len": int,
    "micro_batch_size": int,
    "activation_checkpointing": bool,
    "compile": bool,
    "mfu": (int, float),
    "tokens_per_s": (int, float),
    "date": str,
    "source": str,
}


def _measurement(path: Path, index: int, row: Any) -> Measurement:
    if not isinstance(row, dict):
        raise ClusterctlError(f"{path}: measurements[{index}]: expected an object", EXIT_USAGE)
    for key, kind in _FIELDS.items():
        value = row.get(key)
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ClusterctlError(
                f"{path}: measurements[{index}].{key}={value!r}: expected {_describe(kind)}", EXIT_USAGE
            )
    if not (math.isfinite(row["mfu"]) and 0 < row["mfu"] <= 1):
        raise ClusterctlError(
            f"{path}: measurements[{index}].mfu={row['mfu']!r}: allowed: a fraction in (0, 1]", EXIT_USAGE
        )
    return Measurement(**{key: row[key] for key in _FIELDS})


def _describe(kind: type | tuple[type, ...]) -> str:
    names = {str: "a string", int: "an integer", bool: "true or false"}
    return "a number" if isinstance(kind, tuple) else names[kind]
