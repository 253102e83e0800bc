"""`clusterctl plan`: time and cost by hand, the MFU's source, node counts for a deadline, the commands it
prints, JSON, bad input, and that planning needs neither torch nor AWS."""

import json
import math
import subprocess
import sys
import textwrap

import pytest

import clusterctl.plan.mfu
from cluster_aws.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from clusterctl.plan.choose import plan_option
from clusterctl.plan.options import parse_tokens, training_hours
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
    # 1b config: seq 4096, micro-batch 4, no activation checkpointing; fits on one p5 without it
    option = plan_option(load_workload("1b"), P5, 50e9)
    assert (option.nodes, option.activation_checkpointing, option.mfu.source) == (1, False, "default")
    # 9,025,499,136 x 5e10 = 4.5127e20 FLOPs; 8 GPUs x 989e12 x 0.40 = 3.1648e15 FLOP/s
    seconds = 9_025_499_136 * 50e9 / (8 * 989e12 * 0.40)
    assert seconds == pytest.approx(142_591.9, abs=0.1)
    hours = seconds / 3600  # 39.61 h
    assert option.hours == pytest.approx(hours)
    assert option.gpu_hours == pytest.approx(8 * hours)  # 316.9
    assert option.cost_usd == pytest.approx(hours * 55.04)  # $2,180.0
    assert option.cost_usd == pytest.approx(2180.0, abs=0.1)
    assert option.usd_per_million_tokens == pytest.approx(2180.0 / 50_000, abs=1e-5)  # $0.0436


def test_activation_checkpointing_costs_a_third_more_time_on_p4d_by_hand():
    # on a 40 GiB A100 the 1b config needs activation checkpointing: MFU 0.40 x 3/4 = 0.30
    option = plan_option(load_workload("1b"), P4D, 50e9)
    assert (option.nodes, option.activation_checkpointing) == (1, True)
    assert option.mfu_effective == pytest.approx(0.30)
    hours = 9_025_499_136 * 50e9 / (8 * 312e12 * 0.30) / 3600  # 160.7 h
    assert option.hours == pytest.approx(hours)
    assert option.cost_usd == pytest.approx(hours * 21.96)
    assert option.fp8_backend == "none"  # the A100 has no FP8: the config's te becomes none


def test_attention_flops_grow_with_the_sequence():
    short, long = load_workload("1b", seq_len=2048), load_workload("1b", seq_len=8192)
    assert shapes.flops_per_token(long.model, 8192) - shapes.flops_per_token(short.model, 2048) == (
        12 * 16 * 2048 * (8192 - 2048))


def test_more_nodes_same_gpu_hours_less_time():
    workload = load_workload("1b")
    one, four = plan_option(workload, P5, 50e9, nodes=1), plan_option(workload, P5, 50e9, nodes=4)
    assert four.hours == pytest.approx(one.hours / 4)
    assert four.gpu_hours == pytest.approx(one.gpu_hours)
    assert four.cost_usd == pytest.approx(one.cost_usd)


def test_deadline_picks_the_fewest_nodes_that_finish_in_time():
    workload = load_workload("llama3-70b")
    # 240 micro-batches of 8 GPUs x 8192 tokens a step: any node count that divides 240 splits it evenly
    batch = 240 * 8 * 8192
    option = plan_option(workload, P5, 1e12, deadline_days=30, global_batch_tokens=batch)
    assert option.viable and option.hours <= 30 * 24
    assert option.node_counts == (3, 4, 5, 6, 8, 10, 12, 15, 16, 20, 24, 30, 40, 48, 60, 80, 120, 240)  # fits from 3
    # the time is FLOPs over nodes: the fewest that finish = the first count at or above time on one node / deadline
    on_one = training_hours(option.total_flops, P5, 1, option.mfu_effective)
    assert option.nodes == min(n for n in option.node_counts if n >= math.ceil(on_one / (30 * 24))) == 80
    fewer = plan_option(workload, P5, 1e12, nodes=60, global_batch_tokens=batch)
    assert fewer.hours > 30 * 24


def test_a_deadline_beyond_the_most_nodes_is_not_viable_and_says_what_limits_them():
    workload = load_workload("llama3-70b")
    option = plan_option(workload, P4D, 15e12, deadline_days=1, global_batch_tokens=2**24)
    assert not option.viable and option.problem.startswith("misses the deadline: ")
    assert option.problem.endswith(" days on 256 nodes (the most a cluster holds)")
    # at the default global batch of 4Mi tokens, 64 nodes (512 GPUs x 8192 tokens) are the most that split it
    option = plan_option(workload, P4D, 15e12, deadline_days=1)
    assert option.problem.endswith(" days on 64 nodes (the most that split the global batch; --global-batch-tokens "
                                   "8388608 allows more)")


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
    # measured with AC at 0.45; the p4d plan also needs AC: used as is
    p4d = plan_option(load_workload("1b"), P4D, 50e9, measurements=measured)
    assert p4d.activation_checkpointing and p4d.mfu_effective == 0.45
    # with more nodes the A100 plan could drop AC, and the same figure is worth 4/3 without recomputation
    assert p4d.mfu.at(False) == pytest.approx(0.60)
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


def test_plan_prints_the_table_ranking_and_the_commands_of_the_cheapest(cli):
    result = cli("plan", "--model", "llama3-8b", "--tokens", "100B", "--instance-types",
                 "p4d.24xlarge,p5.48xlarge")
    assert result.code == EXIT_OK, result.err
    lines = result.lines
    assert lines[0] == ("plan: llama3-8b (8.03B parameters), 100B tokens, seq 8192 x micro-batch 1 per GPU "
                        "(training/configs/llama3-8b.toml)")
    # 100e9 / 4,194,304 = 23,841.9 -> 23,842 steps
    assert lines[1].startswith("global batch: 4,194,304 tokens a step at any node count (the default, 4Mi tokens "
                               "as Llama 2 and 3 trained; --global-batch-tokens changes it): 23,842 steps; ")
    assert lines[2].split() == ["TYPE", "GPUS", "FP8", "FITS", "FROM", "NODES", "ACCUM", "AC", "GIB/GPU", "MFU",
                                "MFU", "FROM", "DAYS", "INSTANCES", "FSX", "TOTAL", "$/M", "TOKENS"]
    p4d_row, p5_row = lines[3].split(), lines[4].split()
    # the A100 needs activation checkpointing at any count: 16 nodes (4 micro-batches each) is within 1% of the
    # cheapest (64: FSx for the fewest hours); the H100 runs without it from 2 nodes, at 8 within 1%
    assert p4d_row[:10] == ["p4d.24xlarge", "8xA100", "40G", "no", "1", "(AC)", "16", "4", "on", "15.3/35.0"]
    assert p5_row[:11] == ["p5.48xlarge", "8xH100", "80G", "torchao", "1", "(AC),", "2", "without", "8", "8", "off"]
    assert p5_row[12:] == ["0.40", "assumed", "2.65", "$27,978", "$251", "$28,229", "$0.2823"]
    assert any(line.startswith("MFU H100 fp8 torchao: 0.40 default (no measured figure for llama3-8b on H100 "
                               "with fp8 torchao tensorwise in benchmarks/mfu.json") for line in lines)
    assert "by cost: p5.48xlarge $28,229, p4d.24xlarge $47,709" in lines
    assert ("chosen: p5.48xlarge x 8, 2.6 days, $28,229 ($0.28 per million tokens): the cheapest per token of the "
            "plans that finish within 30 days (costs within 1% count as equal: then the fewest nodes, easier to "
            "get); check the quota, deploy, then run:") in lines
    assert "  clusterctl quota --instance-type p5.48xlarge --nodes 8" in lines
    assert '  make deploy CDK_ARGS="-c instanceType=p5.48xlarge -c nodeCount=8"' in lines
    assert ("  clusterctl submit --config training/configs/llama3-8b.toml --nodes 8 --set run.steps=23842 "
            "--set run.global_batch_tokens=4194304 --set parallel.activation_checkpointing=false") in lines


def test_the_overrides_make_the_config_run_what_was_planned(cli):
    result = cli("plan", "--model", "llama3-8b", "--tokens", "10B", "--instance-types", "p4d.24xlarge",
                 "--seq-len", "2048", "--micro-batch-size", "2", "--nodes", "8", "--choose", "time")
    assert result.code == EXIT_OK, result.err
    (submit,) = [line for line in result.lines if line.startswith("  clusterctl submit ")]
    # 10e9 / 4,194,304 = 2,384.2 -> 2,385 steps; at 8 nodes of A100s it fits without AC (the config has it on)
    # and runs bf16 (the config says torchao)
    assert submit == ("  clusterctl submit --config training/configs/llama3-8b.toml --nodes 8 --set run.steps=2385 "
                      "--set run.global_batch_tokens=4194304 --set run.seq_len=2048 --set run.micro_batch_size=2 "
                      "--set parallel.activation_checkpointing=false --set fp8.backend=none")


def test_plan_json_has_every_figure(cli):
    result = cli("plan", "--model", "1b", "--tokens", "50B", "--instance-types", "p5.48xlarge", "--nodes", "1",
                 "--json")
    assert result.code == EXIT_OK
    report = json.loads(result.out)
    (option,) = report["options"]
    assert option["instanceType"] == "p5.48xlarge" and option["viable"] is True
    assert option["nodes"] == 1 and option["gpus"] == 8 and option["activationCheckpointing"] is False
    assert option["fp8Available"] is True and option["fp8Backend"] == "torchao"
    assert option["mfu"] == 0.4 and option["mfuSource"] == "default"
    assert option["onDemandUsd"] == pytest.approx(2180.0, abs=0.1)
    # FSx for Lustre, cdk.json's 4,800 GiB at 1000 MB/s/TiB: $0.600 per GB-month over 730 h, for 39.61 h
    assert option["fsxUsd"] == pytest.approx(4800 * 0.600 / 730 * 39.61, abs=0.1)  # $156.3
    assert option["totalUsd"] == pytest.approx(option["onDemandUsd"] + option["fsxUsd"], abs=0.02)
    assert option["gradAccumSteps"] == 32  # 4,194,304 / (4096 x 4 x 8 GPUs)
    assert report["globalBatchTokens"] == 4_194_304 and report["steps"] == 11_921  # 50e9 / 4,194,304
    assert report["fsx"]["storageGiB"] == 4800 and report["fsx"]["throughputMBpsPerTiB"] == 1000
    assert option["memoryPerGpu"]["usableGiB"] == 73.0
    assert set(option["memoryPerGpu"]["phases"]) >= {"forward into the loss", "optimizer step"}
    assert report["flopsPerToken"] == ONE_B_FLOPS_PER_TOKEN
    assert report["rankedByCost"] == report["rankedByTime"] == ["p5.48xlarge"]
    assert report["chosen"]["deploy"] == 'make deploy CDK_ARGS="-c instanceType=p5.48xlarge -c nodeCount=1"'


def test_explain_shows_the_memory_flops_time_and_cost_arithmetic(cli):
    result = cli("plan", "--model", "1b", "--tokens", "50B", "--instance-types", "p5.48xlarge", "--nodes", "1",
                 "--explain")
    assert result.code == EXIT_OK
    out = result.out
    assert ("  FLOPs per token = 6 x 1,235,814,400 (parameters outside the embedding) + 12 x 16 layers x 2048 dim "
            "x 4096 seq = 9.025e+09") in out
    assert "p5.48xlarge at 1 nodes (8 GPUs), activation checkpointing off:" in out
    assert "  usable per GPU: 80 GiB x (1 - 0.05 allocator margin) - 3 GiB runtime reserve = 73.00 GiB" in out
    assert "  throughput = 1 nodes x 8 GPUs x 989 TFLOP/s (dense BF16) x MFU 0.400 = 3.165e+15 FLOP/s" in out
    assert ("  cost = 1 x 39.6 h x $55.04/h (catalog on-demand, us-east-1) = $2,180, + FSx for Lustre 39.6 h x "
            "$3.95/h = $156: $2,336; per million tokens $0.0467") in out


def test_mfu_override_is_said(cli):
    result = cli("plan", "--model", "1b", "--tokens", "50B", "--instance-types", "p5.48xlarge", "--mfu", "0.5")
    assert "MFU H100 fp8 torchao: 0.50 from --mfu (without activation checkpointing)" in result.lines


def test_nothing_fits_exits_1_and_says_what_to_try(cli):
    result = cli("plan", "--model", "llama3-70b", "--tokens", "1T", "--instance-types", "p4d.24xlarge",
                 "--nodes", "2")
    assert result.code == EXIT_FAILED
    # 21 (was 31 until the trainer freed the bf16 logits before backward; test_plan_memory.py has the arithmetic)
    assert "p4d.24xlarge: does not fit on 2 nodes (needs 21): " in result.out
    assert result.lines[-1] == ("no instance type fits: try a shorter --seq-len, --micro-batch-size 1, or a "
                                "later deadline")


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
    # other); it fits without checkpointing: the plan turns it off; 2e9 / 4,194,304 = 476.8 -> 477 steps
    assert report["chosen"]["overrides"] == ["run.steps=477", "run.global_batch_tokens=4194304",
                                             "run.grad_accum_steps=1", "parallel.activation_checkpointing=false"]
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
        "tiny-cpu) or a training config TOML file")


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
