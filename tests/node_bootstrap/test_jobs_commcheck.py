"""A job's module: training.commcheck gets its options and no training arguments, and its status reports the
bus bandwidth it measured; a training job's status keeps its fields; an unknown module is refused."""

import json

import pytest

from node_bootstrap import jobs


def start_commcheck(node, job_id, *extra, check=True):
    return node.cli("start", "--job-id", job_id, "--module", "training.commcheck", "--nodes", "2",
                    "--gpus-per-node", "8", "--rendezvous-host", "10.0.1.17", "--max-restarts", "0", *extra,
                    check=check)


def test_commcheck_job_runs_the_check_module_with_options_and_status_reports_busbw(node_factory):
    node = node_factory("exit", exit_code=0)
    start_commcheck(node, "j-cc-1", "--overrides", "sizes_mib=64,1024 min_busbw_gbps=350 dtype=bfloat16",
                    check=False)  # may already see the end: the stand-in exits at once
    node.wait_state("j-cc-1", "succeeded")
    record = json.loads(node.record.read_text())
    assert record["argv"] == [
        "-m", "training.torchrun", "--exit-barrier-seconds", "30",
        "--nnodes", "2", "--nproc-per-node", "8", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "10.0.1.17:29400", "--rdzv-id", "j-cc-1", "--max-restarts", "0",
        "--shutdown-timeout", "110", "-m", "training.commcheck",
        "--sizes-mib", "64,1024", "--min-busbw-gbps", "350", "--dtype", "bfloat16",
    ]  # no --config, --resume or checkpoint.dir
    spec = json.loads((node.root / "var/lib/cluster/jobs/j-cc-1/job.json").read_text())
    assert spec["module"] == "training.commcheck"
    status = json.loads(node.cli("status", "--job-id", "j-cc-1").stdout)
    assert status["module"] == "training.commcheck"
    assert (status["busbwGbps"], status["busbwSizeBytes"]) == (452.25, 1073741824)
    assert status["lastStep"] is None and status["state"] == "succeeded"


def test_training_status_keeps_its_fields_and_names_its_module(node_factory):
    node = node_factory("exit", exit_code=0)
    node.start("j-tr-1", check=False)
    node.wait_state("j-tr-1", "succeeded")
    status = json.loads(node.cli("status", "--job-id", "j-tr-1").stdout)
    assert (status["module"], status["lastStep"]) == ("training", 20)
    assert "busbwGbps" not in status


def test_busbw_is_the_summarys_once_printed_and_the_newest_sizes_before():
    first = '[rank0]: {"event": "allreduce", "size_bytes": 67108864, "busbw_gbps": 301.5}\n'
    summary = ('{"event": "allreduce_summary", "largest_size_bytes": 1073741824, "busbw_gbps": 452.25, '
               '"passed": null}\n')
    assert jobs.find_busbw("NCCL INFO Using network Libfabric\n") is None
    assert jobs.find_busbw(first) == {"busbwGbps": 301.5, "busbwSizeBytes": 67108864}
    assert jobs.find_busbw(first + summary + "[node_bootstrap.jobs] exit code 0\n") == {
        "busbwGbps": 452.25, "busbwSizeBytes": 1073741824}


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--config", "training/configs/tiny.toml"], "config='training/configs/tiny.toml': allowed: empty"),
        (["--overrides", "optim.lr=3e-4"], "overrides item 'optim.lr=3e-4': allowed for training.commcheck"),
        (["--overrides", "iters=$(id)"], "overrides item 'iters=$(id)'"),
    ],
)
def test_commcheck_start_rejects_training_arguments(node_factory, args, message):
    node = node_factory("exit")
    result = start_commcheck(node, "j-cc-bad-1", *args, check=False)
    assert result.returncode == jobs.EXIT_USAGE
    assert message in result.stderr
    assert not (node.root / "var/lib/cluster/jobs").exists()


def test_start_rejects_an_unknown_module_and_a_training_job_without_config(node_factory):
    node = node_factory("exit")
    unknown = node.cli("start", "--job-id", "j-m-1", "--module", "os", "--nodes", "1", "--gpus-per-node", "8",
                       "--rendezvous-host", "10.0.0.1", check=False)
    assert unknown.returncode == jobs.EXIT_USAGE and "--module: invalid choice: 'os'" in unknown.stderr
    no_config = node.cli("start", "--job-id", "j-m-2", "--nodes", "1", "--gpus-per-node", "8",
                         "--rendezvous-host", "10.0.0.1", check=False)
    assert no_config.returncode == jobs.EXIT_USAGE and "config='': allowed: a .toml path" in no_config.stderr
    assert not (node.root / "var/lib/cluster/jobs").exists()
