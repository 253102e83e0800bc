"""nodes and submit against moto: Auto Scaling, EC2 tags, CloudFormation outputs, SSM SendCommand."""

import os
import re
import subprocess
import sys
from pathlib import Path

import boto3
import pytest

from cluster_aws.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from node_bootstrap import jobs as node_jobs

REGION = "us-east-1"


def test_nodes_lists_readiness_in_private_ip_order(cli, sent, cluster):
    cluster.tag(1, **{"cluster:bootstrap": "failed", "cluster:bootstrap-reason": "expected 8 GPUs, found 7"})
    boto3.client("autoscaling", region_name=REGION).set_instance_health(
        InstanceId=cluster.instance_ids[2], HealthStatus="Unhealthy"
    )
    result = cli("nodes", "--stack", "TrainingClusterStack")
    assert result.code == EXIT_OK, result.err
    header, *rows, summary = result.lines
    assert header.split() == ["INSTANCE", "PRIVATE", "IP", "AZ", "LIFECYCLE", "HEALTH", "BOOTSTRAP", "READY"]
    assert [r.split()[0] for r in rows] == cluster.instance_ids
    assert rows[0].split()[1:] == [
        cluster.private_ips[0],
        "us-east-1a",
        "InService",
        "Healthy",
        "ready",
        "yes",
    ]
    assert rows[1].endswith("no: bootstrap failed: expected 8 GPUs, found 7")
    assert rows[2].endswith("no: health Unhealthy")
    assert summary == "1 of 3 nodes ready (TrainingClusterStack: 3 x p5.48xlarge, capacity on-demand)"


def test_a_node_its_health_monitor_tagged_unhealthy_is_not_ready(cli, sent, cluster):
    """Before its Auto Scaling group has replaced it, a node that found itself unhealthy takes no job."""
    reason = "health monitor: xid: new: Xid 79 on 0000:b9:00: GPU has fallen off the bus"
    cluster.tag(0, **{"cluster:health": "unhealthy", "cluster:health-reason": reason})
    result = cli("nodes", "--stack", "TrainingClusterStack")
    assert result.code == EXIT_OK, result.err
    assert result.lines[1].endswith(f"no: node health monitor: unhealthy: {reason}")
    assert result.lines[-1].startswith("2 of 3 nodes ready")
    as_json = cli("nodes", "--stack", "TrainingClusterStack", "--json")
    assert '"health_monitor": "unhealthy"' in as_json.out


def test_submit_sends_one_command_to_every_ready_node(cli, sent, cluster, fakes):
    result = cli(
        "submit",
        "--config",
        "training/configs/tiny-cpu.toml",
        "--set",
        "optim.lr=3e-4",
        "--set",
        "run.steps=100",
        "--max-restarts",
        "2",
    )
    assert result.code == EXIT_OK, result.err
    job_id = result.lines[0]
    assert re.fullmatch(r"j-\d{8}-\d{6}-[0-9a-f]{4}", job_id)
    assert result.lines[1] == (
        f"started on 3 x p5.48xlarge (8 GPUs each), rendezvous {cluster.private_ips[0]}; "
        f"follow it with: clusterctl logs {job_id} --follow"
    )
    (command,) = sent
    assert command["DocumentName"] == fakes.DOCUMENT and command["DocumentVersion"] == "$DEFAULT"
    assert command["InstanceIds"] == cluster.instance_ids
    assert command["Parameters"] == {
        "action": ["start"],
        "jobId": [job_id],
        "config": ["training/configs/tiny-cpu.toml"],
        "nodes": ["3"],
        "gpusPerNode": ["8"],
        "rendezvousHost": [cluster.private_ips[0]],
        "maxRestarts": ["2"],
        "overrides": ["optim.lr=3e-4 run.steps=100"],
    }
    assert command["Comment"] == f"clusterctl start {job_id}"


def test_submit_uses_the_first_ready_nodes_when_fewer_are_asked(cli, sent, cluster):
    cluster.tag(0, **{"cluster:bootstrap": "running"})
    result = cli("submit", "--config", "training/configs/tiny-cpu.toml", "--nodes", "2")
    assert result.code == EXIT_OK, result.err
    (command,) = sent
    assert command["InstanceIds"] == cluster.instance_ids[1:]
    assert command["Parameters"]["rendezvousHost"] == [cluster.private_ips[1]]
    assert command["Parameters"]["nodes"] == ["2"]


def test_submit_refuses_when_nodes_are_not_ready(cli, sent, cluster):
    cluster.tag(2, **{"cluster:bootstrap": "running"})
    result = cli("submit", "--config", "training/configs/tiny-cpu.toml")
    assert result.code == EXIT_FAILED
    assert result.err.strip() == (
        "clusterctl: error: not submitted: 3 nodes asked, 2 of 3 ready "
        f"(not ready: {cluster.instance_ids[2]}: bootstrap running); see clusterctl nodes"
    )
    assert sent == []


def test_submit_refuses_more_nodes_than_the_cluster_has(cli, sent, cluster):
    result = cli("submit", "--config", "training/configs/tiny-cpu.toml", "--nodes", "4")
    assert result.code == EXIT_FAILED and "4 nodes asked, 3 of 3 ready" in result.err
    assert sent == []


def test_submit_refuses_an_empty_group(cli, sent, moto_aws, fakes):
    fakes.deploy_fake_cluster(nodes=0, capacity_mode="capacity-block")
    result = cli("submit", "--config", "training/configs/tiny-cpu.toml", "--nodes", "1")
    assert result.code == EXIT_FAILED
    assert "the cluster has no nodes" in result.err and "nodes launch when the block starts" in result.err


def test_submit_refuses_untagged_nodes(cli, sent, moto_aws, fakes):
    cluster = fakes.deploy_fake_cluster(nodes=1, bootstrap=None)
    result = cli("submit", "--config", "training/configs/tiny-cpu.toml")
    assert result.code == EXIT_FAILED and f"{cluster.instance_ids[0]}: bootstrap not started" in result.err


def test_submit_rejects_bad_input_before_any_aws_call(cli, sent, cluster):
    bad_set = cli("submit", "--config", "training/configs/tiny-cpu.toml", "--set", "optim.lr=$(id)")
    assert bad_set.code == EXIT_USAGE and "--set 'optim.lr=$(id)': allowed: key=value" in bad_set.err
    bad_config = cli("submit", "--config", "training/configs/nope.toml")
    assert bad_config.code == EXIT_USAGE
    assert (
        "--config='training/configs/nope.toml': not in the bundle; allowed: training/configs/"
        in bad_config.err
    )
    assert cli("submit", "--config", "x.yaml").code == EXIT_USAGE
    assert sent == []


@pytest.mark.parametrize(
    ("config", "item", "message"),
    [
        ("training/configs/tiny-cpu.toml", "train.steps=100",
         "--set 'train.steps=100': unknown section 'train'; allowed: run, model, parallel, fp8, data, optim, "
         "checkpoint, metrics"),
        ("training/configs/tiny-cpu.toml", "run.stepz=100", "run.stepz: unknown key; allowed: seed, steps,"),
        ("training/configs/tiny-cpu.toml", "run.steps=lots", "run.steps='lots': allowed: an integer"),
        ("training/configs/tiny-cpu.toml", "run.steps=0", "run.steps=0: allowed: an integer >= 1"),
        ("training/configs/tiny-cpu.toml", "fp8.backend=fp4", "fp8.backend='fp4': allowed: none, torchao, te"),
        # jobs have no AWS credentials: their metrics go through EMF and the agent
        ("training/configs/tiny-cpu.toml", "metrics.cloudwatch=true",
         "metrics.cloudwatch=true: allowed: false. Jobs have no AWS credentials (docs/security.md)"),
        # a rule between two fields, checked on the file and the --set items together
        ("training/configs/tiny-cpu.toml", "optim.min_lr=1.0", "optim.min_lr=1.0: allowed: 0 <= min_lr <="),
        # a config on the nodes cannot be read here: the --set items are still checked on their own
        ("/fsx/configs/run.toml", "optim.lr=fast", "optim.lr='fast': allowed: a number"),
    ],
)
def test_submit_checks_set_items_against_the_training_config_before_sending(cli, sent, cluster, config,
                                                                               item, message):
    result = cli("submit", "--config", config, "--set", item)
    assert result.code == EXIT_USAGE
    assert result.err.startswith(f"clusterctl: error: not submitted: {config} with the --set items: ")
    assert message in result.err and result.err.count("\n") == 1
    assert sent == []  # nothing reached a node


def test_submit_refuses_another_checkpoint_dir_and_resumes_another_job_only_on_request(cli, sent, cluster,
                                                                                         fakes):
    refused = cli("submit", "--config", "training/configs/tiny-cpu.toml", "--set",
                  "checkpoint.dir=/fsx/checkpoints/j-20261119-101500-0a0b")
    assert refused.code == EXIT_USAGE and sent == []
    assert refused.err.startswith(
        "clusterctl: error: --set 'checkpoint.dir=/fsx/checkpoints/j-20261119-101500-0a0b': not allowed: a "
        "job's checkpoints go to <checkpoint root>/<job id>; to start from another job's checkpoints, resume "
        "from that job (clusterctl submit --resume-from JOB)")
    local = cli("submit", "--config", "training/configs/tiny-cpu.toml", "--set", "checkpoint.local_dir=/tmp/x")
    assert local.code == EXIT_USAGE and sent == []
    assert local.err.startswith(
        "clusterctl: error: --set 'checkpoint.local_dir=/tmp/x': not allowed: a job's local checkpoints go to the "
        "node's scratch, <scratch>/checkpoints/<job id>; set checkpoint.local_interval_steps to use them (0: off)")
    bad = cli("submit", "--config", "training/configs/tiny-cpu.toml", "--resume-from", "../j-1")
    assert bad.code == EXIT_USAGE and "--resume-from='../j-1': allowed: the id of an earlier job" in bad.err
    assert sent == []

    result = cli("submit", "--config", "training/configs/tiny-cpu.toml", "--resume-from",
                 "j-20261119-101500-0a0b")
    assert result.code == EXIT_OK, result.err
    (command,) = sent
    assert command["Parameters"]["resumeFrom"] == ["j-20261119-101500-0a0b"]
    fakes.end_job(result.lines[0])  # one job at a time
    plain = cli("submit", "--config", "training/configs/tiny-cpu.toml")
    assert plain.code == EXIT_OK and "resumeFrom" not in sent[-1]["Parameters"]  # only sent when asked


def test_clusterctl_validates_training_configs_without_torch():
    # clusterctl's requirements and the keeper's Lambda have no torch: the trainer's config loader must not need it.
    code = (
        "import sys; import clusterctl.cli, cluster_jobs.document, job_keeper.handler, training.config; "
        "training.config.load_config('training/configs/llama3-8b.toml', ['optim.lr=1e-4']); "
        "assert 'torch' not in sys.modules and 'numpy' not in sys.modules, sorted(sys.modules)"
    )
    repo = Path(__file__).resolve().parents[2]
    done = subprocess.run([sys.executable, "-c", code], cwd=repo, capture_output=True, text=True, timeout=60,
                          env={**os.environ, "PYTHONPATH": str(repo)})
    assert done.returncode == 0, done.stderr


def test_nodes_of_a_group_that_is_gone(cli, sent, cluster, fakes):
    boto3.client("autoscaling", region_name=REGION).delete_auto_scaling_group(
        AutoScalingGroupName=fakes.GROUP, ForceDelete=True
    )
    result = cli("nodes")
    assert result.code == 4 and f"Auto Scaling group {fakes.GROUP}" in result.err


def test_commcheck_submits_the_check_like_a_job_with_its_options(cli, sent, cluster, fakes):
    result = cli("commcheck", "--min-busbw-gbps", "400", "--sizes-mib", "64,1024", "--dtype", "float32")
    assert result.code == EXIT_OK, result.err
    job_id = result.lines[0]
    assert re.fullmatch(r"j-\d{8}-\d{6}-[0-9a-f]{4}", job_id)
    assert result.lines[1] == (
        f"all_reduce check started on 3 x p5.48xlarge (8 GPUs each), rendezvous {cluster.private_ips[0]}; "
        f"follow it with: clusterctl status {job_id} (busbw) and clusterctl logs {job_id} --follow (the "
        "table, NCCL's network)"
    )
    (command,) = sent
    assert command["DocumentName"] == fakes.DOCUMENT
    assert command["InstanceIds"] == cluster.instance_ids
    assert command["Parameters"] == {
        "action": ["start"],
        "jobId": [job_id],
        "module": ["training.commcheck"],
        "config": [""],
        "nodes": ["3"],
        "gpusPerNode": ["8"],
        "rendezvousHost": [cluster.private_ips[0]],
        "maxRestarts": ["0"],  # a failed check is an answer, not something to retry
        "overrides": ["sizes_mib=64,1024 dtype=float32 min_busbw_gbps=400.0"],
    }
    # What the node makes of it: the options training.commcheck takes.
    assert node_jobs.build_option_args(tuple(command["Parameters"]["overrides"][0].split())) == [
        "--sizes-mib", "64,1024", "--dtype", "float32", "--min-busbw-gbps", "400.0"
    ]


def test_commcheck_without_options_leaves_the_defaults_to_the_check(cli, sent, cluster):
    cluster.tag(0, **{"cluster:bootstrap": "running"})
    result = cli("commcheck", "--nodes", "2", "--json")
    assert result.code == EXIT_OK, result.err
    (command,) = sent
    assert command["InstanceIds"] == cluster.instance_ids[1:]
    assert command["Parameters"]["rendezvousHost"] == [cluster.private_ips[1]]
    assert command["Parameters"]["overrides"] == [""]
    assert command["Parameters"]["module"] == ["training.commcheck"]


def test_commcheck_refuses_like_submit_when_nodes_are_not_ready(cli, sent, cluster):
    cluster.tag(1, **{"cluster:bootstrap": "failed", "cluster:bootstrap-reason": "EFA devices: 31 of 32"})
    result = cli("commcheck")
    assert result.code == EXIT_FAILED
    assert result.err.strip() == (
        "clusterctl: error: not submitted: 3 nodes asked, 2 of 3 ready "
        f"(not ready: {cluster.instance_ids[1]}: bootstrap failed: EFA devices: 31 of 32); see clusterctl nodes"
    )
    assert sent == []


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sizes-mib", "64,0"], "argument --sizes-mib: '64,0': allowed: comma-separated MiB of 1-65536"),
        (["--sizes-mib", "1g"], "argument --sizes-mib: '1g'"),
        (["--min-busbw-gbps", "-5"], "argument --min-busbw-gbps: '-5': allowed: a number > 0"),
        (["--min-busbw-gbps", "inf"], "argument --min-busbw-gbps: 'inf'"),
        (["--warmup-iters", "-1"], "argument --warmup-iters: -1: must be 0 or more"),
        (["--dtype", "fp8"], "argument --dtype: invalid choice: 'fp8'"),
    ],
)
def test_commcheck_rejects_bad_options_before_any_aws_call(cli, sent, cluster, capsys, argv, message):
    with pytest.raises(SystemExit) as exited:
        cli("commcheck", *argv)
    assert exited.value.code == EXIT_USAGE
    assert message in capsys.readouterr().err
    assert sent == []


def test_commcheck_max_restarts_is_checked_like_submit(cli, sent, cluster):
    result = cli("commcheck", "--max-restarts", "100")
    assert result.code == EXIT_USAGE and "--max-restarts=100: allowed: 0-99" in result.err
    assert sent == []
