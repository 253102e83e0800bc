"""Staging an asynchronous checkpoint beside the training loop instead of inside it.

``dcp.async_save`` with its default stager copies the whole state into newly allocated pageable CPU memory
before it returns, on the training thread, and the trainer fingerprinted every tensor
(``verify.describe``) before that, also on the training thread. For the 1b preset on
an H100 that held the loop for 15 s per periodic save (docs/benchmarks.md).

``BackgroundStager`` moves both off the loop: at a save the loop only builds the state dict and hands it to a
staging thread, which

1. (on a GPU) waits, on its own CUDA stream, for the work the loop had queued when the save began (the
   optimizer step that produced the state): a side stream does not wait for the compute stream by itself,
2. describes the live state with its fingerprints (``verify.describe``: on a GPU, reductions on
   the device and one copy of the results),
3. copies it into CPU memory with torch's ``DefaultStager`` used as a synchronous copier
   (``StagingOptions(use_async_staging=False, use_non_blocking_copy=False)``): its ``StateDictStager``
   keeps one CPU buffer per live storage across saves (torch/distributed/checkpoint/_state_dict_stager.py,
   ``_cached_storage_mapping``), pinned when ``use_pinned_memory`` (CUDA only), so after the first save no
   memory is allocated or pinned again and device-to-host copies run at pinned speed.

DefaultStager's own asynchronous staging is not used: its side stream does not wait for the compute stream
(step 1), and the fingerprints must come from the same live state in the same job (step 2).

What keeps this correct:
- the live state must not change until the job is done: the loop calls ``Checkpointer.wait_for_staging``
  right before ``optimizer.step()``, so staging overlaps the next step's forward and backward only;
- the staged buffers of one save are reused by the next: at most one save is in flight (``Checkpointer.save``
  waits for the pending one before it stages again), so a buffer is never overwritten while it is written;
- DCP's planner verifies the staged copy against the fingerprints before anything is written
  (``verify.VerifyingSavePlanner``), so a wrong copy fails the save as before.

The API is detected at run time, not by version (read in torch 2.13's staging.py and state_dict_saver.py;
the H100 machine ran 2.11, not checked here): a torch without DefaultStager, those StagingOptions fields or
``async_save(async_stager=...)`` gets ``staging_api_available() == False``, and the Checkpointer stages
inside the save call as before.
"""

from __future__ import annotations

import dataclasses
import inspect
import time
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import nullcontext
from dataclasses import dataclass
from typing import Any

import torch
import torch.distributed.checkpoint as dcp

from training.checkpoint.verify import EntrySpec, describe
from training.errors import ConfigError

_STAGING_OPTIONS = {"use_pinned_memory", "use_shared_memory", "use_async_staging", "use_non_blocking_copy"}


def staging_api_available() -> bool:
    """Whether this torch has what BackgroundStager needs: ``DefaultStager`` with those ``StagingOptions``
    and ``dcp.async_save(..., async_stager=...)``."""
    try:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions  # noqa: F401
    except ImportError:
        return False
    if not dataclasses.is_dataclass(StagingOptions):
        return False
    fields = {f.name for f in dataclasses.fields(StagingOptions)}
    return _STAGING_OPTIONS <= fields and "async_stager" in inspect.signature(dcp.async_save).parameters


def use_pinned_memory(mode: str, device: torch.device) -> bool:
    """``checkpoint.staging`` -> whether the staging buffers are pinned. Pinning host memory needs CUDA."""
    cuda = device.type == "cuda" and torch.cuda.is_available()
    if mode == "pinned" and not cuda:
        raise ConfigError(f"checkpoint.staging={mode!r}: pinned host memory needs CUDA and this rank's device "
                          f"is {device}; allowed here: auto, pageable, inline")
    return cuda if mode == "auto" else mode == "pinned"


@dataclass
class StagingTimes:
    """Where one background staging spent its time (seconds, on the staging thread)."""

    describe_s: float | None = None  # fingerprints of the live state
    copy_s: float | None = None  # the copy into the CPU buffers (the first save also allocates and pins them)


class BackgroundStager:
    """One per Checkpointer: a staging thread, a CUDA stream on GPUs, and torch's DefaultStager whose CPU
    buffers are kept across saves. ``job()`` gives the stager of one save."""

    def __init__(self, *, device: torch.device, pinned: bool) -> None:
        from torch.distributed.checkpoint.staging import DefaultStager, StagingOptions

        self.device = device
        self.pinned = pinned
        self._copier = DefaultStager(StagingOptions(
            use_pinned_memory=pinned, use_shared_memory=False, use_async_staging=False,
            use_non_blocking_copy=False,
        ))
        self._executor = ThreadPoolExecutor(max_workers=1, thread_name_prefix="checkpoint-staging")
        on_cuda = device.type == "cuda" and torch.cuda.is_available()
        self._stream = torch.cuda.Stream(device=device) if on_cuda else None

    def job(self) -> StagingJob:
        return StagingJob(self)

    def close(self) -> None:
        """Stop the thread and drop the buffers (call after the last save completed)."""
        self._executor.shutdown(wait=True)
        self._copier.close()


class StagingJob:
    """The ``async_stager`` of one ``dcp.async_save``: ``stage`` returns at once with a future of the staged
    copy; ``description`` is the future of the live state's description the planner verifies against."""

    should_synchronize_after_execute = False  # DCP's AsyncStager protocol: the caller waits (wait_for_staging)

    def __init__(self, stager: BackgroundStager) -> None:
        self._stager = stager
        self.description: Future[dict[str, EntrySpec]] = Future()
        self.staged: Future[Any] | None = None
        self.times = StagingTimes()

    def stage(self, state_dict: Any) -> Future[Any]:
        ready = None
        if self._stager._stream is not None:  # the loop's queued work, up to and with the optimizer step
            ready = torch.cuda.Event()
            ready.record(torch.cuda.current_stream(self._stager.device))
        self.staged = self._stager._executor.submit(self._run, state_dict, ready)
        return self.staged

    def _run(self, state_dict: Any, ready: torch.cuda.Event | None) -> Any:
        """Describe, then copy. A failure does not fail this future: it fails ``description``, which DCP's
        planner reads inside its collective planning step, so the save fails on every rank alike (a rank
        whose upload thread raised before planning would leave the others waiting in DCP's collectives); the
        live state returned in place of a copy is never written."""
        stream = self._stager._stream
        try:
            with torch.cuda.stream(stream) if stream is not None else nullcontext():
                if stream is not None and ready is not None:
                    stream.wait_event(ready)
                began = time.perf_counter()
                description = describe(state_dict, fingerprints=True)
                self.times.describe_s = time.perf_counter() - began
                began = time.perf_counter()
                staged = self._stager._copier.stage(state_dict)  # blocking copies: done when it returns
                self.times.copy_s = time.perf_counter() - began
        except Exception as exc:
            self.description.set_exception(exc)
            return state_dict
        self.description.set_result(description)
        return staged

    def synchronize_staging(self) -> None:
        if self.staged is not None:
            self.staged.result()

    def close(self) -> None:
        """Nothing of its own: the buffers belong to the BackgroundStager."""
