"""SIGTERM and SIGINT (Ctrl-C): stop at the next step boundary on every rank, together.

A SIGTERM (spot interruption, Capacity Block end, node drain, ``torchrun`` shutting its workers down) may
reach one rank, some, or all of them, at any point of a step. The handler only sets a flag; at each step
boundary the ranks all_reduce(MAX) it, so when any rank was signalled every rank sees it at the same step, and
they save one checkpoint together and exit 0. When torchrun itself is signalled it passes SIGTERM on to its
workers and SIGKILLs them after its shutdown timeout: 30 s by default (torch 2.13: ``--shutdown-timeout`` or
TORCH_ELASTIC_SHUTDOWN_TIMEOUT; torch/distributed/run.py, launcher/api.py), so the rest of a step plus a
synchronous checkpoint must fit in that window. Jobs started by node_bootstrap.jobs pass --shutdown-timeout
110: the unit's 120 s stop grace (systemd TimeoutStopSec, node_bootstrap/jobs/spec.py STOP_GRACE_SECONDS)
less 10 s for torchrun's own exit.

Ctrl-C is the same request (issue 44: it used to end the run with a traceback and lose everything since the last
checkpoint): the terminal sends SIGINT to the whole foreground process group, so under torchrun every worker gets
it as well as the agent. A second Ctrl-C before the stop is done means "now": it raises KeyboardInterrupt, as
Python's default handler would, and ``python -m training`` says so in one line without saving. A SIGINT within
SAME_CTRL_C_S of the first is the same key press: torchrun's agent passes the Ctrl-C it got on to its workers
(its death signal, torch/distributed/elastic/agent/server/api.py), so they see it twice in a moment.
"""

from __future__ import annotations

import logging
import signal
import time
from types import FrameType

import torch
import torch.distributed as dist

log = logging.getLogger(__name__)

SAME_CTRL_C_S = 2.0  # a second SIGINT sooner than this is the launcher's forward of the first, not a new Ctrl-C


class StopRequest:
    """Installs SIGTERM and SIGINT handlers that record the signal; ``agreed()`` is the collective check."""

    def __init__(self, *, process_group: dist.ProcessGroup | None = None,
                 signals: tuple[int, ...] = (signal.SIGTERM, signal.SIGINT), same_ctrl_c_s: float = SAME_CTRL_C_S):
        # a group with a CPU (gloo) backend; None = the default group, which init_distributed gives a gloo
        # backend for CPU tensors also on CUDA: the flag is a CPU tensor, so the per-step check never
        # synchronizes the GPU
        self._group = process_group
        self._signals = signals
        self._local = False
        self._signal_name = ""  # the first signal this rank received ("" when the stop came from code or a peer)
        self._agreed_name = ""
        self._same_ctrl_c_s = same_ctrl_c_s
        self._first_sigint_s: float | None = None  # time.monotonic() of the first SIGINT
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

    @property
    def signal_name(self) -> str:
        """What the ranks agreed stopped them (after ``agreed()`` said so): "SIGINT" when any rank had a Ctrl-C,
        else "SIGTERM" (also for a stop ``request()``ed from code); "" before a stop was agreed."""
        return self._agreed_name

    def request(self) -> None:
        """Ask for a stop from code (what the signal handler does)."""
        self._local = True

    def _handle(self, signum: int, frame: FrameType | None) -> None:
        # Only set a flag: the handler runs between bytecodes of the main thread, possibly inside a
        # collective, so it must not take logging locks, save or exit here.
        if signum == signal.SIGINT:
            now = time.monotonic()
            if self._first_sigint_s is None:
                self._first_sigint_s = now
            elif now - self._first_sigint_s >= self._same_ctrl_c_s:
                raise KeyboardInterrupt  # a second Ctrl-C: stop now, without the save (python -m training says so)
        self._local = True
        self._signal_name = self._signal_name or signal.Signals(signum).name

    def agreed(self) -> bool:
        """Whether any rank has been asked to stop. Collective: every rank calls it at every step boundary."""
        # 0: no stop; 1: SIGTERM (or code); 2: SIGINT. MAX: every rank learns the same reason, so all of them log
        # the same stop line (for a job, the one its node's supervisor reads: node_bootstrap/job_contract.py)
        code = 0 if not self._local else 2 if self._signal_name == "SIGINT" else 1
        if dist.is_available() and dist.is_initialized():
            flag = torch.tensor([code], dtype=torch.int32)
            dist.all_reduce(flag, op=dist.ReduceOp.MAX, group=self._group)
            code = int(flag.item())
        stop = code > 0
        if stop:
            self._agreed_name = "SIGINT" if code == 2 else "SIGTERM"
            who = f"{self._signal_name or 'a request'} on this rank" if self._local else "a signal on another rank"
            log.warning("stop requested (%s): saving a checkpoint and exiting", who)
        return stop
