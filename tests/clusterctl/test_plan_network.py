"""The plan's network model and step model: the published nccl-tests points it passes through, the layouts it
weighs and refuses, and its figures against published multi-node runs (docs/benchmarks.md holds the same table)."""

import dataclasses
import re
from pathlib import Path

import pytest

from clusterctl.plan import published
from clusterctl.plan.layouts import Layout, parse_layout, why_not
from clusterctl.plan.search import best_layout, memory_of
from clusterctl.plan.step_time import NO_RECOMPUTE, root_group_params, step_time
from clusterctl.plan.workload import load_workload
from instance_catalog.instance_types import INSTANCE_TYPES, get_instance_type
from instance_catalog.network import EFA_P4DE_ALL_REDUCE, EFA_P5_ALL_GATHER, EFA_P5_ALL_REDUCE, NETWORKS
from training.shapes import count_params

BENCHMARKS_MD = Path(__file__).resolve().parents[2] / "docs" / "benchmarks.md"
P5 = get_instance_type("p5.48xlarge")


def test_every_catalog_type_has_a_network_with_sources_and_p5_alone_is_not_an_estimate():
    assert set(NETWORKS) == set(INSTANCE_TYPES)
    assert [name for name, net in NETWORKS.items() if not net.estimate] == ["p5.48xlarge"]
    assert all(net.sources for net in NETWORKS.values())


@pytest.mark.parametrize("nodes, size, busbw", EFA_P5_ALL_GATHER)
def test_the_p5_model_passes_through_each_published_all_gather_point(nodes, size, busbw):
    assert NETWORKS["p5.48xlarge"].modelled_busbw_gbps("all_gather", size, nodes) == pytest.approx(busbw, rel=1e-6)


def test_the_latency_per_ring_step_explains_32_mb_falling_from_131_to_12_gb_s():
    net = NETWORKS["p5.48xlarge"]
    latencies = dict(net.efa_step_latency_s)
    assert 9e-6 < latencies[2] < latencies[32] < 11e-6  # ~10 us a ring step over EFA
    # 32 MB over 32 nodes (256 ranks) is latency: 255 steps x ~10.6 us against 0.1 ms of bytes
    assert net.collective_s("all_gather", 32 * 2**20, 256, 32) == pytest.approx(32 * 2**20 * 255 / 256 / 12e9)


def test_the_2_node_all_reduce_tables_are_reproduced():
    # p4d: latency and bandwidth both fitted to its all_reduce table, so the two points it used are exact
    p4d = NETWORKS["p4d.24xlarge"]
    for nodes, size, busbw in (EFA_P4DE_ALL_REDUCE[0], EFA_P4DE_ALL_REDUCE[-1]):
        assert p4d.modelled_busbw_gbps("all_reduce", size, nodes) == pytest.approx(busbw)
    # p5: one latency per ring step for every collective, fitted to all_gather: its all_reduce is close, not exact
    # (86.7 against 105.5 GB/s at 16 MB, 145.7 against 143.1 at 32 MB, 440.6 against 443.7 at 2 GB)
    p5 = NETWORKS["p5.48xlarge"]
    for nodes, size, busbw in EFA_P5_ALL_REDUCE:
        assert p5.modelled_busbw_gbps("all_reduce", size, nodes) == pytest.approx(busbw, rel=0.2)


def test_layout_syntax_and_refusals_are_one_line_naming_the_value():
    assert parse_layout("dp_replicate=4,tp=8").at(256) == Layout(4, 8, 8)
    with pytest.raises(ValueError, match=r"^--layout='tp=eight': allowed: dp_replicate=R"):
        parse_layout("tp=eight")
    cfg = load_workload("llama3-70b").model
    assert why_not(Layout(1, 16, 16), cfg, nodes=32, gpus_per_node=8, samples_per_step=512,
                   micro_batch_size=1) == "tp=16: allowed: a divisor of the 8 GPUs of a node"
    assert why_not(Layout(3, 256, 1), cfg, nodes=96, gpus_per_node=8, samples_per_step=768,
                   micro_batch_size=1) == ""
    assert why_not(Layout(4, 60, 1), cfg, nodes=30, gpus_per_node=8, samples_per_step=480,
                   micro_batch_size=1) == "dp_replicate=4 does not divide the 30 nodes"


def test_llama3_70b_goes_past_64_nodes_with_tp(cli):
    result = cli("plan", "--model", "llama3-70b", "--tokens", "1T", "--instance-types", "p5.48xlarge",
                 "--choose", "time")
    row = next(line for line in result.out.splitlines() if line.startswith("p5.48xlarge  "))
    cells = re.split(r"\s{2,}", row)  # the table's columns are two or more spaces apart
    assert cells[3] == "3 (AC), 4 (TP 8) without"  # FITS FROM: the fewest nodes any layout fits on, and which
    nodes = int(cells[4])
    assert nodes > 64 and "TP" in cells[5]
    assert "--set parallel.tp=" in result.out and " days" in result.out


def test_1b_at_32_nodes_shows_what_hsdp_saves_over_fsdp(cli):
    result = cli("plan", "--model", "1b", "--tokens", "100B", "--instance-types", "p5.48xlarge", "--nodes", "32")
    line = next(line for line in result.out.splitlines() if line.startswith("p5.48xlarge x 32: HSDP "))
    assert "FSDP 256 would take" in line and "saved" in line
    forced = cli("plan", "--model", "1b", "--tokens", "100B", "--instance-types", "p5.48xlarge", "--nodes", "32",
                 "--layout", "dp_replicate=1")
    assert "p5.48xlarge x 32: FSDP 256, step " in forced.out


def test_a_layout_that_cannot_run_is_refused_in_one_line(cli):
    result = cli("plan", "--model", "1b", "--tokens", "100B", "--instance-types", "p5.48xlarge", "--nodes", "4",
                 "--layout", "dp_replicate=3")
    assert result.code == 2
    assert result.err.count("\n") == 1 and "--layout='dp_replicate=3'" in result.err


def test_tp_splits_the_gathered_blocks_and_activations_in_memory():
    workload = load_workload("llama3-70b")
    tp8, fsdp = (memory_of(workload, P5, layout, False, 2**22) for layout in (Layout(1, 64, 8), Layout(1, 512, 1)))
    # the same sharded state (16 B x parameters / 512 GPUs); TP 8 holds an eighth of the gathered blocks and of
    # the activations, so the 70B fits without activation checkpointing on 64 nodes with TP and not without it
    assert tp8.peak_bytes < fsdp.peak_bytes and tp8.fits and not fsdp.fits
    choice, problem = best_layout(workload, P5, 128, 2**22, 0.4, parse_layout("tp=8"))
    assert problem == "" and choice.layout == Layout(1, 128, 8)


@pytest.mark.parametrize("run", published.RUNS, ids=[r.name for r in published.RUNS])
def test_the_plan_predicts_the_published_runs_within_15_percent_or_says_why_not(run):
    comparison = published.compare(run)
    if run.outside_because:
        assert abs(comparison.gap) > published.TOLERANCE  # still outside: else the reason is stale
    else:
        assert abs(comparison.gap) <= published.TOLERANCE, comparison.gap


def test_docs_benchmarks_holds_the_table_the_code_computes():
    text = BENCHMARKS_MD.read_text()
    for row in published.table_rows():
        assert row in text


def _block_params(cfg):
    """One transformer block's parameters from its shapes: wq, wo, wk, wv, the three MLP matrices, two norms."""
    kv_width = cfg.n_kv_heads * cfg.head_dim
    return 2 * cfg.dim * cfg.dim + 2 * cfg.dim * kv_width + 3 * cfg.dim * cfg.ffn_dim + 2 * cfg.dim


@pytest.mark.parametrize("tied", [False, True])
def test_the_root_group_holds_one_embedding_matrix_when_tied_and_the_blocks_keep_the_rest(tied):
    cfg = dataclasses.replace(load_workload("1b").model, tie_embeddings=tied)
    vocab_dim = cfg.vocab_size * cfg.dim
    assert root_group_params(cfg) == (1 if tied else 2) * vocab_dim + cfg.dim
    # what FSDP gathers per block is the same whether or not the embeddings are tied
    assert count_params(cfg) - root_group_params(cfg) == cfg.n_layers * _block_params(cfg)


def _step(preset, layout, nodes, micro_batch_size=1, seq_len=8192):
    cfg = load_workload(preset).model
    return cfg, step_time(cfg, seq_len=seq_len, micro_batch_size=micro_batch_size,
                          global_batch_tokens=micro_batch_size * seq_len * layout.dp, layout=layout, instance=P5,
                          network=NETWORKS["p5.48xlarge"], efficiency=0.4, recompute=NO_RECOMPUTE)


def test_hsdp_exposes_the_last_blocks_and_the_root_groups_all_reduce_across_replicas():
    # 8B as HSDP 2 x 8 on 2 nodes: each node's 8 ranks shard the model over NVLink, and the 8 replica pairs share
    # the node's EFA (1/8 of its bandwidth each). A block's all-reduce (4 B x a block / 8) hides in the block's
    # long backward; the last block's and the root group's come after it: exposed, and nothing else.
    cfg, step = _step("llama3-8b", Layout(2, 8, 1), 2)
    net = NETWORKS["p5.48xlarge"]

    def all_reduce_s(message_bytes):  # 2 ranks: 2 ring steps, the bytes term at 1/8 of the node's bandwidth
        steps_s = 2 * net.step_latency_s(2)
        return steps_s + (net.collective_s("all_reduce", message_bytes, 2, 2) - steps_s) * 8

    block_s = all_reduce_s(4 * _block_params(cfg) / 8)
    root_s = all_reduce_s(4 * (2 * cfg.vocab_size * cfg.dim + cfg.dim) / 8)
    assert root_s > 4 * block_s  # the embedding and the head: 1.05B parameters, a block 0.22B
    assert step.replica_exposed_s == pytest.approx(block_s + root_s)


def test_tp_counts_the_embedding_and_output_head_collectives_beside_the_blocks():
    # 8B at TP 8 on one node: per block 2 all-gathers + 2 reduce-scatters forward and as many backward, plus the
    # embedding's output reduce-scatter and the head's input all-gather, each forward and backward: 32 x 8 + 4
    cfg, step = _step("llama3-8b", Layout(1, 1, 8), 1, micro_batch_size=2)
    net = NETWORKS["p5.48xlarge"]
    activation_bytes = 2 * 8192 * cfg.dim * 2  # micro-batch 2 x seq 8192 tokens x dim x bf16, gathered
    per_op_s = (net.collective_s("all_gather", activation_bytes, 8, 1)
                + net.collective_s("reduce_scatter", activation_bytes, 8, 1)) / 2
    assert step.tp_s == pytest.approx((32 * 8 + 4) * per_op_s)
    # 7 / 8 of 67 MB at 360 GB/s and 7 ring steps of 3 us: about 0.18 ms each
    assert per_op_s == pytest.approx(activation_bytes * 7 / 8 / 360e9 + 7 * 3e-6)
