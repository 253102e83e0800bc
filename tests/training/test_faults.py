"""The SIGTERM flag in one process (the cross-rank agreement runs for real in test_torchrun.py)."""

from __future__ import annotations

import os
import signal
import socket

import torch.distributed as dist

from training.faults import StopRequest


def test_sigterm_sets_the_flag_instead_of_ending_the_process():
    with StopRequest() as stop:
        assert not stop.requested_locally and not stop.agreed()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested_locally
        assert stop.agreed()


def test_uninstall_restores_the_previous_handler():
    seen = []

    def previous(signum, frame):
        seen.append(signum)

    old = signal.signal(signal.SIGTERM, previous)
    try:
        with StopRequest():
            assert signal.getsignal(signal.SIGTERM) is not previous
        assert signal.getsignal(signal.SIGTERM) is previous
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, old)


def test_agreement_is_a_collective_on_the_process_group():
    initialized_here = not dist.is_initialized()
    if initialized_here:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        stop = StopRequest()
        assert stop.agreed() is False
        stop.request()
        assert stop.agreed() is True
    finally:
        if initialized_here:
            dist.destroy_process_group()
