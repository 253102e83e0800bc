"""Hot spares (spareNodes) in clusterctl: submit runs a job on NodeCount nodes and says the spares stay idle,
`nodes` and `top` count them, and `plan` prices and deploys them. The stack's SpareNodes output is read from
moto's CloudFormation; a stack deployed before it has no spares."""

from __future__ import annotations

import dataclasses
import datetime
import json

import pytest
from job_record_fakes import TINY
from rich.console import Console

from cluster_aws.errors import EXIT_OK
from cluster_spec.settings import MAX_SPARE_NODES
from clusterctl.watch.collect import ClusterView, NodeView
from clusterctl.watch.view import render

SPARE_OUTPUTS = {"NodeCount": "2", "SpareNodes": "1"}  # a group of 3: 2 for jobs, 1 spare
# tiny-cpu saves only at the end (interval 0), which submit warns of: a durable interval keeps stderr to the notes
SAVING = ("--set", "checkpoint.interval_steps=50")


def test_submit_runs_on_node_count_and_leaves_the_spare_idle(at_now, sent, moto_aws, fakes):
    cluster = fakes.deploy_fake_cluster(nodes=3, extra_outputs=SPARE_OUTPUTS)
    result = at_now("submit", "--config", TINY, *SAVING)
    assert result.code == EXIT_OK, result.err
    record = fakes.job_table().get(result.lines[0])
    assert record.nodes == 2 and record.current.nodes == cluster.instance_ids[:2]
    assert result.err.strip() == ("clusterctl: note: 1 node stays idle as a hot spare: if the job loses a node, "
                                  "the job keeper restarts it on a spare in its next round")


def test_a_job_on_the_spares_says_what_is_left(at_now, sent, moto_aws, fakes):
    fakes.deploy_fake_cluster(nodes=3, extra_outputs=SPARE_OUTPUTS)
    result = at_now("submit", "--config", TINY, "--nodes", "3", *SAVING)
    assert result.code == EXIT_OK, result.err
    assert result.err.strip() == ("clusterctl: note: this job runs on 1 of the 1 spare nodes (--nodes 3 > "
                                  "NodeCount 2): 0 left for a restart without waiting for a replacement to boot")


def test_a_stack_without_spares_says_nothing_of_them(at_now, sent, cluster, fakes):
    result = at_now("submit", "--config", TINY, "--nodes", "2", *SAVING)
    assert result.code == EXIT_OK and result.err == ""  # an idle node, but no spare the operator asked for


def test_nodes_counts_the_group_and_names_the_spares(cli, moto_aws, fakes):
    fakes.deploy_fake_cluster(nodes=3, extra_outputs=SPARE_OUTPUTS)
    result = cli("nodes")
    assert result.lines[-1] == ("3 of 3 nodes ready (TrainingClusterStack: 2 x p5.48xlarge for jobs + 1 spare, "
                                "capacity on-demand)")


def test_plan_prices_and_deploys_the_spares(cli):
    plain = json.loads(cli("plan", "--model", "1b", "--tokens", "50B", "--instance-types", "p5.48xlarge",
                           "--nodes", "1", "--json").out)
    spared = json.loads(cli("plan", "--model", "1b", "--tokens", "50B", "--instance-types", "p5.48xlarge",
                            "--nodes", "1", "--spare-nodes", "1", "--json").out)
    (one,), (two,) = plain["options"], spared["options"]
    assert (one["nodes"], one["spareNodes"], two["nodes"], two["spareNodes"]) == (1, 0, 1, 1)
    assert two["hours"] == one["hours"]  # the spare does not train
    assert two["onDemandUsd"] == pytest.approx(2 * one["onDemandUsd"], abs=0.02)  # but is paid for all along
    assert spared["chosen"]["deploy"].endswith("-c nodeCount=1 -c spareNodes=1\"")
    assert spared["chosen"]["quota"] == "clusterctl quota --instance-type p5.48xlarge --nodes 2"
    explained = cli("plan", "--model", "1b", "--tokens", "50B", "--instance-types", "p5.48xlarge",
                    "--nodes", "1", "--spare-nodes", "1", "--explain").out
    assert "  cost = (1 + 1 spare) x " in explained


def test_top_says_how_many_of_the_group_are_spares():
    at = datetime.datetime(2026, 11, 20, 23, 30, tzinfo=datetime.UTC)
    nodes = [NodeView(f"i-0aaaaaaaaaaaaaaa{i}", "InService", "ready", 90.0, 1.0, 81_559.0, 60.0, 600.0, 1.0, 1.0, 0.0)
             for i in range(3)]
    view = ClusterView(stack_name="TrainingClusterStack", instance_type="p5.48xlarge", node_count=3,
                       collected_at=at, nodes=nodes, job=None, group_created_at=None, cost_usd=None,
                       usd_per_node_hour=55.04, spare_nodes=1)
    console = Console(width=150, color_system=None)
    with console.capture() as capture:
        console.print(render(view))
    assert "3/3 x p5.48xlarge in service (1 of them spare)   as of" in capture.get()
    with console.capture() as capture:
        console.print(render(dataclasses.replace(view, spare_nodes=0)))
    assert "3/3 x p5.48xlarge in service   as of" in capture.get()


def test_cost_adds_the_spares_of_a_plan_and_of_the_stack(cli, at_now, sent, moto_aws, fakes):
    planned = cli("cost", "--instance-type", "p5.48xlarge", "--nodes", "2", "--hours", "10", "--spare-nodes", "1")
    assert planned.lines[:2] == [
        "plan: 2 x p5.48xlarge for 10.00 h = $1,100.80 ($110.08/h, 160 GPU-hours)",
        "plus 1 hot spare (spareNodes) over the same 10.00 h = $550.40: $1,651.20 in all"]
    fakes.deploy_fake_cluster(nodes=3, extra_outputs=SPARE_OUTPUTS)
    job_id = at_now("submit", "--config", TINY).lines[0]
    report = json.loads(at_now("cost", "--job", job_id, "--json").out)
    assert (report["nodes"], report["spareNodes"]) == (2, 1)
    assert report["totalWithSparesUsd"] == pytest.approx(report["totalUsd"] * 1.5, abs=0.02)
    refused = at_now("cost", "--job", job_id, "--spare-nodes", "1")
    assert refused.code == 2 and "drop --nodes/--hours/--spare-nodes" in refused.err


@pytest.mark.parametrize("value", ["65", "1000", "-1", "two"])
def test_cost_takes_the_spares_the_stack_takes_and_names_the_range(cli, capsys, value):
    """0 to cluster_spec.settings.MAX_SPARE_NODES, the bound spareNodes has at synthesis (issue 42)."""
    with pytest.raises(SystemExit) as exit_info:
        cli("cost", "--nodes", "2", "--hours", "1", "--spare-nodes", value)
    assert exit_info.value.code == 2
    assert capsys.readouterr().err.splitlines()[-1] == (
        f"clusterctl cost: error: argument --spare-nodes: {value}: allowed: an integer 0 to {MAX_SPARE_NODES} (the "
        "stack's spareNodes)")
    assert cli("cost", "--nodes", "2", "--hours", "1", "--spare-nodes", str(MAX_SPARE_NODES)).code == EXIT_OK
