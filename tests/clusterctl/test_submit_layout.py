"""submit refuses a [parallel] layout the job cannot run, offline, in the trainer's own words (issue 43):
`--dry-run` checks it from --nodes and --instance-type, a submit from the stack's node count and type."""

import json

from cluster_aws.errors import EXIT_OK, EXIT_USAGE


def test_dry_run_shows_the_checked_layout(cli):
    result = cli("submit", "--config", "training/configs/llama3-70b.toml", "--nodes", "32", "--instance-type",
                 "p5.48xlarge", "--set", "parallel.tp=8", "--dry-run")
    assert result.code == EXIT_OK, result.err
    assert "layout: TP 8 x FSDP 32 on 32 x p5.48xlarge (checked)" in result.lines
    settings = result.out.split("settings:\n")[1].split("layout:")[0]
    rows = dict(line.split(None, 1) for line in settings.splitlines())
    assert (rows["parallel.dp_replicate"], rows["parallel.dp_shard"], rows["parallel.tp"]) == ("1", "-1", "8")
    as_json = cli("submit", "--config", "training/configs/llama3-70b.toml", "--nodes", "4", "--instance-type",
                  "p5.48xlarge", "--set", "parallel.dp_replicate=2", "--dry-run", "--json")
    assert json.loads(as_json.out)["layout"] == {"dp_replicate": 2, "dp_shard": 16, "tp": 1}


def test_dry_run_refuses_tp_over_a_node_in_one_line(cli):
    result = cli("submit", "--config", "training/configs/llama3-8b.toml", "--nodes", "2", "--instance-type",
                 "p5.48xlarge", "--set", "parallel.tp=16", "--dry-run")
    assert result.code == EXIT_USAGE
    assert result.err.strip() == (
        "clusterctl: error: not submitted: training/configs/llama3-8b.toml with the --set items on 2 nodes of 8 GPUs: "
        "parallel.tp=16: "
        "a tensor-parallel group stays on one node's 8 GPUs; allowed: 1, 2, 4, 8")


def test_dry_run_without_the_instance_type_leaves_the_layout_to_the_submit(cli):
    result = cli("submit", "--config", "training/configs/llama3-8b.toml", "--nodes", "3",
                 "--set", "parallel.dp_replicate=2", "--dry-run")
    assert result.code == EXIT_OK, result.err
    assert not any(line.startswith("layout:") for line in result.lines)
