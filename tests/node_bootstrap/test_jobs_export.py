"""An export job (training.export, clusterctl export): one process on one node, no torchrun, whose paths the
launcher makes from the two job ids: the source job's checkpoint directory (read) and its own (written). A
source without a checkpoint directory, and anything but step=N, is refused before anything is written."""

import json
import os

import pytest

from node_bootstrap import jobs

SOURCE = "j-20261120-231502-ab12"
EXPORT = "j-20261120-231502-ab12-hf-9f3c"


def start_export(node, *extra, job_id=EXPORT, check=True):
    return node.cli("start", "--job-id", job_id, "--module", "training.export", "--nodes", "1",
                    "--gpus-per-node", "8", "--rendezvous-host", "10.0.1.17", "--max-restarts", "0", *extra,
                    check=check)


def test_an_export_runs_one_process_that_reads_the_source_and_writes_its_own_directory(node_factory):
    node = node_factory("exit", exit_code=0)
    checkpoints = node.root / "fsx/checkpoints"
    (checkpoints / SOURCE / "step-40").mkdir(parents=True)
    start_export(node, "--resume-from", SOURCE, "--overrides", "step=40", check=False)  # may see the end at once
    node.wait_state(EXPORT, "succeeded")
    record = json.loads(node.record.read_text())
    # no torchrun, no config, no user-given path: both paths come from the job ids
    assert record["argv"] == ["-m", "training.export", "--checkpoint", f"{checkpoints}/{SOURCE}",
                              "--out", f"{checkpoints}/{EXPORT}/hf", "--step", "40"]
    assert record["cwd"] == str(node.root / "opt/cluster/bundle")
    spec = json.loads((node.root / "var/lib/cluster/jobs" / EXPORT / "job.json").read_text())
    assert spec["module"] == "training.export"
    own = checkpoints / EXPORT
    assert own.is_dir() and (own.stat().st_uid, own.stat().st_gid) == (os.getuid(), os.getgid())
    assert not (node.root / "scratch/checkpoints" / EXPORT).exists()  # no local checkpoint tier
    status = json.loads(node.cli("status", "--job-id", EXPORT).stdout)
    assert (status["module"], status["state"], status["exitCode"]) == ("training.export", "succeeded", 0)


def test_without_a_step_the_export_takes_the_newest_complete_one(node_factory):
    node = node_factory("exit", exit_code=0)
    (node.root / "fsx/checkpoints" / SOURCE).mkdir(parents=True)
    start_export(node, "--resume-from", SOURCE, check=False)
    node.wait_state(EXPORT, "succeeded")
    assert json.loads(node.record.read_text())["argv"][-2:] == ["--out", f"{node.root}/fsx/checkpoints/{EXPORT}/hf"]


def test_an_export_of_a_job_without_a_checkpoint_directory_is_refused_and_leaves_nothing(node_factory):
    node = node_factory("exit")
    (node.root / "fsx/checkpoints").mkdir(parents=True)
    result = start_export(node, "--resume-from", "j-20261119-101500-0a0b", check=False)
    assert result.returncode == jobs.EXIT_FAILED
    assert json.loads(result.stdout)["error"] == (
        f"export of job j-20261119-101500-0a0b: no checkpoint directory {node.root}/fsx/checkpoints/"
        "j-20261119-101500-0a0b on this node (the job saved no checkpoint)")
    assert not (node.root / "fsx/checkpoints" / EXPORT).exists()
    assert not (node.root / "var/lib/cluster/jobs" / EXPORT).exists()


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--resume-from", SOURCE, "--config", "training/configs/tiny.toml"],
         "config='training/configs/tiny.toml': allowed: empty: training.export takes no training config"),
        (["--resume-from", SOURCE, "--nodes", "2"], "nodes=2: allowed: 1 for training.export"),
        (["--resume-from", SOURCE, "--overrides", "optim.lr=3e-4"],
         "overrides item 'optim.lr=3e-4': allowed for training.export: step=N"),
        (["--resume-from", SOURCE, "--overrides", "step=-1"], "overrides item 'step=-1'"),
        (["--resume-from", SOURCE, "--overrides", "step=4 step=8"], "one step=N at most"),
        ([], "resume-from='': training.export needs the id of the job whose checkpoint it exports"),
        (["--resume-from", EXPORT], f"resume-from={EXPORT!r}: allowed: the id of another job"),
    ],
)
def test_an_export_start_refuses_anything_but_a_source_and_a_step(node_factory, args, message):
    node = node_factory("exit")
    result = start_export(node, *args, check=False)
    assert result.returncode == jobs.EXIT_USAGE
    assert message in result.stderr
    assert not (node.root / "var/lib/cluster/jobs").exists()
