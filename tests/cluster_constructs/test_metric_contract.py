"""Every metric the dashboard graphs and the alarms watch is one the cluster really publishes: by the CloudWatch
agent config in the node config (as synthesized into user-data), by the EFA collector's EMF lines, by the
trainer's EMF step records, or by AWS (Auto Scaling group metrics, FSx). A renamed metric, a dropped
measurement or a changed dimension set fails here instead of leaving an empty graph or a silent alarm."""

from __future__ import annotations

import copy
import io
import json
import re

import pytest
from metric_contract import (
    agent_published,
    alarm_references,
    aws_published,
    cli_published,
    dashboard_bodies,
    dashboard_references,
    emf_published,
    unproduced,
)

from node_bootstrap.config import parse_node_config
from node_bootstrap.efa_metrics import Collector

GROUP = "TrainingClusterStack-nodes"
CLUSTER = "TrainingClusterStack"
VARIANT = "default-p5-on-demand"


@pytest.fixture(scope="module")
def stack(synth):
    return synth(VARIANT)


def node_config_in_user_data(stack) -> dict:
    (lt,) = stack.resources("AWS::EC2::LaunchTemplate").values()
    parts = lt["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
    text = "".join(p if isinstance(p, str) else "TOKEN" for p in parts)
    match = re.search(r"<<'NODE_CONFIG_EOF'\n(.*?)\nNODE_CONFIG_EOF\n", text, re.S)
    return json.loads(match.group(1))


@pytest.fixture(scope="module")
def node_config(stack) -> dict:
    return node_config_in_user_data(stack)


def efa_lines(tmp_path, node_config) -> list[str]:
    counters = tmp_path / "sys/class/infiniband/rdmap79s0/ports/1/hw_counters"
    counters.mkdir(parents=True)
    names = ("tx_bytes", "rx_bytes", "rx_drops", "rdma_read_bytes", "rdma_write_bytes", "rdma_read_wr_err",
             "rdma_write_wr_err", "retrans_pkts", "retrans_timeout_events", "unresponsive_remote_events",
             "impaired_remote_conn_events")
    for name in names:
        (counters / name).write_text("0\n")
    times = iter([1_795_000_000.0, 1_795_000_060.0])
    collector = Collector(parse_node_config(node_config).metrics, "i-0a1b2c3d4e5f60718", root=str(tmp_path),
                          clock=lambda: next(times))
    collector.sample()
    for name in names:
        (counters / name).write_text("5\n")
    return collector.sample()


def trainer_lines(monkeypatch) -> list[str]:
    import torch

    from training.metrics import MetricsConfig, MetricsLogger, ThroughputModel
    from training.validation import ValidationResult

    monkeypatch.setenv("CLUSTER_STACK_NAME", CLUSTER)
    monkeypatch.setenv("CLUSTER_JOB_ID", "j-20261120-231502-ab12")
    err = io.StringIO()
    model = ThroughputModel(tokens_per_step=65536, world_size=8, flops_per_token=1e10, peak_tflops_per_gpu=989.0)
    metrics = MetricsLogger(MetricsConfig(nvml=False), rank=0, world_size=1, device=torch.device("cpu"),
                            model=model, stdout=io.StringIO(), stderr=err)
    metrics.log_step(step=10, total_steps=100, loss=torch.tensor(3.0), lr=1e-4, grad_norm=torch.tensor(1.0),
                     step_time_s=1.0)
    # a step that evaluated the held-out loss ([validation]) adds its metrics
    metrics.log_step(step=20, total_steps=100, loss=torch.tensor(2.9), lr=1e-4, grad_norm=torch.tensor(1.0),
                     step_time_s=1.0, validation=ValidationResult(step=20, loss=3.1, time_s=0.5))
    return [line for line in err.getvalue().splitlines() if line.startswith('{"_aws"')]


def protection_argvs() -> list[tuple[str, ...]]:
    """What node_bootstrap/protection.py runs to publish protected mode (its real code, commands recorded)."""
    from node_bootstrap.protection import _Group

    class Recorder:
        calls: list[tuple[str, ...]] = []

        def run(self, argv, **_):
            self.calls.append(tuple(argv))

    recorder = Recorder()
    _Group("us-east-1", GROUP, recorder).put_metric(1)
    return recorder.calls


def monitor_argvs(node_config) -> list[tuple[str, ...]]:
    """What the node health monitor runs every round to publish its metrics (node_bootstrap/monitor/actions.py,
    its real code, commands recorded)."""
    from node_bootstrap.monitor.actions import Responder

    class Recorder:
        calls: list[tuple[str, ...]] = []

        def run(self, argv, **_):
            self.calls.append(tuple(argv))

            class Ok:
                ok = True
            return Ok()

    recorder = Recorder()
    Responder(parse_node_config(node_config), host=None, runner=recorder, identity=None).publish_metrics(
        warnings=1, unhealthy=True)
    return recorder.calls


@pytest.fixture
def produced(stack, node_config, tmp_path, monkeypatch):
    return {
        "protection": cli_published(protection_argvs()),
        "monitor": cli_published(monitor_argvs(node_config)),
        "agent": agent_published(node_config["cloudwatchAgent"]),
        "efa": emf_published(efa_lines(tmp_path, node_config)),
        "trainer": emf_published(trainer_lines(monkeypatch)),
        "aws": aws_published(stack.template_json),
    }


def everything(produced) -> set:
    return set().union(*produced.values())


def test_every_dashboard_graph_has_a_producer(stack, produced):
    refs = dashboard_references(stack.template_json)
    assert len(refs) >= 25  # the references were found at all (28 today)
    assert unproduced(refs, everything(produced)) == []
    namespaces = {r.namespace for r in refs}
    assert namespaces == {"CWAgent", "TrainingCluster", "AWS/AutoScaling", "AWS/FSx"}


def test_every_alarm_metric_has_a_producer(stack, produced):
    refs = alarm_references(stack.template_json)
    names = {r.name for r in refs}
    assert {"nvidia_smi_utilization_gpu", "GroupInServiceInstances", "StragglerRatio", "EfaErrorEvents",
            "FreeDataStorageCapacity", "GroupDesiredCapacity", "Errors"} <= names
    assert unproduced(refs, everything(produced)) == []


def test_searches_and_alarms_are_pinned_to_this_cluster(stack):
    for ref in dashboard_references(stack.template_json) + alarm_references(stack.template_json):
        pins = {k: v.strip('"') for k, v in ref.filters}
        if "AutoScalingGroupName" in ref.dimensions:
            assert pins.get("AutoScalingGroupName") == GROUP, ref
        elif "Cluster" in ref.dimensions:
            assert pins.get("Cluster") == CLUSTER, ref
        elif "FunctionName" in ref.dimensions:  # the job keeper's, the stack's only function of its own
            (keeper,) = [k for k in stack.resources("AWS::Lambda::Function") if k.startswith("JobKeeper")]
            assert pins.get("FunctionName") == json.dumps({"Ref": keeper}), ref
        else:
            assert ref.dimensions == {"FileSystemId"} and "FileSystemId" in pins, ref


def test_the_check_fails_for_a_dropped_measurement_or_a_renamed_emf_metric(stack, node_config, produced):
    refs = dashboard_references(stack.template_json)
    agent = copy.deepcopy(node_config["cloudwatchAgent"])
    gpu = agent["metrics"]["metrics_collected"]["nvidia_gpu"]
    gpu["measurement"] = [m for m in gpu["measurement"] if m != "clocks_current_sm"]
    without_clock = {**produced, "agent": agent_published(agent)}
    missing = unproduced(refs, everything(without_clock))
    assert len(missing) == 1 and "nvidia_smi_clocks_current_sm" in missing[0] and "SM clock" in missing[0]

    renamed = {(ns, "TokensPerSec" if name == "TokensPerSecond" else name, dims)
               for ns, name, dims in produced["trainer"]}
    missing = unproduced(refs, everything({**produced, "trainer": renamed}))
    assert missing and all("TokensPerSecond" in m for m in missing)

    no_rollup = copy.deepcopy(node_config["cloudwatchAgent"])
    no_rollup["metrics"]["aggregation_dimensions"] = []
    assert unproduced(refs, everything({**produced, "agent": agent_published(no_rollup)}))


def test_the_agent_config_only_uses_measurements_the_agent_accepts(node_config):
    agent = copy.deepcopy(node_config["cloudwatchAgent"])
    agent["metrics"]["metrics_collected"]["nvidia_gpu"]["measurement"].append("clocks_throttle_reasons_active")
    with pytest.raises(AssertionError, match="not in the agent's allow-list"):
        agent_published(agent)


def test_gpu_metrics_are_published_per_gpu_node_and_cluster_whatever_the_driver(node_config):
    published = agent_published(node_config["cloudwatchAgent"])
    utilization = {dims for ns, name, dims in published if name == "nvidia_smi_utilization_gpu"}
    assert utilization == {frozenset({"AutoScalingGroupName", "InstanceId", "index"}),
                           frozenset({"AutoScalingGroupName", "InstanceId"}),
                           frozenset({"AutoScalingGroupName"})}
    memory = {dims for ns, name, dims in published if name == "mem_used_percent"}
    assert memory == {frozenset({"AutoScalingGroupName", "InstanceId"}), frozenset({"AutoScalingGroupName"})}
    disk = {dims for ns, name, dims in published if name == "disk_used_percent"}
    assert frozenset({"AutoScalingGroupName", "InstanceId", "fstype", "path"}) in disk


def test_user_data_carries_the_agent_config_at_the_configured_interval(synth):
    config = node_config_in_user_data(synth("odcr-created"))  # any variant: the interval is the default
    agent = config["cloudwatchAgent"]
    assert agent["agent"]["metrics_collection_interval"] == config["metrics"]["intervalSeconds"] == 60
    assert all(p["metrics_collection_interval"] == 60 for p in agent["metrics"]["metrics_collected"].values())
    assert agent["metrics"]["append_dimensions"] == {"AutoScalingGroupName": "${aws:AutoScalingGroupName}",
                                                     "InstanceId": "${aws:InstanceId}"}
    assert config["bootstrap"]["autoScalingGroupName"] == GROUP


def test_operators_may_read_what_clusterctl_top_reads(stack):
    (policy,) = [p for k, p in stack.resources("AWS::IAM::ManagedPolicy").items() if k.startswith("JobsOperatorPolicy")]
    statements = {s.get("Sid"): s for s in policy["Properties"]["PolicyDocument"]["Statement"]}
    metrics = statements["ReadClusterMetrics"]
    assert set(metrics["Action"]) == {"cloudwatch:GetMetricData", "cloudwatch:ListMetrics"}
    assert "autoscaling:DescribeAutoScalingGroups" in statements["DescribeClusterAndCapacity"]["Action"]


def test_one_dashboard_per_cluster_linked_from_the_outputs(stack):
    (dashboard,) = stack.resources("AWS::CloudWatch::Dashboard").values()
    assert dashboard["Properties"]["DashboardName"] == "TrainingClusterStack-us-east-1"
    outputs = stack.template_json["Outputs"]
    assert outputs["DashboardName"]["Value"] == "TrainingClusterStack-us-east-1"
    assert outputs["DashboardUrl"]["Value"] == ("https://us-east-1.console.aws.amazon.com/cloudwatch/home?"
                                                "region=us-east-1#dashboards/dashboard/TrainingClusterStack-us-east-1")
    titles = {r.where for r in dashboard_references(stack.template_json)}
    for wanted in ("GPU utilization per node", "GPU memory used per node", "GPU temperature per node",
                   "GPU power per node", "EFA throughput per node", "Tokens per second", "MFU", "Loss",
                   "Step time across ranks", "FSx for Lustre throughput", "FSx for Lustre free space",
                   "Cost so far", "Validation loss", "Goodput"):
        assert any(t.startswith(wanted) for t in titles), wanted


def test_the_validation_widget_graphs_the_held_out_loss_and_perplexity_of_this_cluster_s_jobs(stack, produced):
    refs = [r for r in dashboard_references(stack.template_json) if r.where.startswith("Validation loss")]
    assert {r.name for r in refs} == {"ValidationLoss", "ValidationPerplexity"}
    assert all(r.dimensions == {"Cluster", "JobId"} and dict(r.filters) == {"Cluster": CLUSTER} for r in refs)
    (widget,) = [w for body in dashboard_bodies(stack.template_json) for w in body["widgets"]
                 if w["properties"].get("title", "").startswith("Validation loss")]
    sides = {m[-1]["label"]: m[-1].get("yAxis", "left") for m in widget["properties"]["metrics"]}
    assert sides == {"${PROP('Dim.JobId')} held-out loss": "left", "${PROP('Dim.JobId')} perplexity (right)": "right"}
    # what the trainer writes at a step that evaluated it, and only there
    assert {(ns, name) for ns, name, _ in produced["trainer"]} >= {("TrainingCluster", "ValidationLoss"),
                                                                  ("TrainingCluster", "ValidationPerplexity")}
    assert unproduced(refs, everything(produced)) == []


def test_the_goodput_widget_graphs_the_metric_the_trainer_writes_per_job(stack, produced):
    refs = [r for r in dashboard_references(stack.template_json) if r.where.startswith("Goodput")]
    assert {r.name for r in refs} == {"Goodput"}
    assert all(r.dimensions == {"Cluster", "JobId"} and dict(r.filters) == {"Cluster": CLUSTER} for r in refs)
    assert ("TrainingCluster", "Goodput", frozenset({"Cluster", "JobId"})) in produced["trainer"]
    assert unproduced(refs, everything(produced)) == []


def test_the_interval_setting_reaches_agent_dashboard_and_outputs(synth):
    stack = synth("capacity-block-p5en")  # metricsIntervalSeconds=30, budgetUsd=250000
    config = node_config_in_user_data(stack)
    assert config["cloudwatchAgent"]["agent"]["metrics_collection_interval"] == 30
    assert stack.template_json["Outputs"]["MetricsIntervalSeconds"]["Value"] == "30"
    periods = {json.dumps(m) for body in dashboard_bodies(stack.template_json)
               for w in body["widgets"] for m in w.get("properties", {}).get("metrics", [])}
    assert all('"period": 60' in p for p in periods)  # graphs never finer than a minute
    alarms = {k: v["Properties"] for k, v in stack.resources("AWS::CloudWatch::Alarm").items()}
    (budget,) = [a for k, a in alarms.items() if k.startswith("ObservabilityBudgetAlarm")]
    assert budget["Threshold"] == 250000
    (expression,) = [m["Expression"] for m in budget["Metrics"] if "Expression" in m]
    assert expression == "node_minutes / 60 * 63.3"  # p5en.48xlarge's catalog price
