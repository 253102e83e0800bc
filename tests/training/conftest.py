"""Fixtures the training tests share (opted into per module with ``pytestmark = pytest.mark.usefixtures(...)``)."""

from __future__ import annotations

import socket

import pytest
import torch
import torch.distributed as dist

from training.parallel.process_group import destroy_distributed, init_distributed


@pytest.fixture()
def one_torch_thread():
    # 2-core CI boxes shared by parallel jobs: a second OpenMP thread spin-waits for a busy core and makes the
    # tiny models' matmuls ~50x slower
    before = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(before)


@pytest.fixture(scope="module")
def one_rank_process_group():
    """A 1-rank gloo group, as init_distributed() gives a plain `python -m training`; an existing group is
    used as it is."""
    if dist.is_initialized():
        yield
        return
    with socket.socket() as sock:
        sock.bind(("127.0.0.1", 0))
        port = sock.getsockname()[1]
    dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    yield
    dist.destroy_process_group()


@pytest.fixture(scope="module")
def dist_info():
    """init_distributed()'s view of the process (a 1-rank gloo group of its own unless one exists)."""
    was_initialized = dist.is_initialized()
    info = init_distributed()
    yield info
    if not was_initialized:
        destroy_distributed()
