"""Process groups and FSDP2 + activation checkpointing (+ compile) on CPU with gloo."""

from __future__ import annotations

import contextlib
import os
import textwrap
import time
from pathlib import Path

import pytest
import torch
import torch.distributed as dist
import torch.nn.functional as F
from torch.distributed.tensor import DTensor
from torchrun_support import Run, run_ranks

from training.config.parallel import ParallelConfig
from training.errors import ConfigError
from training.fp8 import Fp8Config, build_fp8_backend
from training.model import Transformer, build_model_config
from training.parallel.layout import Layout
from training.parallel.mesh import build_mesh
from training.parallel.parallelize import apply_parallelism
from training.parallel.process_group import init_distributed, set_process_group_timeout

pytestmark = pytest.mark.usefixtures("one_torch_thread")

REPO = Path(__file__).resolve().parents[2]


def build(info, parallel: ParallelConfig, fp8=None, seed: int = 0, **shape) -> Transformer:
    """The training build order: meta -> fp8 -> AC/compile/FSDP2 -> to_empty -> init_weights."""
    with torch.device("meta"):
        model = Transformer(build_model_config("tiny", **shape))
    if fp8 is not None:
        fp8.convert(model)
    apply_parallelism(model, parallel, build_mesh(Layout(1, info.world_size, 1), info.device.type))
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


def train(model, steps: int, fp8=None, loss_chunk_tokens: int = 0) -> list[float]:
    optimizer = torch.optim.AdamW(model.parameters(), lr=3e-3)
    losses = []
    for inputs, targets in successor_batches(steps):
        with fp8.autocast() if fp8 else contextlib.nullcontext():
            if loss_chunk_tokens:  # the fused output head + loss, inside the root's forward
                loss = model(inputs, targets, loss_chunk_tokens=loss_chunk_tokens)
            else:
                logits = model(inputs)
        if not loss_chunk_tokens:
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
def test_per_block_compile_trains_with_the_full_logits_and_the_fused_loss(dist_info):
    """torch.compile of each block (Inductor, C++ on a CPU), with activation checkpointing: a few steps with the
    loss on the full logits, then a few with the fused loss on the same model. The blocks are compiled once (a
    cold compile costs ~20 CPU-s here); the root's forward, where the fused loss runs, stays eager."""
    import shutil

    if shutil.which(os.environ.get("CXX", "g++")) is None:
        pytest.skip("Inductor needs a C++ compiler on the CPU and none is installed")
    began = time.monotonic()
    model = build(
        dist_info, ParallelConfig(compile=True, activation_checkpointing=True, param_dtype="float32")
    )
    for loss_chunk_tokens in (0, 100):
        losses = train(model, 3, loss_chunk_tokens=loss_chunk_tokens)
        assert all(loss == loss for loss in losses) and losses[-1] < losses[0], (loss_chunk_tokens, losses)
    print(f"compiled runs took {time.monotonic() - began:.1f}s")


def sharded_grads(model, inputs, targets, loss_chunk_tokens: int) -> dict[str, torch.Tensor]:
    """One forward/backward; each parameter's gradient, gathered whole (the reduce-scattered shards)."""
    model.zero_grad(set_to_none=True)
    if loss_chunk_tokens:
        loss = model(inputs, targets, loss_chunk_tokens=loss_chunk_tokens)
    else:
        loss = F.cross_entropy(model(inputs).flatten(0, 1).float(), targets.flatten())
    loss.backward()
    return {name: p.grad.full_tensor() for name, p in model.named_parameters()}


def test_fused_loss_under_fsdp2_gives_the_full_logits_gradients(dist_info):
    """The output head lives in the root FSDP group: the fused loss runs inside the root's forward, where its
    weight is gathered, and its gradient reaches the sharded parameter like the full-logits path's does."""
    inputs, targets = next(successor_batches(1))
    model = build(dist_info, ParallelConfig(param_dtype="float32"))
    full = sharded_grads(model, inputs, targets, 0)
    fused = sharded_grads(model, inputs, targets, 48)  # 8 x 32 tokens: 5 chunks of 48 and one of 16
    assert isinstance(model.output.weight.grad, DTensor) and fused["output.weight"].abs().sum() > 0
    for name, grad in full.items():
        torch.testing.assert_close(fused[name], grad, rtol=1e-5, atol=1e-7, msg=name)


def test_fused_loss_with_bf16_params_trains_like_the_full_logits(dist_info):
    full = train(build(dist_info, ParallelConfig(param_dtype="bfloat16")), 12)
    fused = train(build(dist_info, ParallelConfig(param_dtype="bfloat16")), 12, loss_chunk_tokens=100)
    torch.testing.assert_close(fused, full, rtol=2e-2, atol=2e-2)
    assert fused[-1] < fused[0] - 1.0


def test_torchao_fp8_emulate_with_the_fused_loss(dist_info):
    """The output head is never FP8-converted (fp8.HIGH_PRECISION_MODULES): the fused loss reads its plain
    weight while the blocks run Float8Linear."""
    fp8 = build_fp8_backend(Fp8Config(backend="torchao", emulate=True))
    model = build(dist_info, ParallelConfig(param_dtype="float32"), fp8=fp8)
    assert type(model.output).__name__ == "Linear"
    inputs, targets = next(successor_batches(1))
    full, fused = (sharded_grads(model, inputs, targets, chunk) for chunk in (0, 64))
    torch.testing.assert_close(fused["output.weight"], full["output.weight"], rtol=1e-5, atol=1e-7)
    # upstream of the head a float32 rounding difference in the activation gradient can move an FP8 cast to
    # the neighbouring value (measured: up to 1.4e-4 of a gradient's norm), so the blocks compare by norm
    for name, grad in full.items():
        assert ((fused[name] - grad).norm() / grad.norm()).item() < 1e-3, name
    losses = train(model, 30, fp8, loss_chunk_tokens=64)
    assert sum(losses[-5:]) / 5 < 0.5 * losses[0]


@pytest.mark.parametrize(
    ("field", "value", "message"),
    [
        ("loss_chunk_tokens", -1, "parallel.loss_chunk_tokens=-1: allowed: an integer >= 0 (0 = the loss on "
         "the full logits, N = output head and loss fused over chunks of N tokens)"),
        ("loss_chunk_tokens", 1.5, "parallel.loss_chunk_tokens=1.5: allowed: an integer >= 0 (0 = the loss on "
         "the full logits, N = output head and loss fused over chunks of N tokens)"),
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


# One start of 2 gloo ranks (torchrun_support.run_ranks) for both checks below: each start costs seconds of CPU.
TWO_RANK_SCRIPT = textwrap.dedent(
    """
    import gc
    import torch, torch.distributed as dist, torch.nn.functional as F
    from training.model import Transformer, build_model_config
    from training.config.parallel import ParallelConfig
    from training.parallel.layout import Layout
    from training.parallel.mesh import build_mesh
    from training.parallel.parallelize import apply_parallelism
    from training.parallel.process_group import init_distributed
    torch.set_num_threads(1)
    info = init_distributed()

    def sharded_model():
        with torch.device("meta"):
            model = Transformer(build_model_config("tiny"))
        mesh = build_mesh(Layout(1, info.world_size, 1), "cpu")
        apply_parallelism(model, ParallelConfig(param_dtype="float32"), mesh)
        model.to_empty(device="cpu")
        model.init_weights(seed=3)
        return model

    def print_on_rank_0(line):
        lines = [None] * info.world_size
        dist.all_gather_object(lines, line)  # printed by rank 0 alone: two ranks' prints interleave
        if info.rank == 0:
            print("\\n".join(lines), flush=True)

    # 1) the shards: the gathered model is the one a single process builds from the same seed
    model = sharded_model()
    full = {n: p.full_tensor() for n, p in model.named_parameters()}
    local = model.layers[0].attention.wq.weight.to_local()
    reference = Transformer(build_model_config("tiny"))
    reference.init_weights(seed=3)
    same = all(torch.equal(full[n], p) for n, p in reference.named_parameters())
    print_on_rank_0(f"RANK {info.rank} WORLD {info.world_size} SAME_AS_ONE_PROCESS {same} LOCAL_ROWS {local.shape[0]}")

    # 2) the fused loss: each rank its own batch (the reduction matters); the gradient shards after FSDP2's
    #    reduce-scatter are the full-logits path's
    gen = torch.Generator().manual_seed(100 + info.rank)
    tokens = torch.randint(0, 320, (4, 33), generator=gen)
    inputs, targets = tokens[:, :-1], tokens[:, 1:]

    def local_grads(chunk):
        model.zero_grad(set_to_none=True)
        if chunk:
            loss = model(inputs, targets, loss_chunk_tokens=chunk)
        else:
            loss = F.cross_entropy(model(inputs).flatten(0, 1).float(), targets.flatten())
        loss.backward()
        return {n: p.grad.to_local().clone() for n, p in model.named_parameters()}

    full_grads, fused = local_grads(0), local_grads(40)
    same = all(torch.allclose(fused[n], g, rtol=1e-5, atol=1e-7) for n, g in full_grads.items())
    print_on_rank_0(f"RANK {info.rank} FUSED_MATCHES {same} HEAD_SHARD_ROWS {fused['output.weight'].shape[0]} "
                    f"OF {model.output.weight.shape[0]}")
    # the FSDP2 model's reference cycles hold gloo work objects: collected now, not at interpreter shutdown,
    # where they can abort the rank (training.train does the same)
    del model, full, local, full_grads, fused
    gc.collect()
    dist.destroy_process_group()
    """
)


@pytest.fixture(scope="module")
def two_ranks(tmp_path_factory) -> Run:
    """2 gloo ranks running TWO_RANK_SCRIPT, started as torchrun's workers (torchrun_support.run_ranks)."""
    workdir = tmp_path_factory.mktemp("two-ranks")
    script = workdir / "two_ranks.py"
    script.write_text(TWO_RANK_SCRIPT)
    return run_ranks([[str(script)], [str(script)]])


@pytest.mark.slow
def test_two_ranks_shard_the_same_model_one_process_would_build(two_ranks):
    """Each rank holds half of every weight, and the gathered model is the one a single process builds from the
    same seed (each shard is drawn as its slice of the full tensor)."""
    assert two_ranks.returncode == 0, two_ranks.output[-3000:]
    for rank in (0, 1):
        assert f"RANK {rank} WORLD 2 SAME_AS_ONE_PROCESS True LOCAL_ROWS 32" in two_ranks.output, two_ranks.output


@pytest.mark.slow
def test_two_ranks_reduce_scatter_the_fused_loss_gradients_like_the_full_logits(two_ranks):
    """2 ranks with different batches: each rank's gradient shards, the output head's among them, are the
    full-logits path's after FSDP2's reduce-scatter."""
    assert two_ranks.returncode == 0, two_ranks.output[-3000:]
    for rank in (0, 1):
        assert f"RANK {rank} FUSED_MATCHES True HEAD_SHARD_ROWS 160 OF 320" in two_ranks.output, two_ranks.output
