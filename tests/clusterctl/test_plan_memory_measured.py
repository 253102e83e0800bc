"""The memory model (clusterctl/plan/memory.py) against what torch itself measures for this project's model.

torch.distributed._tools' MemTracker and FSDPMemTracker follow every tensor's storage through a real step
(forward and backward through the trainer's own training.step.forward_backward with its default loss on
the full fp32 logits, which the memory model is for; then AdamW) of training.model built as training does it
(training.train.build_model: FSDP2 per block then the root, bf16 mixed precision, fp32 reduction), on the CPU,
with a fake process group of G ranks standing in for G GPUs. Collectives move no data there, and nothing
overlaps: the model's overlap phase (a reduce-scatter in flight during the next block's backward) is a GPU
reality the CPU cannot show, so the model may be above the measurement, never below.
"""

import pytest
import torch
import torch.distributed as dist

from clusterctl.plan.memory import RunShape, block_activation_bytes_per_token, estimate_memory

pytest.importorskip("torch.distributed._tools.fsdp2_mem_tracker")
from torch.distributed._tools.fsdp2_mem_tracker import FSDPMemTracker  # noqa: E402
from torch.distributed._tools.mem_tracker import MemTracker, _MemRefType  # noqa: E402
from torch.testing._internal.distributed.fake_pg import FakeStore  # noqa: E402

from training.config.parallel import ParallelConfig
from training.fp8 import Fp8Config, build_fp8_backend  # noqa: E402
from training.model import Transformer, build_model_config  # noqa: E402
from training.optim import OptimConfig, build_optimizer  # noqa: E402
from training.parallel.process_group import DistInfo  # noqa: E402
from training.step import forward_backward  # noqa: E402
from training.train import build_model  # noqa: E402


@pytest.fixture(autouse=True)
def one_thread():
    before = torch.get_num_threads()
    torch.set_num_threads(1)  # 2-core CI boxes: a second OpenMP thread spin-waits and slows tiny matmuls
    yield
    torch.set_num_threads(before)


def measured_step_peak(world_size, shape, micro_batch_size, seq_len, activation_checkpointing):
    """Peak bytes on rank 0 of `world_size` over the second of two full training steps."""
    dist.init_process_group("fake", store=FakeStore(), rank=0, world_size=world_size)
    try:
        info = DistInfo(rank=0, local_rank=0, world_size=world_size, device=torch.device("cpu"))
        cfg = build_model_config("tiny", **shape)
        fp8 = build_fp8_backend(Fp8Config())
        model = build_model(cfg, ParallelConfig(activation_checkpointing=activation_checkpointing), fp8, info,
                            seed=0)
        optimizer = build_optimizer(model, OptimConfig())
        tokens = torch.randint(0, cfg.vocab_size, (micro_batch_size, seq_len + 1),
                               generator=torch.Generator().manual_seed(0))
        inputs, targets = tokens[:, :-1], tokens[:, 1:]
        tracker = FSDPMemTracker(model, optimizer)
        tracker.track_inputs((inputs,))
        with tracker:
            for _ in range(2):  # the second step has the optimizer state the first one created
                forward_backward(model, fp8, [(inputs, targets)], 1)  # parallel.loss_chunk_tokens = 0
                optimizer.step()
                optimizer.zero_grad(set_to_none=True)  # as training.train's loop
                tracker.reset_mod_stats()
        return tracker.get_tracker_snapshot("peak")[torch.device("cpu")]["Total"], cfg
    finally:
        dist.destroy_process_group()


# Each case makes a different term dominate: the loss (large vocabulary), the feed-forward (large ffn_dim),
# many blocks, the sharded state (few tokens), activation checkpointing on and off.
CASES = [
    pytest.param(4, dict(dim=256, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=512, vocab_size=4096), 2, 128,
                 False, id="loss-dominated"),
    pytest.param(4, dict(dim=256, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=2048, vocab_size=512), 2, 128,
                 True, id="ffn-dominated-ac"),
    pytest.param(2, dict(dim=384, n_layers=6, n_heads=6, n_kv_heads=2, ffn_dim=1024, vocab_size=1024), 1, 256,
                 False, id="many-blocks"),
    pytest.param(1, dict(dim=256, n_layers=3, n_heads=4, n_kv_heads=1, ffn_dim=768, vocab_size=2048), 2, 64,
                 True, id="state-dominated-ac"),
]


@pytest.mark.parametrize(("world_size", "shape", "micro_batch_size", "seq_len", "ac"), CASES)
def test_estimate_bounds_the_measured_peak_from_above_within_30_percent(
    world_size, shape, micro_batch_size, seq_len, ac
):
    measured, cfg = measured_step_peak(world_size, shape, micro_batch_size, seq_len, ac)
    estimate = estimate_memory(cfg, RunShape(micro_batch_size, seq_len, activation_checkpointing=ac),
                               world_size, 80)
    assert measured <= estimate.peak_bytes <= 1.3 * measured, (measured, estimate.peak.name)


def saved_after_forward(cfg, micro_batch_size, seq_len):
    """Activation bytes alive after a bf16 forward of training.model (what autograd keeps for backward)."""
    model = Transformer(cfg)
    model.init_weights(seed=0)
    model = model.to(torch.bfloat16)
    tokens = torch.randint(0, cfg.vocab_size, (micro_batch_size, seq_len))
    tracker = MemTracker()
    tracker.track_external(model)
    with tracker:
        logits = model(tokens)
        saved = tracker.get_tracker_snapshot("current")[torch.device("cpu")][_MemRefType.ACT]
    del logits
    return saved


@pytest.mark.parametrize("shape", [
    dict(dim=256, n_heads=4, n_kv_heads=2, ffn_dim=512),
    dict(dim=512, n_heads=8, n_kv_heads=2, ffn_dim=512),
    dict(dim=256, n_heads=4, n_kv_heads=4, ffn_dim=1024),
])
def test_block_activation_bytes_are_what_autograd_saves_per_block(shape):
    # one block more adds exactly 24 x dim + 8 x ffn_dim + 4 x n_heads + 8 bytes per token
    one = build_model_config("tiny", n_layers=1, vocab_size=512, **shape)
    two = build_model_config("tiny", n_layers=2, vocab_size=512, **shape)
    tokens = 2 * 64
    added = saved_after_forward(two, 2, 64) - saved_after_forward(one, 2, 64)
    assert added == block_activation_bytes_per_token(one) * tokens
