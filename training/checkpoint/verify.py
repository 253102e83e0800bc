"""A checkpoint is verified before it counts.

At each save, before DCP copies anything, the state is described (on the training thread, or on the
background staging thread while the loop waits to change the state: staging.py): per entry its
kind, dtype, global and local shape and, for an asynchronous save, a fingerprint of its bits (the sum of the
elements' bit patterns as integers of their width, wrapping: exact and independent of summation order, so a
GPU tensor and its CPU copy agree). The planner DCP runs for that save checks the state it is handed against
the description: for an asynchronous save that is the staged CPU copy about to be written (on DCP's
background thread), for a blocking save the live state. It checks the same entries, kinds, dtypes and
shapes, no FP8 dtype (the checkpoint holds high-precision values), every floating value finite, and for
asynchronous saves the same bits as the live state had when the save began: the check that catches a
staging copy of uninitialised memory, which is finite more often than not.

A failed check raises inside DCP's planning step; DCP gathers the failure to the coordinator and fails the
save on every rank before any shard or ``.metadata`` is written (DefaultSavePlanner runs inside
``_DistWrapper.reduce_scatter``), so the checkpoint never gets its marker and ``--resume auto`` never picks it.

Cost: one read of every tensor for the description (fingerprints only for asynchronous saves; on a GPU one
reduction kernel per tensor, then one device-to-host copy of the results) and two reads of the staged copy
on the background thread, in chunks of ``CHUNK_ELEMENTS`` so the temporaries stay small (measured figures in
docs/operations.md).
"""

from __future__ import annotations

import time
import zlib
from concurrent.futures import Future
from dataclasses import dataclass
from typing import Any

import torch
from torch.distributed.checkpoint import DefaultSavePlanner
from torch.distributed.tensor import DTensor

from training.checkpoint.state import iter_leaves

CHUNK_ELEMENTS = 1 << 24  # elements per pass of the checks: bounds their temporaries to ~128 MiB
MAX_PROBLEMS_SHOWN = 5
FP8_DTYPES = frozenset(
    getattr(torch, name) for name in ("float8_e4m3fn", "float8_e5m2", "float8_e4m3fnuz", "float8_e5m2fnuz")
    if hasattr(torch, name)
)
_BITS_AS_INT = {1: torch.uint8, 2: torch.int16, 4: torch.int32, 8: torch.int64}
_PLAIN_VALUES = (bool, int, float, str, type(None))


class CheckpointVerificationError(RuntimeError):
    """The state about to be written is not the state that was saved (or is not finite)."""


@dataclass(frozen=True)
class EntrySpec:
    """What one entry of the state looked like when the save began."""

    kind: str  # "DTensor", "Tensor", or the Python type name of a non-tensor value
    dtype: torch.dtype | None = None
    shape: tuple[int, ...] | None = None  # global shape
    local_shape: tuple[int, ...] | None = None  # this rank's shard (= shape for a plain tensor)
    fingerprint: int | None = None  # tensors: wrapped sum of the bit patterns (_bit_sum); bytes: CRC-32
    value: Any = None  # plain Python values (optimizer hyperparameters, ...): the value itself


def describe(state: Any, *, fingerprints: bool) -> dict[str, EntrySpec]:
    """The description ``verify`` checks against; no collectives, one device-to-host copy per device."""
    specs: dict[str, EntrySpec] = {}
    pending: list[tuple[str, torch.Tensor, int]] = []
    for key, value in iter_leaves(state):
        if isinstance(value, torch.Tensor):
            local = _local(value)
            specs[key] = EntrySpec(kind=_tensor_kind(value), dtype=value.dtype, shape=tuple(value.shape),
                                   local_shape=tuple(local.shape))
            if fingerprints:
                pending.append((key, _bit_sum(local), local.element_size()))
        else:
            specs[key] = _value_spec(value)
    if pending:
        sums = _to_host([s for _, s, _ in pending])
        for (key, _, size), total in zip(pending, sums, strict=True):
            specs[key] = _replace_fingerprint(specs[key], _fingerprint(total, size))
    return specs


def verify(state: Any, expected: dict[str, EntrySpec]) -> None:
    """Raise CheckpointVerificationError naming what differs from ``expected`` or is not finite."""
    problems: list[str] = []
    seen: set[str] = set()
    tensors: list[tuple[str, torch.Tensor, EntrySpec]] = []
    for key, value in iter_leaves(state):
        seen.add(key)
        spec = expected.get(key)
        if spec is None:
            problems.append(f"{key}: not in the state the save began with")
            continue
        if isinstance(value, torch.Tensor):
            problem = _tensor_problem(value, spec)
            if problem:
                problems.append(f"{key}: {problem}")
            else:
                tensors.append((key, value, spec))
        elif _value_spec(value) != spec:
            problems.append(f"{key}: {_value_spec(value)} where the save began with {spec}")
    problems += [f"{key}: missing from the staged state" for key in expected.keys() - seen]
    problems += _content_problems(tensors)
    if problems:
        shown = "; ".join(problems[:MAX_PROBLEMS_SHOWN])
        more = f" (and {len(problems) - MAX_PROBLEMS_SHOWN} more)" if len(problems) > MAX_PROBLEMS_SHOWN else ""
        raise CheckpointVerificationError(f"checkpoint state failed verification: {shown}{more}")


class VerifyingSavePlanner(DefaultSavePlanner):
    """DCP's default save planner, after ``verify`` passed on the state DCP is about to write. ``expected``
    may be a future of the description (a background staging job describes the live state before it copies
    it, staging.py); DCP plans only after staging finished, so it is resolved by then."""

    def __init__(self, expected: dict[str, EntrySpec] | Future[dict[str, EntrySpec]]) -> None:
        super().__init__()
        self.expected = expected
        self.verify_s: float | None = None  # how long the check took (seconds, on DCP's thread)

    def set_up_planner(self, state_dict: Any, storage_meta: Any = None, is_coordinator: bool = False) -> None:
        began = time.perf_counter()
        expected = self.expected.result() if isinstance(self.expected, Future) else self.expected
        verify(state_dict, expected)
        self.verify_s = time.perf_counter() - began
        super().set_up_planner(state_dict, storage_meta, is_coordinator)


def _tensor_problem(value: torch.Tensor, spec: EntrySpec) -> str | None:
    local = _local(value)
    if _tensor_kind(value) != spec.kind or type(local) not in (torch.Tensor, torch.nn.Parameter):
        return f"a {type(value).__name__} over a {type(local).__name__}, expected a {spec.kind} over a Tensor"
    if value.dtype != spec.dtype or value.dtype in FP8_DTYPES:
        return f"dtype {value.dtype}, expected {spec.dtype} (and no FP8 dtype)"
    if tuple(value.shape) != spec.shape or tuple(local.shape) != spec.local_shape:
        return (f"shape {tuple(value.shape)} (local {tuple(local.shape)}), expected {spec.shape} "
                f"(local {spec.local_shape})")
    return None


def _content_problems(tensors: list[tuple[str, torch.Tensor, EntrySpec]]) -> list[str]:
    """Non-finite values and changed bits, read back with one device-to-host copy per device."""
    if not tensors:
        return []
    finite = _to_host([_all_finite(_local(t)) for _, t, _ in tensors])
    fingerprinted = [i for i, (_, _, spec) in enumerate(tensors) if spec.fingerprint is not None]
    sums: list[int | None] = [None] * len(tensors)
    if fingerprinted:
        totals = _to_host([_bit_sum(_local(tensors[i][1])) for i in fingerprinted])
        for i, total in zip(fingerprinted, totals, strict=True):
            sums[i] = _fingerprint(total, tensors[i][1].element_size())
    problems = []
    for (key, _, spec), ok, total in zip(tensors, finite, sums, strict=True):
        if not ok:
            problems.append(f"{key}: non-finite values (NaN or Inf)")
        elif spec.fingerprint is not None and total != spec.fingerprint:
            problems.append(f"{key}: its bits differ from the live tensor's when the save began "
                            "(a bad staging copy)")
    return problems


def _bit_sum(tensor: torch.Tensor) -> torch.Tensor:
    """0-d int64 tensor on ``tensor``'s device whose value modulo 2**(8 * element size) is the sum of the
    elements' bit patterns (read as integers of the element's width, wrapping): exact, and the same for any
    summation order and device. Same-width integer sums run at memory speed; widening ones do not."""
    flat = tensor.detach().reshape(-1)
    int_dtype = _BITS_AS_INT.get(flat.element_size())
    if int_dtype is None:
        raise CheckpointVerificationError(f"cannot fingerprint a {flat.dtype} tensor")
    bits = flat.view(int_dtype)
    total = torch.zeros((), dtype=torch.int64, device=flat.device)
    for start in range(0, bits.numel(), CHUNK_ELEMENTS):
        total += bits[start:start + CHUNK_ELEMENTS].sum(dtype=int_dtype)
    return total


def _fingerprint(total: int, element_size: int) -> int:
    return total % (1 << (8 * element_size))


def _all_finite(tensor: torch.Tensor) -> torch.Tensor:
    """0-d bool tensor: every element is finite. On the CPU a chunk whose sum is finite is (a NaN or an Inf
    makes the sum NaN or Inf) and needs no element-wise pass, several times faster; on a GPU the
    element-wise pass is fast and needs no host sync per chunk."""
    flat = tensor.detach().reshape(-1)
    ok = torch.ones((), dtype=torch.bool, device=flat.device)
    if not (flat.is_floating_point() or flat.is_complex()):
        return ok
    for start in range(0, flat.numel(), CHUNK_ELEMENTS):
        chunk = flat[start:start + CHUNK_ELEMENTS]
        if flat.device.type == "cpu" and bool(torch.isfinite(chunk.sum())):
            continue
        ok &= torch.isfinite(chunk).all()  # also where a sum of finite values overflowed
    return ok


def _to_host(scalars: list[torch.Tensor]) -> list[Any]:
    """The values of 0-d tensors, with one device-to-host copy per device (not one sync per tensor)."""
    values: list[Any] = [None] * len(scalars)
    by_device: dict[torch.device, list[int]] = {}
    for i, scalar in enumerate(scalars):
        by_device.setdefault(scalar.device, []).append(i)
    for indices in by_device.values():
        for i, value in zip(indices, torch.stack([scalars[i] for i in indices]).tolist(), strict=True):
            values[i] = value
    return values


def _value_spec(value: Any) -> EntrySpec:
    if isinstance(value, bytes | bytearray):
        return EntrySpec(kind=type(value).__name__, fingerprint=zlib.crc32(value))
    if isinstance(value, _PLAIN_VALUES):
        return EntrySpec(kind=type(value).__name__, value=value)
    return EntrySpec(kind=type(value).__name__)


def _replace_fingerprint(spec: EntrySpec, fingerprint: int) -> EntrySpec:
    return EntrySpec(kind=spec.kind, dtype=spec.dtype, shape=spec.shape, local_shape=spec.local_shape,
                     fingerprint=fingerprint)


def _tensor_kind(value: torch.Tensor) -> str:
    return "DTensor" if isinstance(value, DTensor) else "Tensor"


def _local(value: torch.Tensor) -> torch.Tensor:
    return value._local_tensor if isinstance(value, DTensor) else value
