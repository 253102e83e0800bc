"""A node starts only the attempt the job table holds as its job's current one (issue 42, item 2), checked
before any path is touched. Run as the review ran it: the stack's jobs document (its own script) on a fake node
root, with the AWS CLI replaced by a stub on PATH that answers GetItem from a table file and records its call."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest
from node_jobs_support import REPO

from cluster_constructs.jobs import PARAMETERS, build_job_script
from node_bootstrap import jobs
from node_bootstrap.jobs.job_table import current_attempt

TABLE = "TrainingClusterStack-JobTable-1A2B3C"
OLD = "j-old-job-1"  # a finished job whose checkpoint directory is sealed
NEW = "j-new-job-1"

STUB_AWS = """\
#!{python}
import json, os, sys
args = sys.argv[1:]
with open(os.environ["FAKE_AWS_CALLS"], "a") as f:
    f.write(json.dumps(args) + "\\n")
if os.environ.get("FAKE_AWS_FAIL"):
    sys.stderr.write("\\nUnable to locate credentials. You can configure credentials by running "
                     "\\"aws configure\\".\\n")
    sys.exit(255)
assert args[:2] == ["dynamodb", "get-item"], args
key = json.loads(args[args.index("--key") + 1])["pk"]["S"]
with open(os.environ["FAKE_JOB_TABLE"]) as f:
    items = json.load(f)
print(json.dumps({{"Item": items[key]}} if key in items else {{}}))
"""

# `python3` as the document's script calls it, on the fake root: the same command with --root added.
ROOTED_PYTHON = """\
#!{python}
import os, sys
args = sys.argv[1:]
assert args[:2] == ["-m", "node_bootstrap.jobs"], args
os.execv({python!r}, [{python!r}, "-m", "node_bootstrap.jobs", "--root", {root!r}] + args[2:])
"""


def item(state: str, attempts: int) -> dict:
    """A job item as DynamoDB's JSON gives it (cluster_jobs/table.py: `state`, `attempts` a list of maps)."""
    return {"state": {"S": state}, "attempts": {"L": [{"M": {"number": {"N": str(n + 1)}}} for n in range(attempts)]}}


@pytest.fixture
def node(node_factory):
    node = node_factory("until-sigterm")
    config_path = node.root / "etc/cluster/node-config.json"
    config = json.loads(config_path.read_text())
    config["training"]["jobTableName"] = TABLE
    config_path.write_text(json.dumps(config))
    bin_dir = node.root / "stub-bin"
    bin_dir.mkdir()
    (bin_dir / "aws").write_text(STUB_AWS.format(python=sys.executable))
    (bin_dir / "python3").write_text(ROOTED_PYTHON.format(python=sys.executable, root=str(node.root)))
    for tool in ("aws", "python3"):
        (bin_dir / tool).chmod(0o755)
    sealed = node.root / "fsx/checkpoints" / OLD
    (sealed / "step-100").mkdir(parents=True)
    (sealed / "step-100/metadata").write_text("a finished job's checkpoint\n")
    os.chmod(sealed, 0o755)
    node.table = node.root / "job-table.json"
    node.calls = node.root / "aws-calls.jsonl"
    node.bin_dir = bin_dir
    return node


def send_document(node, table: dict, job_id: str, attempt: str, **env) -> subprocess.CompletedProcess:
    """The jobs document's `start`, as SSM runs it on the node (parameters as SSM_<name>)."""
    node.table.write_text(json.dumps(table))
    values = {name: spec.get("default", "") for name, spec in PARAMETERS.items()}
    values.update(action="start", jobId=job_id, config="training/configs/tiny-cpu.toml", nodes="2", gpusPerNode="8",
                  rendezvousHost="10.0.1.17", maxRestarts="0", attempt=attempt)
    environment = {"PATH": f"{node.bin_dir}:/usr/bin:/bin", "HOME": str(node.root), "FAKE_JOB_TABLE": str(node.table),
                   "FAKE_AWS_CALLS": str(node.calls), **{f"SSM_{k}": v for k, v in values.items()}, **env}
    script = "\n".join(build_job_script(str(REPO))) + "\n"
    return subprocess.run(["bash", "-c", script], env=environment, cwd=node.root, capture_output=True, text=True,
                          timeout=60)


def untouched(node, job_id: str) -> bool:
    """Nothing of the job was made on the node: no job directory, no log, no scratch."""
    return not any(p.exists() for p in (node.root / "var/lib/cluster/jobs" / job_id,
                                        node.root / "var/log/cluster/jobs" / f"{job_id}.log",
                                        node.root / "scratch/jobs" / job_id))


def sealed_state(node) -> list[tuple[str, int, int, int]]:
    top = node.root / "fsx/checkpoints" / OLD
    return [(str(p.relative_to(top)), p.stat().st_uid, p.stat().st_mode, p.stat().st_size)
            for p in sorted([top, *top.rglob("*")])]


@pytest.mark.parametrize("table, attempt, says", [
    ({OLD: item("succeeded", 1)}, "1000", f"job {OLD} is succeeded in the job table {TABLE}"),
    ({OLD: item("cancelled", 3)}, "4", f"job {OLD} is cancelled in the job table {TABLE}"),
    ({OLD: item("running", 2)}, "3", f"attempt=3: the job table {TABLE} holds attempt 2 as job {OLD}'s current one"),
    ({}, "1", f"job {OLD} is not in the job table {TABLE}"),
])
def test_a_start_the_job_table_does_not_hold_is_refused_before_any_path_is_touched(node, table, attempt, says):
    before = sealed_state(node)
    done = send_document(node, table, OLD, attempt)
    assert done.returncode == jobs.EXIT_FAILED, done.stdout + done.stderr
    (line,) = done.stdout.splitlines()
    assert says in json.loads(line)["error"] and "refused" in json.loads(line)["error"]
    assert done.stderr.count("\n") == 1 and done.stderr.startswith("error: ")
    assert untouched(node, OLD) and sealed_state(node) == before
    assert not (node.root / "var/lib/cluster/jobs").exists()  # not even the jobs directory or its lock


def test_the_current_attempt_of_an_active_job_starts_after_one_consistent_read(node):
    done = send_document(node, {NEW: item("starting", 1), OLD: item("succeeded", 1)}, NEW, "1")
    assert done.returncode == 0, done.stdout + done.stderr
    assert json.loads(done.stdout)["state"] == "running"
    (call,) = [json.loads(line) for line in node.calls.read_text().splitlines()]
    assert call[:2] == ["dynamodb", "get-item"] and "--consistent-read" in call
    assert call[call.index("--table-name") + 1] == TABLE and call[call.index("--region") + 1] == "us-east-1"
    assert json.loads(call[call.index("--key") + 1]) == {"pk": {"S": NEW}}
    node.cli("cancel", "--job-id", NEW, "--timeout-seconds", "20")


def test_a_table_that_cannot_be_read_refuses_the_start(node):
    done = send_document(node, {NEW: item("starting", 1)}, NEW, "1", FAKE_AWS_FAIL="1")
    assert done.returncode == jobs.EXIT_FAILED
    error = json.loads(done.stdout)["error"]
    assert error == (f"job {NEW}: cannot read the job table {TABLE} to check the start (aws exited 255: Unable to "
                     "locate credentials. You can configure credentials by running \"aws configure\".); refused")
    assert untouched(node, NEW)


def test_a_node_config_without_a_table_starts_unchecked(node_factory):
    # the tests' fake nodes and the drills' (their node config is the golden file: "jobTableName": "")
    node = node_factory("exit")
    assert jobs.load_settings(str(node.root)).job_table_name == ""
    out = json.loads(node.start(NEW).stdout)
    assert out["state"] in ("running", "succeeded")


def test_the_items_attempt_is_the_length_of_its_attempts():
    assert current_attempt(item("running", 3)) == ("running", 3)
    assert current_attempt({"state": {"N": "1"}, "attempts": {"S": "x"}}) == (None, 0)
    assert current_attempt({}) == (None, 0)


def test_a_bad_table_name_in_the_node_config_is_one_line(tmp_path):
    from node_fakes import node_config_dict

    from node_bootstrap.config import ConfigError, parse_node_config

    config = node_config_dict()
    config["training"]["jobTableName"] = "no spaces; please"
    with pytest.raises(ConfigError) as e:
        parse_node_config(config)
    assert str(e.value) == ("training.jobTableName='no spaces; please': allowed: a DynamoDB table name: 3-255 of "
                            "A-Z a-z 0-9 _ . -")
