"""`clusterctl plan`: time and cost by hand (compute and exposed communication), the MFU's source, node counts for
a deadline, bad input, and that planning needs neither torch nor AWS (the printed table, commands, JSON and
--explain: test_plan_output.py)."""

import json
import subprocess
import sys
import textwrap

import pytest

import clusterctl.plan.mfu
from cluster_aws.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from clusterctl.plan.choose import plan_option
from clusterctl.plan.layouts import Layout, parse_layout
from clusterctl.plan.options import parse_tokens, smallest_fit
from clusterctl.plan.search import memory_of
from clusterctl.plan.workload import load_workload
from instance_catalog.instance_types import get_instance_type
from training import shapes

P4D, P5 = get_instance_type("p4d.24xlarge"), get_instance_type("p5.48xlarge")
REAL_MFU_TABLE = clusterctl.plan.mfu.MEASURED_MFU_PATH
# The 1b preset: 1,498,482,688 parameters, 1,235,814,400 of them outside the token embedding
# (Llama-3.2-1B's 1,235,814,400 with an untied 128256 x 2048 output head, minus the 128256 x 2048 embedding).
ONE_B_NON_EMBEDDING = 1_235_814_400
# FLOPs per token at seq 4096 (PaLM appendix B / torchtitan): 6 N + 12 x layers x dim x seq
ONE_B_FLOPS_PER_TOKEN = 6 * ONE_B_NON_EMBEDDING + 12 * 16 * 2048 * 4096
assert ONE_B_FLOPS_PER_TOKEN == 9_025_499_136


@pytest.fixture(autouse=True)
def no_measurements(monkeypatch, tmp_path):
    """The default MFU unless a test writes a table (the real benchmarks/mfu.json may gain rows)."""
    table = tmp_path / "mfu.json"
    table.write_text('{"measurements": []}')
    monkeypatch.setattr(clusterctl.plan.mfu, "MEASURED_MFU_PATH", table)
    return table


def test_the_plan_counts_flops_with_the_trainers_one_function():
    import training.model

    assert training.model.flops_per_token is shapes.flops_per_token  # re-exported, not a copy
    workload = load_workload("1b")
    assert shapes.flops_per_token(workload.model, 4096) == ONE_B_FLOPS_PER_TOKEN
    option = plan_option(workload, P5, 50e9)
    assert option.total_flops == ONE_B_FLOPS_PER_TOKEN * 50e9


def test_time_and_cost_of_1b_on_one_p5_by_hand():
    # 1b config: seq 4096, micro-batch 4, no activation checkpointing; FSDP over the node's 8 GPUs
    option = plan_option(load_workload("1b"), P5, 50e9)
    assert (option.nodes, option.choice.layout.name, option.activation_checkpointing, option.mfu.source) == (
        1, "FSDP 8", False, "default")
    step = option.choice.step
    # compute: 4,194,304 tokens a step / 8 GPUs = 524,288 per GPU x 9,025,499,136 FLOPs at 989e12 x 0.40
    compute_s = 524_288 * 9_025_499_136 / (989e12 * 0.40)
    assert step.compute_s == pytest.approx(compute_s) and compute_s == pytest.approx(11.9615, abs=1e-4)
    # exposed, per micro-batch (32 a step), on NVLink (360 GB/s busbw, 3 us a ring step, 7 steps over 8 ranks):
    # every block's collectives hide behind the next block's compute except the first block's all-gather and
    # the last one's fp32 reduce-scatter, and the root group's pair (embedding + head + norm, 525,338,624
    # parameters, gathered in bf16). A block holds 60,821,504 parameters; the config's torchao tensorwise FP8
    # all-gathers its seven linears (60,817,408: all but the two 2048-wide norm weights) at 1 B, the norms at 2:
    # gathered 2 x 525,338,624 + 2 x 4,096 + 60,817,408 = 1,111,502,848 B, reduce-scattered 4 x 586,160,128
    gathered_bytes, reduced_bytes = 2 * 525_338_624 + 2 * 4_096 + 60_817_408, 4 * 586_160_128
    exposed_s = 32 * ((gathered_bytes + reduced_bytes) * 7 / 8 / 360e9 + 4 * 7 * 3e-6)
    assert step.exposed_s == pytest.approx(exposed_s) and exposed_s == pytest.approx(0.2715, abs=1e-4)
    hours = 50e9 / 4_194_304 * (compute_s + exposed_s) / 3600  # 11,920.9 steps x 12.233 s = 40.51 h
    assert option.hours == pytest.approx(hours) and hours == pytest.approx(40.51, abs=0.01)
    assert option.gpu_hours == pytest.approx(8 * hours)  # 324.1
    assert option.cost_usd == pytest.approx(hours * 55.04 + option.fsx_usd)
    assert option.instances_usd == pytest.approx(2229.6, abs=0.1)
    # the MFU a run would log: the compute efficiency less the exposed share
    assert step.mfu == pytest.approx(0.40 * compute_s / (compute_s + exposed_s))


def test_activation_checkpointing_costs_a_third_of_the_blocks_forward_more_on_p4d_by_hand():
    # on a 40 GiB A100 the 1b config needs activation checkpointing with FSDP 8 (forced by --layout tp=1)
    workload = load_workload("1b")
    fsdp = plan_option(workload, P4D, 50e9, layout=parse_layout("tp=1"))
    assert (fsdp.nodes, fsdp.choice.layout.name, fsdp.activation_checkpointing) == (1, "FSDP 8", True)
    assert fsdp.mfu_effective == pytest.approx(0.30)  # the MFU column: 0.40 x 3/4 with recomputation
    # the step model recomputes each block's forward: + (FLOPs - the head's 6 x 128256 x 2048) / 3 per token
    recompute = (9_025_499_136 - 6 * 128_256 * 2048) / 3
    assert recompute == 2_483_163_136
    compute_s = 524_288 * (9_025_499_136 + recompute) / (312e12 * 0.40)
    assert fsdp.choice.step.compute_s == pytest.approx(compute_s) and compute_s == pytest.approx(48.348, abs=1e-3)
    assert fsdp.cost_usd == pytest.approx(fsdp.hours * 21.96 + fsdp.fsx_usd)
    assert fsdp.fp8_backend == "none"  # the A100 has no FP8: the config's torchao becomes none
    # TP 2 splits the activations over two GPUs: it fits without checkpointing on the same node, and the plan
    # takes it, faster by the recomputation it saves (its TP collectives cost far less)
    option = plan_option(workload, P4D, 50e9)
    assert (option.nodes, option.choice.layout.name, option.activation_checkpointing) == (1, "FSDP 4 x TP 2", False)
    assert option.choice.step.compute_s == pytest.approx(524_288 * 9_025_499_136 / (312e12 * 0.40))
    assert option.hours < fsdp.hours


def test_attention_flops_grow_with_the_sequence():
    short, long = load_workload("1b", seq_len=2048), load_workload("1b", seq_len=8192)
    assert shapes.flops_per_token(long.model, 8192) - shapes.flops_per_token(short.model, 2048) == (
        12 * 16 * 2048 * (8192 - 2048))


def test_more_nodes_less_time_and_the_gpu_hours_grow_by_the_exposed_communication():
    workload = load_workload("1b")
    one, four = plan_option(workload, P5, 50e9, nodes=1), plan_option(workload, P5, 50e9, nodes=4)
    assert (one.choice.layout.name, four.choice.layout.name) == ("FSDP 8", "FSDP 32")
    one_step, four_step = one.choice.step, four.choice.step
    assert four_step.compute_s == pytest.approx(one_step.compute_s / 4)  # the compute splits over the GPUs
    # the gathers over EFA hide less than on NVLink: more GPU-hours, and less than 4x faster
    assert four_step.exposed_s / four_step.compute_s > one_step.exposed_s / one_step.compute_s
    assert one.hours / 4 < four.hours < one.hours / 3.9
    assert four.gpu_hours == pytest.approx(
        one.gpu_hours * (four_step.total_s / four_step.compute_s) / (one_step.total_s / one_step.compute_s))
    assert four.instances_usd == pytest.approx(four.gpu_hours / 8 * 55.04)


def test_deadline_picks_the_fewest_nodes_that_finish_in_time():
    workload = load_workload("llama3-70b")
    # 1,920 samples of 8192 tokens a step: TP 8 makes each node one data-parallel rank, so any count that divides
    # 1,920 splits it (from 3 nodes, where 70B fits, to 256)
    batch = 240 * 8 * 8192
    option = plan_option(workload, P5, 1e12, deadline_days=30, global_batch_tokens=batch)
    assert option.viable and option.hours <= 30 * 24
    assert option.node_counts == tuple(n for n in range(3, 257) if 1920 % n == 0)
    assert option.node_counts[-6:] == (96, 120, 128, 160, 192, 240)  # past 64 with TP
    # the fewest that finish: 64 nodes take 722 h, just past the 720 of 30 days; 80 nodes take 579
    assert (option.nodes, option.choice.layout.name) == (80, "FSDP 160 x TP 4")
    fewer = plan_option(workload, P5, 1e12, nodes=64, global_batch_tokens=batch)
    assert 30 * 24 < fewer.hours < 30 * 24 * 1.01


def test_a_deadline_beyond_the_most_nodes_is_not_viable_and_says_what_limits_them():
    workload = load_workload("llama3-70b")
    option = plan_option(workload, P4D, 15e12, deadline_days=1, global_batch_tokens=2**24)
    assert not option.viable and option.problem.startswith("misses the deadline: ")
    assert option.problem.endswith(" days on 256 nodes (the most a cluster holds)")
    # the default 4Mi tokens (512 samples) no longer stop at 64 nodes: TP 8 lets a node share one sample
    option = plan_option(workload, P4D, 15e12, deadline_days=1)
    assert option.problem.endswith(" days on 256 nodes (the most a cluster holds)")
    # 1Mi tokens are 128 samples: 128 nodes at TP 8 are the most that split them
    option = plan_option(workload, P4D, 15e12, deadline_days=1, global_batch_tokens=2**20)
    assert option.problem.endswith(" days on 128 nodes (the most that split the global batch; "
                                   "--global-batch-tokens 2097152 allows more)")
    assert option.choice.layout.tp == 8


def test_too_few_nodes_does_not_fit_and_says_how_many():
    option = plan_option(load_workload("llama3-70b"), P5, 1e12, nodes=2)
    assert not option.viable
    # needs 3 (was 4 until the trainer freed the bf16 logits before backward: 2 B x 128256 x 8192 tokens =
    # 1.96 GiB less at the peak; the sharded state 16 B x 70.55e9 / (8 x n) then fits 73 GiB from n = 2.96)
    assert option.problem.startswith("does not fit on 2 nodes (needs 3): ")
    assert option.hours is None and option.cost_usd is None


def test_measured_mfu_wins_over_the_default_and_is_converted_for_activation_checkpointing(no_measurements):
    no_measurements.write_text(json.dumps({"measurements": [
        measurement(preset="1b", gpu="H100", fp8_backend="torchao", fp8_recipe="tensorwise", mfu=0.52),
        measurement(preset="1b", gpu="A100", fp8_backend="none", mfu=0.45, activation_checkpointing=True),
        measurement(preset="1b", gpu="H100", fp8_backend="torchao", fp8_recipe="tensorwise", mfu=0.47, seq_len=2048,
                    date="2026-12-01"),
        measurement(preset="1b", gpu="H100", fp8_backend="torchao", fp8_recipe="rowwise", mfu=0.61),  # not the recipe
    ]}))
    measured = clusterctl.plan.mfu.load_measurements()
    p5 = plan_option(load_workload("1b"), P5, 50e9, measurements=measured)
    assert p5.mfu.source == "measured" and p5.mfu_effective == 0.52  # same seq_len beats the newer one
    assert "measured 2026-11-21" in p5.mfu.detail
    # measured with AC at 0.45; the p4d plan as FSDP 8 also needs AC: used as is
    p4d = plan_option(load_workload("1b"), P4D, 50e9, measurements=measured, layout=parse_layout("tp=1"))
    assert p4d.activation_checkpointing and p4d.mfu_effective == 0.45
    # the plan's own pick, TP 2, runs without AC: the same figure is worth 4/3 without recomputation
    p4d = plan_option(load_workload("1b"), P4D, 50e9, measurements=measured)
    assert not p4d.activation_checkpointing and p4d.choice.layout.tp == 2
    assert p4d.mfu.at(False) == pytest.approx(0.60) and p4d.mfu_effective == pytest.approx(0.60)
    # a custom model (no preset) never takes a preset's measurement
    query = clusterctl.plan.mfu.MfuQuery(preset="", gpu="H100", fp8_backend="torchao", fp8_recipe="tensorwise",
                                         seq_len=4096, compile=False, micro_batch_size=4)
    assert clusterctl.plan.mfu.choose_mfu(override=None, query=query, measurements=measured).source == "default"


def test_the_measured_h100_table_is_used_for_a_matching_1b_run(cli, monkeypatch, tmp_path):
    # the real benchmarks/mfu.json (docs/benchmarks.md, 2026-11-23): 1b, bf16, compile on, micro-batch 4 on an
    # H100 ran at 47.3% MFU; a config that runs exactly that is planned with it
    monkeypatch.setattr(clusterctl.plan.mfu, "MEASURED_MFU_PATH", REAL_MFU_TABLE)
    config = tmp_path / "1b-bf16.toml"
    config.write_text("[run]\nseq_len = 4096\nmicro_batch_size = 4\n[model]\npreset = '1b'\n"
                      "[parallel]\ncompile = true\n[fp8]\nbackend = 'none'\n")
    result = cli("plan", "--model", str(config), "--tokens", "50B", "--instance-types", "p5.48xlarge", "--json")
    (option,) = json.loads(result.out)["options"]
    assert option["mfuSource"] == "measured" and option["mfu"] == 0.4732
    assert option["mfuDetail"].startswith("0.473 measured 2026-11-23: 1b on one H100, fp8 none, seq 4096 x "
                                          "micro-batch 4, compile on, activation checkpointing off")
    # eager instead of compiled: the eager figure of the same session, 34.2% (at micro-batch 2)
    config.write_text(config.read_text().replace("compile = true", "compile = false"))
    (option,) = json.loads(cli("plan", "--model", str(config), "--tokens", "50B", "--instance-types",
                               "p5.48xlarge", "--json").out)["options"]
    assert option["mfu"] == 0.3421


def measurement(**fields):
    row = dict(preset="1b", gpu="H100", fp8_backend="none", fp8_recipe="", seq_len=4096, micro_batch_size=2,
               activation_checkpointing=False, compile=False, mfu=0.5, tokens_per_s=1.0, date="2026-11-21",
               source="docs/benchmarks.md")
    return {**row, **fields}


def test_a_bad_measurement_table_is_one_line_naming_the_entry(cli, no_measurements):
    no_measurements.write_text(json.dumps({"measurements": [measurement(mfu=1.7)]}))
    result = cli("plan", "--model", "1b", "--tokens", "1B")
    assert result.code == EXIT_USAGE
    assert result.err.strip() == f"clusterctl: error: {no_measurements}: measurements[0].mfu=1.7: allowed: a " \
        "fraction in (0, 1]"


def test_mfu_override_is_said(cli):
    result = cli("plan", "--model", "1b", "--tokens", "50B", "--instance-types", "p5.48xlarge", "--mfu", "0.5")
    assert "MFU H100 fp8 torchao: 0.50 from --mfu (without activation checkpointing)" in result.lines


def test_nothing_fits_exits_1_and_says_what_to_try(cli):
    result = cli("plan", "--model", "llama3-70b", "--tokens", "1T", "--instance-types", "p4d.24xlarge",
                 "--nodes", "2")
    assert result.code == EXIT_FAILED
    # FSDP alone needs 21 nodes (test_plan_memory.py has the arithmetic); TP splits the gathered blocks and the
    # activations, so some layout fits from fewer: the count is the fewest any layout fits on, and the GiB the
    # least any layout needs on 2 nodes (TP 2, 4 and 8 alike: the sharded state over 16 GPUs dominates)
    workload = load_workload("llama3-70b")
    assert smallest_fit(workload, P4D, True) == 21
    fits = [n for n in range(1, 22) if any(memory_of(workload, P4D, Layout(1, n * 8 // t, t), True, 2**22).fits
                                           for t in (1, 2, 4, 8))]
    least_gib = min(memory_of(workload, P4D, Layout(1, 16 // t, t), True, 2**22).peak_bytes for t in (1, 2, 4, 8))
    assert fits[0] == 5 and f"{least_gib / 2**30:.1f}" == "82.1"
    assert "p4d.24xlarge: does not fit on 2 nodes (needs 5): " in result.out
    assert "5 (AC, TP 4), 178 (TP 8) without" in result.out  # FITS FROM: the layout that fits there
    # the reason itself is the last line, then what to try
    assert result.lines[-1] == ("no instance type fits: does not fit on 2 nodes (needs 5): 82.1 GiB per GPU, 35.0 "
                                "usable; try a shorter --seq-len, --micro-batch-size 1, or a later deadline")


def test_a_training_config_file_is_planned_as_written(cli, tmp_path):
    config = tmp_path / "mine.toml"
    config.write_text(textwrap.dedent("""\
        [run]
        seq_len = 2048
        micro_batch_size = 2
        grad_accum_steps = 4
        [model]
        dim = 1024
        n_layers = 8
        n_heads = 16
        n_kv_heads = 4
        ffn_dim = 4096
        vocab_size = 32000
        [parallel]
        activation_checkpointing = true
        [fp8]
        backend = "torchao"
        """))
    result = cli("plan", "--model", str(config), "--tokens", "2B", "--instance-types", "p5.48xlarge", "--json")
    assert result.code == EXIT_OK, result.err
    report = json.loads(result.out)
    assert report["model"] == "mine" and report["config"] == str(config)
    # the config accumulates 4 micro-batches: the plan's global batch replaces that (the trainer takes one or the
    # other); it fits without checkpointing: the plan turns it off; 2e9 / 4,194,304 = 476.8 -> 477 steps; the
    # small model runs as FSDP over one node's 8 GPUs
    assert report["chosen"]["overrides"] == ["run.steps=477", "run.global_batch_tokens=4194304",
                                             "run.grad_accum_steps=1", "parallel.activation_checkpointing=false",
                                             "parallel.dp_replicate=1", "parallel.dp_shard=8", "parallel.tp=1"]
    assert report["chosen"]["submit"].startswith(f"clusterctl submit --config {config} --nodes ")


@pytest.mark.parametrize(("argv", "message"), [
    (["--tokens", "lots"], "--tokens='lots': allowed: a positive count of tokens, e.g. 200B, 1T or 2e11 (suffixes "
                           "K, M, B, T)"),
    # argparse took -5B for an option ("expected one argument"); now its check names it
    (["--tokens", "-5B"], "--tokens='-5B': allowed: a positive count of tokens, e.g. 200B, 1T or 2e11 (suffixes "
                          "K, M, B, T)"),
    (["--tokens", "0"], "--tokens='0': allowed: a positive count of tokens, e.g. 200B, 1T or 2e11 (suffixes K, M, "
                        "B, T)"),
    (["--instance-types", "p5.48xlarge,p9"], "--instance-types='p5.48xlarge,p9': allowed: a comma-separated "
                                             "subset of p4d.24xlarge, p4de.24xlarge, p5.48xlarge, p5e.48xlarge, "
                                             "p5en.48xlarge, p6-b200.48xlarge"),
])
def test_bad_plan_arguments_are_one_line(cli, argv, message):
    base = {"--model": "1b", "--tokens": "1B"}
    for flag, value in zip(argv[::2], argv[1::2], strict=True):
        base[flag] = value
    result = cli("plan", *[x for pair in base.items() for x in pair])
    assert result.code == EXIT_USAGE
    assert result.err == f"clusterctl: error: {message}\n"


def test_a_bad_config_file_names_the_key(cli, tmp_path):
    config = tmp_path / "bad.toml"
    config.write_text("[model]\npreset = 'llama3-8b'\nwidth = 4096\n")
    result = cli("plan", "--model", str(config), "--tokens", "1B")
    assert result.code == EXIT_USAGE
    # the trainer's own loader (training.config.load_config) judges the file: its one-line messages
    assert result.err.startswith(f"clusterctl: error: {config}: model.width: unknown key; allowed: preset, dim, ")
    config.write_text("[model]\npreset = 'llama3-8b'\n[run]\nseq_len = 0\n")
    assert cli("plan", "--model", str(config), "--tokens", "1B").err == (
        f"clusterctl: error: {config}: run.seq_len=0: allowed: an integer >= 1\n")
    assert cli("plan", "--model", "llama9", "--tokens", "1B").err.startswith(
        "clusterctl: error: --model 'llama9': allowed: a packaged config (125m, 1b, llama3-70b, llama3-8b, "
        "llama3-8b-finetune, tiny-cpu) or a training config TOML file")


def test_a_mistyped_model_name_gets_the_closest_names_in_one_line(cli):
    result = cli("plan", "--model", "llama3-8bb", "--tokens", "1B")
    assert result.code == EXIT_USAGE and len(result.err.splitlines()) == 1
    assert result.err.endswith("; did you mean llama3-8b or llama3-70b?\n")
    # nothing close: no guess
    assert "did you mean" not in cli("plan", "--model", "gpt", "--tokens", "1B").err


def test_nodes_and_deadline_are_exclusive_and_mfu_is_a_fraction(cli):
    for argv in (["--nodes", "2", "--deadline-days", "3"], ["--mfu", "1.5"], ["--mfu", "0"],
                 ["--deadline-days", "nan"]):
        with pytest.raises(SystemExit) as exit_info:
            cli("plan", "--model", "1b", "--tokens", "1B", *argv)
        assert exit_info.value.code == EXIT_USAGE


@pytest.mark.parametrize(("text", "tokens"), [("1T", 1e12), ("500B", 5e11), ("2.5e9", 2.5e9), ("300m", 3e8),
                                               ("15T", 15e12), ("7", 7.0)])
def test_token_counts(text, tokens):
    assert parse_tokens(text) == tokens


def test_planning_imports_no_torch_and_calls_no_aws(tmp_path):
    # a subprocess with no credentials and no network settings: plan must work from the shape arithmetic
    code = textwrap.dedent("""\
        import sys
        from clusterctl.cli import main
        code = main(["plan", "--model", "llama3-70b", "--tokens", "1T", "--json"])
        assert code == 0, code
        assert "torch" not in sys.modules, "clusterctl plan imported torch"
        """)
    env = {"PATH": "/usr/bin:/bin", "PYTHONPATH": ":".join(sys.path), "AWS_CONFIG_FILE": str(tmp_path / "none"),
           "AWS_SHARED_CREDENTIALS_FILE": str(tmp_path / "none"), "AWS_EC2_METADATA_DISABLED": "true"}
    done = subprocess.run([sys.executable, "-c", code], env=env, capture_output=True, text=True, timeout=60)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["model"] == "llama3-70b"
