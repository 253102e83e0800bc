"""FITS FROM: the fewest nodes any layout the plan weighs fits memory on, and which layout; FP8 all-gather's bytes
as the config sets it; what the chosen layout saves over FSDP, said to a tenth of a percent under 10%."""

import dataclasses

import pytest

import clusterctl.plan.mfu
from clusterctl.plan.choose import plan_option
from clusterctl.plan.layouts import Layout
from clusterctl.plan.options import smallest_fit
from clusterctl.plan.search import memory_of
from clusterctl.plan.step_time import NO_RECOMPUTE, block_gather_bytes, step_time
from clusterctl.plan.text import fits_from, percent
from clusterctl.plan.workload import load_workload
from instance_catalog.instance_types import get_instance_type
from instance_catalog.network import NETWORKS

P4D, P5 = get_instance_type("p4d.24xlarge"), get_instance_type("p5.48xlarge")


@pytest.fixture(autouse=True)
def no_measurements(monkeypatch, tmp_path):
    table = tmp_path / "mfu.json"
    table.write_text('{"measurements": []}')
    monkeypatch.setattr(clusterctl.plan.mfu, "MEASURED_MFU_PATH", table)


def test_1b_on_p4d_fits_one_node_without_activation_checkpointing_as_tp_2():
    # FSDP 8 needs activation checkpointing on one 40 GiB A100 node; TP 2 halves the activations and fits
    # without it: the column says the fewest nodes any layout fits on, and the layout
    workload = load_workload("1b")
    assert smallest_fit(workload, P4D, False) is None or smallest_fit(workload, P4D, False) > 1
    assert not memory_of(workload, P4D, Layout(1, 8, 1), False, 2**22).fits
    assert memory_of(workload, P4D, Layout(1, 4, 2), False, 2**22).fits
    option = plan_option(workload, P4D, 100e9)
    assert (option.min_nodes_without_ac, option.min_nodes_with_ac) == (1, 1)
    assert option.fits_from_layout_without_ac == Layout(1, 4, 2)
    assert fits_from(option) == "1 (TP 2)"


def test_the_column_names_the_ac_count_and_the_layout_of_each():
    # 70B on p5: with activation checkpointing FSDP fits from 3 nodes (16 B x 70.55e9 / 24 GPUs of sharded
    # state); without it the activations need TP 8 and 4 nodes
    option = plan_option(load_workload("llama3-70b"), P5, 1e12)
    assert fits_from(option) == "3 (AC), 4 (TP 8) without"
    assert option.fits_from_layout_with_ac == Layout(1, 24, 1)
    assert option.fits_from_layout_without_ac == Layout(1, 4, 8)
    # where nothing fits even with AC the cell is "-"
    assert fits_from(dataclasses.replace(option, min_nodes_with_ac=None, min_nodes_without_ac=None)) == "-"


def test_the_plan_says_what_the_column_means_when_it_names_tp(cli):
    result = cli("plan", "--model", "1b", "--tokens", "100B", "--instance-types", "p4d.24xlarge")
    assert any(line.startswith("FITS FROM (TP t): the fewest nodes fit as FSDP over the other GPUs x TP t")
               for line in result.lines)


@pytest.mark.parametrize(("fraction", "text"), [
    (0.0, "0.0%"), (0.0004, "<0.1%"), (0.0005, "0.1%"), (0.032, "3.2%"), (0.094, "9.4%"), (0.0996, "10%"),
    (0.16, "16%"),
])
def test_a_saving_under_10_percent_keeps_one_decimal(fraction, text):
    assert percent(fraction) == text


def _linears(cfg):
    """One block's seven linear weights (wq, wk, wv, wo, w1, w3, w2), from the model's shapes."""
    kv = cfg.n_kv_heads * cfg.head_dim
    return [cfg.dim * cfg.dim, cfg.dim * kv, cfg.dim * kv, cfg.dim * cfg.dim] + [cfg.dim * cfg.ffn_dim] * 3


@pytest.mark.parametrize("preset", ["1b", "llama3-8b", "llama3-70b"])
def test_fp8_all_gather_moves_one_byte_per_float8_weight_and_two_for_the_norms(preset):
    cfg = load_workload(preset).model
    linears = sum(_linears(cfg))
    assert block_gather_bytes(cfg, False) == 2 * (linears + 2 * cfg.dim)
    assert block_gather_bytes(cfg, True) == linears + 2 * 2 * cfg.dim


def test_a_linear_whose_dimensions_are_not_multiples_of_16_stays_bf16():
    # dim 2056 = 8 x 257: no linear that touches dim can run in FP8 (training.fp8.fp8_eligible)
    cfg = dataclasses.replace(load_workload("1b").model, dim=2056, n_heads=8, n_kv_heads=8)
    assert block_gather_bytes(cfg, True) == block_gather_bytes(cfg, False)


def test_the_plan_reads_fp8_all_gather_from_the_config(tmp_path):
    assert load_workload("1b").fp8_all_gather  # torchao tensorwise, fp8.fsdp_float8_all_gather's default on
    for fp8 in ('backend = "torchao"\ntorchao_recipe = "rowwise"',
                'backend = "torchao"\nfsdp_float8_all_gather = false', 'backend = "none"'):
        config = tmp_path / "run.toml"
        config.write_text(f'[model]\npreset = "1b"\n[fp8]\n{fp8}\n')
        assert not load_workload(str(config)).fp8_all_gather, fp8


def test_fp8_all_gather_shortens_what_fsdp_exposes_and_not_on_an_a100():
    # 8B as FSDP 64 on 8 p5 nodes, one 8192-token sample per GPU: the first block's all-gather is exposed, and
    # with FP8 it moves (linears + 2 x 2 x dim) B instead of 2 x (linears + 2 x dim)
    cfg = load_workload("llama3-8b").model

    def step(fp8_all_gather, instance=P5):
        return step_time(cfg, seq_len=8192, micro_batch_size=1, global_batch_tokens=2**22, layout=Layout(1, 64, 1),
                         instance=instance, network=NETWORKS[instance.name], efficiency=0.4, recompute=NO_RECOMPUTE,
                         fp8_all_gather=fp8_all_gather)

    assert step(True).fsdp_exposed_s < step(False).fsdp_exposed_s
    assert step(True).compute_s == step(False).compute_s
    # the plan asks for it only where the GPU runs the config's FP8 (an A100 runs bf16)
    workload = load_workload("llama3-8b")
    p4d = plan_option(workload, P4D, 100e9, nodes=8)
    bf16 = step_time(cfg, seq_len=8192, micro_batch_size=1, global_batch_tokens=2**22, layout=p4d.choice.layout,
                     instance=P4D, network=NETWORKS[P4D.name], efficiency=p4d.efficiency,
                     recompute="full" if p4d.activation_checkpointing else NO_RECOMPUTE)
    assert p4d.choice.step.total_s == pytest.approx(bf16.total_s)


def test_the_dimension_rule_is_the_trainers():
    fp8 = pytest.importorskip("training.fp8")
    from clusterctl.plan import step_time as plan_step

    assert plan_step.FP8_DIM_MULTIPLE == fp8.FP8_DIM_MULTIPLE
