"""SIGTERM: stop at the next step boundary on every rank, together.

A SIGTERM (spot interruption, Capacity Block end, node drain, ``torchrun`` shutting its workers down) may
reach one rank, some, or all of them, at any point of a step. The handler only sets a flag; at each step
boundary the ranks all_reduce(MAX) it, so when any rank was signalled every rank sees it at the same step, and
they save one checkpoint together and exit 0. When torchrun itself is signalled it passes SIGTERM on to its
workers and SIGKILLs them after its shutdown timeout: 30 s by default (torch 2.13: ``--shutdown-timeout`` or
TORCH_ELASTIC_SHUTDOWN_TIMEOUT; torch/distributed/run.py, launcher/api.py), so the rest of a step plus a
synchronous checkpoint must fit in that window. Jobs started by node_bootstrap.jobs pass --shutdown-timeout
110: the unit's 120 s stop grace (systemd TimeoutStopSec, node_bootstrap/jobs/spec.py STOP_GRACE_SECONDS)
less 10 s for torchrun's own exit.
"""

from __future__ import annotations

import logging
import signal
from types import FrameType

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)


class StopRequest:
    """Installs a SIGTERM handler that records the signal; ``agreed()`` is the collective check."""

    def __init__(self, *, process_group: dist.ProcessGroup | None = None,
                 signals: tuple[int, ...] = (signal.SIGTERM,)):
        # a group with a CPU (gloo) backend; None = the default group, which init_distributed gives a gloo
        # backend for CPU tensors also on CUDA: the flag is a CPU tensor, so the per-step check never
        # synchronizes the GPU
        self._group = process_group
        self._signals = signals
        self._local = False
        self._previous: dict[int, object] = {}

    def install(self) -> StopRequest:
        for sig in self._signals:
            self._previous[sig] = signal.signal(sig, self._handle)
        return self

    def uninstall(self) -> None:
        for sig, handler in self._previous.items():
            signal.signal(sig, handler)  # type: ignore[arg-type]
        self._previous.clear()

    def __enter__(self) -> StopRequest:
        return self.install()

    def __exit__(self, *exc: object) -> None:
        self.uninstall()

    @property
    def requested_locally(self) -> bool:
        return self._local

    def request(self) -> None:
        """Ask for a stop from code (what the signal handler does)."""
        self._local = True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Only set a flag: the handler runs between bytecodes of the main thread, possibly inside a
        # collective, so it must not take logging locks, save or exit here.
        self._local = True

    def agreed(self) -> bool:
        """Whether any rank has been asked to stop. Collective: every rank calls it at every step boundary."""
        if not (dist.is_available() and dist.is_initialized()):
            return self._local
        flag = torch.tensor([1 if self._local else 0], dtype=torch.int32)
        dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
        stop = bool(flag.item())
        if stop:
            who = "this rank" if self._local else "another rank"
            log.warning("stop requested (SIGTERM on %s): saving a checkpoint and exiting", who)
        return stop
