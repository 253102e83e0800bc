"""The imports of a process that runs one of the package's programs (python -m training, python -m training.bench,
the nodes' torchrun agent): torch's ~250k objects, built once and alive until the process exits."""

from __future__ import annotations

import contextlib
import gc
from collections.abc import Iterator


@contextlib.contextmanager
def frozen_imports(freeze: bool = True) -> Iterator[None]:
    """The imports run with the cycle collector off, and what they built is frozen after (gc.freeze).

    Every collection the imports set off walks a heap that only grows and finds nothing to free: ~0.25 CPU-s of
    a tiny CPU trainer's start on a 2-core VM, a start that is on the restart's critical path (docs/benchmarks.md).
    Frozen, no later collection, the interpreter's last one at exit included, walks those objects again.

    ``freeze=False``, for a caller that goes on afterwards (a test), leaves the collector alone: what is alive
    when the freeze comes is never collected.
    """
    if not freeze:
        yield
        return
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
        gc.freeze()
    finally:
        if was_enabled:
            gc.enable()
