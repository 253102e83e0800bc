"""The job user: a job runs as the unprivileged user the jobuser boot step made, owns its checkpoint directory
and log, writes its checkpoints to its own directory (resuming another job's only on request), and a node
without the job user runs no job."""

import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
from node_fake_firewall import install_system_python
from node_jobs_support import GOLDEN_NODE_CONFIG, REPO, wait_until, write_user_database

from node_bootstrap import jobs


def test_start_records_the_job_user_and_gives_it_the_checkpoint_dir_and_log(node_factory):
    node = node_factory("exit", exit_code=0)
    node.start("j-user-1")
    spec = json.loads((node.root / "var/lib/cluster/jobs/j-user-1/job.json").read_text())
    # its HOME is its own scratch directory, not the account's home
    assert spec["user"] == {"name": "cluster-job", "uid": os.getuid(), "gid": os.getgid(), "groups": [44],
                            "home": f"{node.root}/scratch/jobs/j-user-1"}
    checkpoints = node.root / "fsx/checkpoints/j-user-1"
    log = node.root / "var/log/cluster/jobs/j-user-1.log"
    for path in (checkpoints, log):
        assert (path.stat().st_uid, path.stat().st_gid) == (os.getuid(), os.getgid())
    assert checkpoints.is_dir()
    assert spec["argv"][-2:] == ["--set", f"checkpoint.dir={checkpoints}"]  # last: it wins


def test_a_node_without_the_job_user_runs_no_job(node_factory):
    node = node_factory("exit")
    (node.root / "etc/passwd").write_text("root:x:0:0:root:/root:/bin/bash\n")
    result = node.start("j-nouser-1", check=False)
    assert result.returncode == jobs.EXIT_FAILED
    assert json.loads(result.stdout)["error"] == (
        "no user cluster-job on this node, and jobs never run as root: create it with `sudo "
        "PYTHONPATH=/opt/cluster/bundle python3 -m node_bootstrap run --only jobuser`")
    assert not (node.root / "var/lib/cluster/jobs/j-nouser-1").exists()


def test_checkpoint_dir_is_the_jobs_own_unless_it_resumes_another_job_on_request(node_factory):
    node = node_factory("exit", exit_code=0)
    refused = node.cli("start", "--job-id", "j-ck-1", "--config", "training/configs/tiny-cpu.toml", "--nodes", "1",
                       "--gpus-per-node", "8", "--rendezvous-host", "10.0.1.17",
                       "--overrides", "run.steps=10 checkpoint.dir=/fsx/checkpoints/j-old", check=False)
    assert refused.returncode == jobs.EXIT_USAGE
    assert json.loads(refused.stdout)["error"].startswith(
        "overrides item 'checkpoint.dir=/fsx/checkpoints/j-old': not allowed: a job's checkpoints go to "
        "<checkpoint root>/<job id>; to start from another job's checkpoints, resume from that job")
    missing = node.start("j-ck-2", "--resume-from", "j-old", check=False)
    assert missing.returncode == jobs.EXIT_FAILED and "no checkpoint directory" in json.loads(missing.stdout)["error"]
    itself = node.start("j-ck-3", "--resume-from", "j-ck-3", check=False)
    assert itself.returncode == jobs.EXIT_USAGE

    (node.root / "fsx/checkpoints/j-old").mkdir(parents=True)
    node.start("j-ck-4", "--resume-from", "j-old")
    argv = json.loads((node.root / "var/lib/cluster/jobs/j-ck-4/job.json").read_text())["argv"]
    assert argv[argv.index("--resume") + 1] == "auto"
    assert argv[argv.index("--resume-from-dir") + 1] == str(node.root / "fsx/checkpoints/j-old")
    assert argv[-1] == f"checkpoint.dir={node.root}/fsx/checkpoints/j-ck-4"  # saves go to its own



def test_the_job_gets_its_local_checkpoint_dir_on_scratch_and_other_jobs_ones_go(node_factory):
    node = node_factory("exit", exit_code=0)
    scratch = node.root / "scratch/checkpoints"
    (scratch / "j-before/step-8/rank-0").mkdir(parents=True)  # a finished job's local tier on this node
    node.start("j-local-1")
    argv = json.loads((node.root / "var/lib/cluster/jobs/j-local-1/job.json").read_text())["argv"]
    assert argv[-4:] == ["--set", f"checkpoint.local_dir={scratch}/j-local-1",
                         "--set", f"checkpoint.dir={node.root}/fsx/checkpoints/j-local-1"]
    own = scratch / "j-local-1"
    assert own.is_dir() and (own.stat().st_uid, own.stat().st_gid) == (os.getuid(), os.getgid())
    assert sorted(p.name for p in scratch.iterdir()) == ["j-local-1"]

    (scratch / "j-local-3").write_text("")  # something else where the job's directory goes
    blocked = node.start("j-local-3", check=False)
    assert blocked.returncode == jobs.EXIT_FAILED
    assert json.loads(blocked.stdout)["error"] == (
        f"the job's local checkpoint directory {scratch}/j-local-3 exists and is not a directory")
    assert (scratch / "j-local-3").is_file()  # left as it was

    refused = node.cli("start", "--job-id", "j-local-2", "--config", "training/configs/tiny-cpu.toml", "--nodes",
                       "1", "--gpus-per-node", "8", "--rendezvous-host", "10.0.1.17",
                       "--overrides", "checkpoint.local_dir=/tmp/x", check=False)
    assert refused.returncode == jobs.EXIT_USAGE
    assert json.loads(refused.stdout)["error"] == (
        "overrides item 'checkpoint.local_dir=/tmp/x': not allowed: a job's local checkpoints go to the node's "
        "scratch, <scratch>/checkpoints/<job id>; set checkpoint.local_interval_steps to use them (0: off)")


# Records who the job runs as and what it may write, under the system Python (nobody can read the venv's).
WHOAMI_PYTHON = """\
#!/usr/bin/python3
import json, os, sys

def can_write(directory):
    try:
        with open(os.path.join(directory, "probe"), "w"):
            pass
        return True
    except OSError:
        return False

checkpoints = next(a.split("=", 1)[1] for a in sys.argv if a.startswith("checkpoint.dir="))
record = {"uid": os.getuid(), "gid": os.getgid(), "groups": sorted(os.getgroups()), "home": os.environ["HOME"],
          "tmp": os.environ["TMPDIR"],
          "user": os.environ["USER"], "checkpoints": can_write(checkpoints),
          "job_dir": can_write(os.environ["FAKE_JOB_DIR"]), "etc": can_write(os.environ["FAKE_ETC"])}
with open(os.environ["FAKE_RECORD"], "w") as f:
    json.dump(record, f)
"""


@pytest.mark.skipif(os.geteuid() != 0, reason="switching to another user needs root")
def test_the_job_runs_as_the_unprivileged_job_user(tmp_path):
    import tempfile

    base = Path(tempfile.mkdtemp(prefix="jobuser-"))  # traversable by nobody, unlike pytest's tmp_path
    try:
        base.chmod(0o755)
        root = base / "root"
        (root / "etc/cluster").mkdir(parents=True)
        (root / "etc/cluster/node-config.json").write_text(GOLDEN_NODE_CONFIG.read_text())
        records = base / "records"
        records.mkdir(mode=0o777)
        records.chmod(0o777)
        job_dir = root / "var/lib/cluster/jobs/j-drop-1"
        (root / "etc/cluster/training.env").write_text(
            f"FAKE_RECORD={records}/who.json\nFAKE_JOB_DIR={job_dir}\nFAKE_ETC={root / 'etc'}\n")
        (root / "opt/cluster/bundle").mkdir(parents=True)
        python = root / "opt/pytorch/bin/python"
        python.parent.mkdir(parents=True)
        python.write_text(WHOAMI_PYTHON)
        python.chmod(0o755)
        write_user_database(root, uid=65534, gid=65534)  # cluster-job is nobody, and in the video group (44)
        install_system_python(root)  # the probe at start: the firewall holds the metadata block

        result = subprocess.run(
            [sys.executable, "-m", "node_bootstrap.jobs", "--root", str(root), "start", "--job-id", "j-drop-1",
             "--config", "training/configs/tiny-cpu.toml", "--nodes", "1", "--gpus-per-node", "1",
             "--rendezvous-host", "127.0.0.1", "--launcher", "direct"],
            cwd=REPO, capture_output=True, text=True, timeout=60)
        assert result.returncode == 0, result.stdout + result.stderr
        wait_until(lambda: json.loads((job_dir / "status.json").read_text())["state"] != "running",
                   what="the job to end")
        status = json.loads((job_dir / "status.json").read_text())
        assert status["state"] == "succeeded", (root / "var/log/cluster/jobs/j-drop-1.log").read_text()
        who = json.loads((records / "who.json").read_text())
        assert (who["uid"], who["gid"], who["groups"]) == (65534, 65534, [44])
        assert (who["home"], who["tmp"], who["user"]) == ((str(root / "scratch/jobs/j-drop-1"),) * 2 + ("cluster-job",))
        # its own checkpoint directory, yes; the state root reads and acts on, or the system, no
        assert (who["checkpoints"], who["job_dir"], who["etc"]) == (True, False, False)
        assert (root / "fsx/checkpoints/j-drop-1").stat().st_uid == 65534
        assert (job_dir / "status.json").stat().st_uid == 0
    finally:
        shutil.rmtree(base)
