"""`clusterctl plan` puts forward a plan a person would act on (issue 28): the cheapest per token within a horizon
(activation checkpointing's cost weighed against more nodes), `--choose time` at each type's fastest count, the
cluster's node limit everywhere, a global batch that means the same at any node count, FSx for Lustre in the cost,
the MFU's source per row, --region refused, a closed stdout, and a negative --tokens."""

import json
import os
import subprocess
import sys

import pytest

import clusterctl.plan.mfu
from cluster_aws.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from cluster_spec.settings import MAX_NODE_COUNT
from clusterctl.plan import options
from clusterctl.plan.choose import plan_option
from clusterctl.plan.fsx_cost import stack_fsx
from clusterctl.plan.workload import load_workload
from instance_catalog.instance_types import get_instance_type

P5 = get_instance_type("p5.48xlarge")
FSX_USD_PER_HOUR = 4800 * 0.600 / 730  # cdk.json's 4,800 GiB at 1000 MB/s/TiB, $0.600 per GB-month


@pytest.fixture(autouse=True)
def no_measurements(monkeypatch, tmp_path):
    """The default MFU unless a test says otherwise (the real benchmarks/mfu.json may gain rows)."""
    table = tmp_path / "mfu.json"
    table.write_text('{"measurements": []}')
    monkeypatch.setattr(clusterctl.plan.mfu, "MEASURED_MFU_PATH", table)


def plan_json(cli, *argv):
    result = cli("plan", *argv, "--json")
    assert result.code == EXIT_OK, result.err
    return json.loads(result.out)


def by_type(report):
    return {o["instanceType"]: o for o in report["options"]}


def test_llama3_70b_on_1t_tokens_is_planned_within_the_horizon(cli):
    # was: 3 p5 nodes for 782 days, "chosen (cheapest)" 1 p6-b200 node for 1,032 days
    report = plan_json(cli, "--model", "llama3-70b", "--tokens", "1T")
    assert report["horizonDays"] == 30 and report["globalBatchTokens"] == 4_194_304
    rows = by_type(report)
    # every type at its fastest: 64 nodes, the most that split 4Mi tokens (512 GPUs x 8192); only B200s finish
    # within 30 days
    assert {name: (o["nodes"], o["withinHorizon"]) for name, o in rows.items()} == {
        "p4d.24xlarge": (64, False), "p4de.24xlarge": (64, False), "p5.48xlarge": (64, False),
        "p5e.48xlarge": (64, False), "p5en.48xlarge": (64, False), "p6-b200.48xlarge": (64, True)}
    assert report["chosen"]["instanceType"] == "p6-b200.48xlarge" and report["chosen"]["nodes"] == 64
    assert rows["p6-b200.48xlarge"]["days"] == pytest.approx(16.12, abs=0.01)
    assert report["rankedByCost"][0] == "p6-b200.48xlarge"  # within the horizon first


def test_llama3_70b_text_says_why_each_type_is_beyond_the_horizon(cli):
    result = cli("plan", "--model", "llama3-70b", "--tokens", "1T")
    assert result.code == EXIT_OK, result.err
    assert ("p5.48xlarge: 36.7 days even at 64 nodes (the most that split the global batch; --global-batch-tokens "
            "8388608 allows more)") in result.lines
    chosen = "chosen: p6-b200.48xlarge x 64, 16.1 days, $2,823,068 ($2.82 per million tokens): the cheapest per token "
    assert any(line.startswith(chosen + "of the plans that finish within 30 days") for line in result.lines)
    (p5_row,) = [line.split() for line in result.lines if line.startswith("p5.48xlarge ")]
    assert p5_row[-6:-4] == ["36.7", "(>30)"]  # beyond the horizon, marked


def test_the_cheapest_weighs_activation_checkpointing_against_more_nodes(cli):
    # was: 1 p5 node with activation checkpointing, 56.5 days, $74.6k, though 2 nodes without it cost $56.0k
    report = plan_json(cli, "--model", "llama3-8b", "--tokens", "200B", "--instance-types", "p5.48xlarge")
    (option,) = report["options"]
    one_node = plan_json(cli, "--model", "llama3-8b", "--tokens", "200B", "--instance-types", "p5.48xlarge",
                         "--nodes", "1")["options"][0]
    two_nodes = plan_json(cli, "--model", "llama3-8b", "--tokens", "200B", "--instance-types", "p5.48xlarge",
                          "--nodes", "2")["options"][0]
    assert one_node["activationCheckpointing"] and not two_nodes["activationCheckpointing"]
    assert two_nodes["onDemandUsd"] == pytest.approx(55_956, abs=1)
    assert one_node["onDemandUsd"] == pytest.approx(55_956 * 4 / 3, abs=1)  # a third more: the recomputed forward
    # the choice runs without checkpointing; more nodes cost the same instance-hours and less FSx time: 8 nodes are
    # within 1% of the cheapest count (64), and the fewest such
    assert (option["nodes"], option["activationCheckpointing"]) == (8, False)
    assert option["totalUsd"] < two_nodes["totalUsd"] < one_node["totalUsd"]
    cheapest = plan_json(cli, "--model", "llama3-8b", "--tokens", "200B", "--instance-types", "p5.48xlarge",
                         "--nodes", "64")["options"][0]
    assert cheapest["totalUsd"] <= option["totalUsd"] <= cheapest["totalUsd"] * 1.01
    four = plan_json(cli, "--model", "llama3-8b", "--tokens", "200B", "--instance-types", "p5.48xlarge",
                     "--nodes", "4")["options"][0]
    assert four["totalUsd"] > cheapest["totalUsd"] * 1.01


def test_llama3_8b_on_200b_tokens_chooses_the_cheapest_type_per_token(cli):
    report = plan_json(cli, "--model", "llama3-8b", "--tokens", "200B")
    rows = by_type(report)
    assert report["chosen"]["instanceType"] == "p6-b200.48xlarge" and report["chosen"]["nodes"] == 4
    chosen = rows["p6-b200.48xlarge"]
    assert chosen["usdPerMillionTokens"] == min(o["usdPerMillionTokens"] for o in rows.values())
    assert chosen["days"] == pytest.approx(4.65, abs=0.01) and not chosen["activationCheckpointing"]
    assert report["chosen"]["overrides"] == ["run.steps=47684", "run.global_batch_tokens=4194304",
                                             "parallel.activation_checkpointing=false"]


def test_the_horizon_flag_and_the_warning_when_nothing_fits(cli):
    # within 3 days on p5s: the cheapest count that finishes in time (16 nodes: 2.65 days; 8 take 5.3)
    report = plan_json(cli, "--model", "llama3-8b", "--tokens", "200B", "--instance-types", "p5.48xlarge",
                       "--horizon-days", "3")
    assert report["options"][0]["nodes"] == 16 and report["horizonDays"] == 3
    result = cli("plan", "--model", "llama3-70b", "--tokens", "1T", "--horizon-days", "10")
    assert result.code == EXIT_OK
    warnings = [line for line in result.lines if line.startswith("warning:")]
    assert warnings == ["warning: no plan finishes within 10 days: each type is shown at its fastest count; "
                        "--horizon-days allows longer"]
    # the fastest is put forward then
    assert any(line.startswith("chosen: p6-b200.48xlarge x 64, 16.1 days,") for line in result.lines)


def test_choose_time_compares_each_type_at_its_fastest_count(cli):
    # was: p4d.24xlarge x 21 for 354 days, each type at its own smallest count
    report = plan_json(cli, "--model", "llama3-70b", "--tokens", "1T", "--choose", "time")
    rows = by_type(report)
    assert {o["nodes"] for o in rows.values()} == {64}
    assert report["rankedByTime"][0] == "p6-b200.48xlarge" and report["chosen"]["nodes"] == 64
    assert rows["p4d.24xlarge"]["days"] > rows["p5.48xlarge"]["days"] > rows["p6-b200.48xlarge"]["days"]
    # with a global batch that 256 nodes can split, the cluster's limit is the fastest count
    report = plan_json(cli, "--model", "llama3-70b", "--tokens", "1T", "--choose", "time", "--global-batch-tokens",
                       str(2**24), "--instance-types", "p5.48xlarge")
    assert report["options"][0]["nodes"] == MAX_NODE_COUNT == 256


def test_the_node_limit_is_the_clusters_everywhere(cli):
    assert options.MAX_NODES is MAX_NODE_COUNT  # the constant synthesis checks nodeCount against
    with pytest.raises(SystemExit) as exit_info:
        cli("plan", "--model", "llama3-70b", "--tokens", "1T", "--nodes", "1000")
    assert exit_info.value.code == EXIT_USAGE
    result = cli("plan", "--model", "llama3-8b", "--tokens", "1B", "--nodes", "250", "--spare-nodes", "10")
    assert (result.code, result.err) == (EXIT_USAGE, "clusterctl: error: --spare-nodes=10: --nodes + --spare-nodes "
                                                     "must be <= 256 (--nodes=250)\n")
    result = cli("plan", "--model", "llama3-8b", "--tokens", "1B", "--spare-nodes", "256")
    assert (result.code, result.err) == (EXIT_USAGE, "clusterctl: error: --spare-nodes=256: --nodes + --spare-nodes "
                                                     "must be <= 256 (--nodes=at least 1)\n")
    # spares count against the limit when the plan picks the count
    option = plan_option(load_workload("llama3-70b"), P5, 1e12, choose="time", global_batch_tokens=2**24,
                         spare_nodes=2)
    assert option.nodes == 128  # 256 - 2 = 254 does not divide 256 micro-batches


def test_nodes_1000_says_the_limit(capsys, cli):
    with pytest.raises(SystemExit):
        cli("plan", "--model", "llama3-70b", "--tokens", "1T", "--nodes", "1000")
    assert capsys.readouterr().err.splitlines()[-1] == (
        "clusterctl plan: error: argument --nodes: '1000': allowed: 1 to 256 (a cluster's nodeCount + spareNodes)")


def test_the_global_batch_is_the_same_at_any_node_count(cli):
    workload = load_workload("llama3-8b")
    two = plan_option(workload, P5, 200e9, nodes=2)
    sixty_four = plan_option(workload, P5, 200e9, nodes=64)
    # 4,194,304 tokens = seq 8192 x micro-batch 1 x GPUs x accumulation
    assert (two.grad_accum_steps, sixty_four.grad_accum_steps) == (32, 1)
    assert options.steps_for(workload, two) == options.steps_for(workload, sixty_four) == 47_684
    # a count that does not split it is refused, naming the counts that do
    three = plan_option(workload, P5, 200e9, nodes=3)
    assert three.problem == ("3 nodes do not split the global batch of 4,194,304 tokens into whole micro-batches "
                             "(196,608 tokens per micro-step); node counts that do: 1, 2, 4, 8, 16, 32, 64")
    result = cli("plan", "--model", "llama3-8b", "--tokens", "200B", "--global-batch-tokens", "3000000",
                 "--instance-types", "p5.48xlarge", "--json")
    assert result.code == EXIT_FAILED
    report = json.loads(result.out)
    assert report["options"][0]["problem"].startswith(
        "fits from 1 nodes, but no count from 1 to 256 splits the global batch of 3,000,000 tokens into whole "
        "micro-batches (65,536 tokens per node: seq 8192 x micro-batch 1 x 8 GPUs)")


def test_a_config_with_a_global_batch_is_planned_with_it(cli, tmp_path):
    config = tmp_path / "8b-8m.toml"
    config.write_text("[run]\nseq_len = 8192\nmicro_batch_size = 1\nglobal_batch_tokens = 8388608\n"
                      "[model]\npreset = 'llama3-8b'\n")
    report = plan_json(cli, "--model", str(config), "--tokens", "200B", "--instance-types", "p5.48xlarge")
    assert report["globalBatchTokens"] == 8_388_608
    assert report["options"][0]["nodeCounts"][-1] == 128
    assert "run.global_batch_tokens=8388608" not in report["chosen"]["overrides"]  # the config has it already
    text = cli("plan", "--model", str(config), "--tokens", "200B", "--instance-types", "p5.48xlarge").lines
    assert text[1].startswith(f"global batch: 8,388,608 tokens a step at any node count (run.global_batch_tokens in "
                              f"{config}): 23,842 steps")


def test_fsx_and_the_mfu_source_are_in_every_row(cli, monkeypatch, tmp_path):
    fsx = stack_fsx()
    assert (fsx.storage_gib, fsx.throughput_mbps_per_tib) == (4800, 1000)  # cdk.json's defaults
    assert fsx.usd_per_hour == pytest.approx(FSX_USD_PER_HOUR)  # $3.95/h
    result = cli("plan", "--model", "1b", "--tokens", "50B", "--instance-types", "p5.48xlarge", "--nodes", "1")
    assert ("FSx for Lustre: 4,800 GiB at 1000 MB/s/TiB (cdk.json fsxStorageGiB, fsxThroughputPerTiB) x $0.600 per "
            "GB-month / 730 h = $3.95/h (aws.amazon.com/fsx/lustre/pricing, us-east-1 PERSISTENT_2 SSD, 2026-11)"
            ) in result.lines
    (row,) = [line.split() for line in result.lines if line.startswith("p5.48xlarge ")]
    # 39.61 h: $2,180 of instances, $156 of FSx
    assert row[-7:] == ["0.40", "assumed", "1.65", "$2,180", "$156", "$2,336", "$0.0467"]
    # a measured figure says so in its row
    monkeypatch.setattr(clusterctl.plan.mfu, "MEASURED_MFU_PATH", clusterctl.plan.mfu.Path(
        options.__file__).resolve().parents[2] / "benchmarks" / "mfu.json")
    config = tmp_path / "1b-bf16.toml"
    config.write_text("[run]\nseq_len = 4096\nmicro_batch_size = 4\n[model]\npreset = '1b'\n"
                      "[parallel]\ncompile = true\n[fp8]\nbackend = 'none'\n")
    result = cli("plan", "--model", str(config), "--tokens", "50B", "--instance-types", "p5.48xlarge")
    (row,) = [line.split() for line in result.lines if line.startswith("p5.48xlarge ")]
    assert row[9:11] == ["0.47", "measured"]


def test_a_file_system_the_price_table_does_not_know_is_one_line(tmp_path):
    cdk_json = tmp_path / "cdk.json"
    cdk_json.write_text('{"context": {"fsxStorageGiB": 4800, "fsxThroughputPerTiB": 40}}')
    with pytest.raises(Exception, match=r"fsxThroughputPerTiB=40: allowed: 125, 250, 500, 1000"):
        stack_fsx(cdk_json)
    assert stack_fsx(tmp_path / "absent.json") is None


def test_plan_refuses_another_regions_prices_in_one_line(cli):
    result = cli("--region", "eu-north-1", "plan", "--model", "1b", "--tokens", "1B")
    assert result.code == EXIT_USAGE
    assert result.err == ("clusterctl: error: --region=eu-north-1: plan prices every type at the catalog's us-east-1 "
                          "list prices and asks no AWS API; drop --region, and see eu-north-1's prices with "
                          "`clusterctl capacity prices --regions eu-north-1`\n")
    assert cli("plan", "--model", "1b", "--tokens", "1B", "--region", "us-east-1").code == EXIT_OK


def test_a_closed_stdout_ends_quietly(tmp_path):
    # the reader of the pipe is gone before clusterctl writes (as `| head -1` does once it has its line)
    read_end, write_end = os.pipe()
    os.close(read_end)
    env = {**os.environ, "AWS_CONFIG_FILE": str(tmp_path / "none"), "AWS_SHARED_CREDENTIALS_FILE":
           str(tmp_path / "none"), "AWS_EC2_METADATA_DISABLED": "true", "PYTHONPATH": os.pathsep.join(sys.path)}
    try:
        done = subprocess.run([sys.executable, "-m", "clusterctl", "--json", "plan", "--model", "llama3-70b",
                               "--tokens", "1T"], stdout=write_end, stderr=subprocess.PIPE, env=env, timeout=60)
    finally:
        os.close(write_end)
    assert done.stderr.decode() == ""  # was: "clusterctl: error: unexpected BrokenPipeError: ..."
    assert done.returncode == 1
    # and through a real `head -1`
    shell = subprocess.run(f"{sys.executable} -m clusterctl --json plan --model llama3-70b --tokens 1T | head -1",
                           shell=True, capture_output=True, env=env, timeout=60)
    assert (shell.stdout.decode(), shell.stderr.decode()) == ("{\n", "")
