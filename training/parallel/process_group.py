"""The process groups: join (or create) the default group, set its timeouts, leave it, and free what holds it.

Under torchrun every rank reads RANK / LOCAL_RANK / WORLD_SIZE (and MASTER_ADDR / MASTER_PORT) from the
environment. Run as a plain process, the same code path gets a one-rank process group on a free local port,
so FSDP2 runs on a 1-rank mesh instead of taking a separate non-distributed branch.
"""

from __future__ import annotations

import datetime
import gc
import logging
import os
import socket
import warnings
from dataclasses import dataclass

import torch
import torch.distributed as dist
from torch.distributed.device_mesh import DeviceMesh

from training.config.parallel import DEFAULT_INIT_TIMEOUT_S
from training.errors import ConfigError
from training.parallel.layout import Layout

TORCHRUN_ENV = ("RANK", "LOCAL_RANK", "WORLD_SIZE")

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class DistInfo:
    """Where this process sits in the job."""

    rank: int  # global rank
    local_rank: int  # rank on this node (= the GPU index under torchrun)
    world_size: int  # processes in the job
    device: torch.device  # cuda:<local_rank>, or cpu
    # processes per node (torchrun's LOCAL_WORLD_SIZE): torchrun numbers ranks node by node, so this rank's
    # node is rank // local_world_size (the local checkpoint tier places replicas on the next node by it)
    local_world_size: int = 1
    layout: Layout | None = None  # the job's degrees (train() resolves them); None: FSDP over every rank

    @property
    def dp_size(self) -> int:
        """Data-parallel ranks: the ranks that read different samples (world / tp)."""
        return self.layout.dp_size if self.layout else self.world_size

    @property
    def dp_rank(self) -> int:
        """This rank's data-parallel rank: the ranks of one tp group share it, and read the same samples."""
        return self.layout.dp_rank(self.rank) if self.layout else self.rank

    @property
    def node(self) -> int:
        return self.rank // self.local_world_size

    @property
    def is_main(self) -> bool:
        return self.rank == 0


def init_distributed(timeout_s: float = DEFAULT_INIT_TIMEOUT_S) -> DistInfo:
    """Join (or create) the default process group, with a `timeout_s` for its collectives on every backend,
    and pick this rank's device.

    CUDA: ``cuda:<LOCAL_RANK>`` with NCCL for CUDA tensors plus gloo for CPU tensors (the DCP async save and
    small CPU-side agreements need a CPU backend; torchtitan initialises the same pair). CPU: gloo. Without
    torchrun's variables: a single-process group on a free port of 127.0.0.1. Calling it again returns the
    existing group's view."""
    use_cuda = torch.cuda.is_available()
    if all(name in os.environ for name in TORCHRUN_ENV):
        rank, local_rank, world_size = (_env_int(name) for name in TORCHRUN_ENV)
        init_method = "env://"
    else:
        rank, local_rank, world_size = 0, 0, 1
        init_method = f"tcp://127.0.0.1:{_free_port()}"
    device = torch.device("cuda", local_rank) if use_cuda else torch.device("cpu")
    if use_cuda:
        torch.cuda.set_device(device)
    if not dist.is_initialized():
        backend = "cpu:gloo,cuda:nccl" if use_cuda else "gloo"
        dist.init_process_group(backend, init_method=init_method, rank=rank, world_size=world_size,
                                timeout=datetime.timedelta(seconds=timeout_s))
    else:
        rank, world_size = dist.get_rank(), dist.get_world_size()
    local_world_size = _env_int("LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in os.environ else 1
    if local_world_size < 1 or world_size % local_world_size:
        local_world_size = 1  # not torchrun's homogeneous layout: every rank its own node
    return DistInfo(rank=rank, local_rank=local_rank, world_size=world_size, device=device,
                    local_world_size=local_world_size)


def launch_sizes() -> tuple[int, int]:
    """(world size, ranks per node) as torchrun set them, read before any process group exists (a plain
    process: one rank on one node), so a layout that cannot run is refused before the rendezvous."""
    if not all(name in os.environ for name in TORCHRUN_ENV):
        return 1, 1
    world_size = _env_int("WORLD_SIZE")
    local_world_size = _env_int("LOCAL_WORLD_SIZE") if "LOCAL_WORLD_SIZE" in os.environ else 1
    if local_world_size < 1 or world_size % local_world_size:
        local_world_size = 1  # not torchrun's homogeneous layout: as init_distributed reads it
    return world_size, local_world_size


def set_process_group_timeout(timeout_s: float, info: DistInfo) -> None:
    """Set the default group's collective timeout (every backend; the data-parallel mesh is that group).

    A barrier first, as torchtitan's set_pg_timeouts does: a slow rank may still be inside an operation the
    longer start-up timeout allows while a fast one already issues a collective under the short one."""
    if not dist.is_initialized():
        return
    if info.device.type == "cuda":
        dist.barrier(device_ids=[info.local_rank])
        torch.cuda.synchronize(info.device)
    else:
        dist.barrier()
    # No public API sets a live group's timeout in torch 2.13; torchtitan calls the same function.
    dist.distributed_c10d._set_pg_timeout(datetime.timedelta(seconds=timeout_s), None)
    log.info("process group timeout now %.0f s", timeout_s)


def destroy_distributed() -> None:
    if dist.is_initialized():
        dist.destroy_process_group()


def release_process_groups(*, destroy: bool) -> None:
    """At the end of the process, before the interpreter's shutdown: leave the process group (with `destroy`)
    and free what still holds it, so the groups' C++ threads (the TCPStore's server, gloo's transport loop and
    workers) are joined now. destroy_process_group only unregisters a group: its object lives on while
    anything refers to it, and every DeviceMesh the run built does (its `_pg_registry`), kept by the model's
    reference cycles, by an error's traceback, and by DTensor's sharding-propagation cache for the whole
    process. Left to the interpreter's shutdown, a worker that drops a tensor then needs the GIL of an
    interpreter half torn down, and the process aborts ("terminate called without an active exception", exit
    -6 where the CLI returned 0 or 2). Not for a process that trains again: the meshes it clears are dead."""
    if destroy:
        destroy_distributed()
    if dist.is_initialized():  # left up on purpose (a failed NCCL group): nothing of it can be freed
        return
    # The scan sees what the collector tracks: in python -m training, only what was built after its imports
    # were frozen (gc.freeze), the meshes among it. isinstance on some of torch's lazily imported objects warns
    # (a FutureWarning from torch._library's fake script objects): the scan must print nothing after the CLI's
    # last line ("config error: ...")
    with warnings.catch_warnings():
        warnings.simplefilter("ignore")
        meshes = [obj for obj in gc.get_objects() if isinstance(obj, DeviceMesh)]
    for mesh in meshes:
        registry = getattr(mesh, "_pg_registry", None)  # torch 2.13: group name -> ProcessGroup
        if isinstance(registry, dict):
            registry.clear()
    del meshes
    gc.collect()  # the model's cycles, and with them the last references to the groups


def _env_int(name: str) -> int:
    value = os.environ[name]
    try:
        return int(value)
    except ValueError:
        raise ConfigError(f"environment {name}={value!r}: allowed: an integer (set by torchrun)") from None


def _free_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_STREAM) as sock:
        sock.bind(("127.0.0.1", 0))
        return sock.getsockname()[1]
