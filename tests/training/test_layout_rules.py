"""training.parallel.layout: the degrees resolved against a job, and every layout that cannot run refused in
one line naming the setting, the value and what is allowed (no torch, no process group)."""

from __future__ import annotations

import pytest

from training.config import load_config
from training.errors import ConfigError
from training.parallel.layout import Layout, resolve_layout, world_layout


def layout_of(*overrides: str, world: int = 16, gpus: int = 8, config: str = "llama3-8b") -> Layout:
    cfg = load_config(config, list(overrides))
    return resolve_layout(cfg.parallel, world_size=world, gpus_per_node=gpus, model=cfg.model, run=cfg.run,
                          fp8_backend=cfg.fp8.backend)


def refusal(*overrides: str, **job) -> str:
    with pytest.raises(ConfigError) as caught:
        layout_of(*overrides, **job)
    message = str(caught.value)
    assert "\n" not in message
    return message


def test_the_default_is_fsdp_over_every_rank():
    layout = layout_of()
    assert (layout.dp_replicate, layout.dp_shard, layout.tp, layout.name) == (1, 16, 1, "FSDP 16")
    assert layout.dp_size == 16 and layout.dp_rank(13) == 13


def test_dp_shard_takes_the_ranks_that_replicas_and_tp_leave():
    layout = layout_of("parallel.dp_replicate=2", "parallel.tp=4")
    assert layout.settings() == {"dp_replicate": 2, "dp_shard": 2, "tp": 4}
    assert layout.name == "TP 4 x HSDP 2 x 2"
    # tp innermost: ranks 0-3 are one tp group (one node), all data-parallel rank 0
    assert [layout.dp_rank(r) for r in (0, 3, 4, 15)] == [0, 0, 1, 3]


def test_a_product_that_is_not_the_world_size_is_refused():
    assert refusal("parallel.dp_shard=4") == (
        "parallel.dp_shard=4: dp_replicate 1 x dp_shard 4 x tp 1 = 4 ranks, the job has 16; allowed: dp_shard = 16, "
        "or -1 (the ranks left over)")
    assert refusal("parallel.dp_replicate=3").startswith(
        "parallel.dp_replicate=3: dp_replicate 3 x tp 1 = 3 does not divide the world size 16; allowed:")


def test_tp_must_fit_a_node_and_divide_the_model():
    assert refusal("parallel.tp=16") == (
        "parallel.tp=16: a tensor-parallel group stays on one node's 8 GPUs; allowed: 1, 2, 4, 8")
    # tiny: 4 heads, 2 kv heads: tp 4 splits the heads but not the key/value heads
    message = refusal("parallel.tp=4", config="tiny-cpu", world=8)
    assert message.startswith("parallel.tp=4: does not divide model.n_kv_heads (2); allowed:")
    assert message.endswith(": 1, 2")


def test_replica_groups_across_a_node_boundary_are_refused():
    # 3 nodes of 8: 2 replicas of 12 ranks would split the middle node
    message = refusal("parallel.dp_replicate=2", world=24)
    assert message.startswith("parallel.dp_replicate=2: replica groups of 12 ranks straddle nodes of 8 GPUs (3 nodes)")
    assert "allowed: 1, 3, 6, 12, 24" in message
    # groups smaller than a node are whole inside one: HSDP 8 x 2 on 2 nodes runs
    assert layout_of("parallel.dp_replicate=8").name == "HSDP 8 x 2"


def test_a_global_batch_the_data_parallel_ranks_cannot_split_is_refused():
    # 8 samples of 8192 tokens: 16 data-parallel ranks cannot share them; under tp 8 there are 2 such ranks
    message = refusal("run.global_batch_tokens=65536", "run.seq_len=8192", "run.micro_batch_size=1")
    assert message.startswith("run.global_batch_tokens=65536: not a whole number of micro-batches on 16 ranks")
    layout = layout_of("run.global_batch_tokens=65536", "run.seq_len=8192", "run.micro_batch_size=1", "parallel.tp=8")
    assert layout.dp_size == 2


def test_what_tp_cannot_run_with_is_refused():
    assert refusal("parallel.tp=2", "parallel.loss_chunk_tokens=1024").startswith(
        "parallel.loss_chunk_tokens=1024: allowed: 0 with parallel.tp > 1")
    assert refusal("parallel.tp=2", "fp8.backend=te", "parallel.compile=false").startswith(
        "fp8.backend='te': allowed with parallel.tp=1 only")


def test_the_degrees_are_settings_with_their_own_checks():
    for bad, allowed in (("parallel.tp=0", "allowed: an integer >= 1"),
                         ("parallel.dp_shard=0", "allowed: an integer >= 1, or -1")):
        with pytest.raises(ConfigError, match=allowed):
            load_config("tiny-cpu", [bad])
    printed = load_config("tiny-cpu", ["parallel.tp=2"]).to_dict()["parallel"]  # the checkpoint's config snapshot
    assert (printed["dp_replicate"], printed["dp_shard"], printed["tp"]) == (1, -1, 2)


def test_clusterctl_s_view_counts_nodes_times_gpus():
    cfg = load_config("llama3-70b", ["parallel.tp=8"])
    layout = world_layout(cfg.parallel, nodes=32, gpus_per_node=8, model=cfg.model, run=cfg.run)
    assert layout.name == "TP 8 x FSDP 32"
