"""Process groups and FSDP2 + activation checkpointing (+ compile) on CPU with gloo."""

from __future__ import annotations

import contextlib
import os
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor

from training.errors import ConfigError
from training.fp8 import Fp8Config, build_fp8_backend
from training.model import Transformer, build_model_config
from training.parallelize import (
    ParallelConfig,
    apply_parallelism,
    build_data_parallel_mesh,
    destroy_distributed,
    init_distributed,
    set_process_group_timeout,
)

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(scope="module")
def dist_info():
    was_initialized = dist.is_initialized()
    info = init_distributed()
    yield info
    if not was_initialized:
        destroy_distributed()


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # see test_model.py
    yield
    torch.set_num_threads(before)


def build(info, parallel: ParallelConfig, fp8=None, seed: int = 0, **shape) -> Transformer:
    """The training build order: meta -> fp8 -> AC/compile/FSDP2 -> to_empty -> init_weights."""
    with torch.device("meta"):
        model = Transformer(build_model_config("tiny", **shape))
    if fp8 is not None:
        fp8.convert(model)
    apply_parallelism(model, parallel, build_data_parallel_mesh(info))
    model.to_empty(device=info.device)
    model.init_weights(seed=seed)
    return model


def successor_batches(steps: int, seq_len: int = 32):
    gen = torch.Generator().manual_seed(1)
    successor = torch.randperm(256, generator=gen)
    for _ in range(steps):
        tokens = torch.empty(8, seq_len + 1, dtype=torch.long)
        tokens[:, 0] = torch.randint(0, 256, (8,), generator=gen)
        for j in range(1, seq_len + 1):
            tokens[:, j] = successor[tokens[:, j - 1]]
        yield tokens[:, :-1], tokens[:, 1:]


def train(model, steps: int, fp8=None) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for inputs, targets in successor_batches(steps):
        with fp8.autocast() if fp8 else contextlib.nullcontext():
            logits = model(inputs)
        loss = F.cross_entropy(logits.flatten(0, 1).float(), targets.flatten())
        loss.backward()
        optimizer.step()
        optimizer.zero_grad()
        if fp8:
            fp8.post_optimizer_step(model)
        losses.append(loss.item())
    return losses


def test_single_process_gets_a_one_rank_gloo_group(dist_info):
    assert (dist_info.rank, dist_info.local_rank, dist_info.world_size) == (0, 0, 1)
    assert dist_info.device == torch.device("cpu") and dist_info.is_main
    assert dist.get_backend() == "gloo"
    assert init_distributed() == dist_info  # a second call joins the existing group


def test_the_process_group_timeout_is_the_start_up_one_then_the_training_one(dist_info):
    def timeout_s():
        backend = dist.distributed_c10d._get_default_group()._get_backend(torch.device("cpu"))
        return backend.options._timeout.total_seconds()
    assert timeout_s() == ParallelConfig().init_timeout_seconds == 600  # set by init_distributed
    try:
        set_process_group_timeout(ParallelConfig().train_timeout_seconds, dist_info)
        assert timeout_s() == 300
    finally:
        set_process_group_timeout(600, dist_info)


def test_fsdp2_with_activation_checkpointing_trains_like_the_plain_model(dist_info):
    plain = Transformer(build_model_config("tiny"))
    plain.init_weights(seed=0)
    sharded = build(dist_info, ParallelConfig(activation_checkpointing=True, param_dtype="float32"))
    # the wrapping: blocks are FSDP modules around checkpoint wrappers, parameters are DTensors
    assert type(sharded).__name__ == "FSDPTransformer"
    assert all(type(block).__name__ == "FSDPCheckpointWrapper" for block in sharded.layers)
    assert all(isinstance(p, DTensor) for p in sharded.parameters())
    for (name, p), q in zip(plain.named_parameters(), sharded.parameters(), strict=True):
        torch.testing.assert_close(p, q.full_tensor(), rtol=0, atol=0, msg=name)
    plain_losses, sharded_losses = train(plain, 12), train(sharded, 12)
    torch.testing.assert_close(sharded_losses, plain_losses, rtol=1e-4, atol=1e-5)
    assert plain_losses[-1] < plain_losses[0] - 1.0  # and it learns


def test_bf16_params_with_fp32_reduction(dist_info):
    model = build(dist_info, ParallelConfig(param_dtype="bfloat16", reduce_dtype="float32"))
    assert all(p.dtype == torch.float32 for p in model.parameters())  # sharded master weights stay fp32
    logits = model(torch.zeros(2, 8, dtype=torch.long))
    assert logits.dtype == torch.bfloat16  # compute in the gathered bf16 params
    logits.float().sum().backward()
    assert all(p.grad.dtype == torch.float32 for p in model.parameters())


def test_torchao_fp8_emulate_trains_under_fsdp2(dist_info):
    fp8 = build_fp8_backend(Fp8Config(backend="torchao", emulate=True))
    model = build(dist_info, ParallelConfig(param_dtype="float32"), fp8=fp8)
    assert sum(type(m).__name__ == "Float8Linear" for m in model.modules()) == 14  # 7 per block
    losses = train(model, 30, fp8)
    assert 5.0 < losses[0] < 7.0  # about ln(256) + the initial logit variance
    assert sum(losses[-5:]) / 5 < 0.5 * losses[0]


@pytest.mark.slow
def test_per_block_compile_trains(dist_info):
    """torch.compile of each block (Inductor, C++ on a CPU): one tiny run, as compiling is slow here."""
    import shutil

    if shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("Inductor needs a C++ compiler on the CPU and none is installed")
    began = time.monotonic()
    model = build(
        dist_info, ParallelConfig(compile=True, activation_checkpointing=True, param_dtype="float32")
    )
    losses = train(model, 3)
    assert all(loss == loss for loss in losses) and losses[-1] < losses[0]
    print(f"compiled run took {time.monotonic() - began:.1f}s")


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("param_dtype", "fp16", "parallel.param_dtype='fp16': allowed: bfloat16, float32"),
        ("reduce_dtype", "int8", "parallel.reduce_dtype='int8': allowed: bfloat16, float32"),
        ("train_timeout_seconds", 0,
         "parallel.train_timeout_seconds=0: allowed: an integer number of seconds, 1..86400"),
        ("init_timeout_seconds", "600",
         "parallel.init_timeout_seconds='600': allowed: an integer number of seconds, 1..86400"),
    ],
)
def test_invalid_parallel_config_names_the_field(field, value, message):
    with pytest.raises(ConfigError) as excinfo:
        ParallelConfig(**{field: value}).validate()
    assert str(excinfo.value) == message


TWO_RANK_SCRIPT = textwrap.dedent(
    """
    import torch, torch.distributed as dist
    from training.model import Transformer, build_model_config
    from training.parallelize import (
        ParallelConfig, apply_parallelism, build_data_parallel_mesh, init_distributed)
    info = init_distributed()
    with torch.device("meta"):
        model = Transformer(build_model_config("tiny"))
    apply_parallelism(model, ParallelConfig(param_dtype="float32"), build_data_parallel_mesh(info))
    model.to_empty(device="cpu")
    model.init_weights(seed=3)
    full = {n: p.full_tensor() for n, p in model.named_parameters()}
    local = model.layers[0].attention.wq.weight.to_local()
    if info.rank == 0:
        reference = Transformer(build_model_config("tiny"))
        reference.init_weights(seed=3)
        same = all(torch.equal(full[n], p) for n, p in reference.named_parameters())
        print("WORLD", info.world_size, "SAME_AS_ONE_PROCESS", same, "LOCAL_ROWS", local.shape[0])
    dist.destroy_process_group()
    """
)


@pytest.mark.slow
def test_two_ranks_shard_the_same_model_one_process_would_build(tmp_path):
    """Real torchrun, 2 gloo ranks: each rank holds half of every weight, and the gathered model is the one a
    single process builds from the same seed (each shard is drawn as its slice of the full tensor)."""
    script = tmp_path / "two_ranks.py"
    script.write_text(TWO_RANK_SCRIPT)
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    result = subprocess.run(
        [
            sys.executable,
            "-m",
            "torch.distributed.run",
            "--nproc_per_node=2",
            "--master_port=0",
            "--rdzv_backend=c10d",
            "--rdzv_endpoint=127.0.0.1:0",
            str(script),
        ],
        capture_output=True,
        text=True,
        timeout=300,
        env=env,
        cwd=tmp_path,
    )
    assert result.returncode == 0, result.stderr[-3000:]
    assert "WORLD 2 SAME_AS_ONE_PROCESS True LOCAL_ROWS 32" in result.stdout
