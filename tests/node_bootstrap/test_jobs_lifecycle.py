"""node_bootstrap/jobs/ for real (a fake root and a stand-in for the DLAMI python: node_jobs_support): start
detached, status from the job's real status file, cancel; failed, successful, lost and duplicate jobs; bad
values refused before anything is touched; the systemd launcher through a fake systemd-run on PATH (the
direct launcher elsewhere: systemd is not PID 1 here); the nodes' Python 3.9."""

import json
import os
import shutil
import signal
import subprocess
import sys
from pathlib import Path

import pytest
from node_jobs_support import GOLDEN_NODE_CONFIG, PY39, REPO, expected_argv, pid_alive, wait_until

from node_bootstrap import jobs

pytestmark = pytest.mark.waits  # mostly sleeps on real timeouts: run beside the slow files (conftest.py)


def test_start_runs_torchrun_detached_and_status_reports_the_last_step(node_factory):
    node = node_factory("until-sigterm")
    started = node.start("j-20261120-231502-ab12")
    # `start` has returned (exit 0) while the job keeps running: it is detached.
    start_out = json.loads(started.stdout)
    assert start_out["state"] == "running" and start_out["launcher"] == "direct"
    assert start_out["cloudwatch"].startswith("CloudWatch agent not installed")
    assert pid_alive(start_out["pid"])
    wait_until(lambda: "ready" in node.log("j-20261120-231502-ab12"), what="stand-in ready")

    record = json.loads(node.record.read_text())
    assert record["argv"] == expected_argv(node.root, "j-20261120-231502-ab12")
    assert record["cwd"] == str(node.root / "opt/cluster/bundle")
    assert record["env"]["FI_PROVIDER"] == "efa" and record["env"]["NCCL_DEBUG"] == "WARN"
    assert record["env"]["CLUSTER_JOB_ID"] == "j-20261120-231502-ab12"
    assert record["env"]["PYTHONUNBUFFERED"] == "1"
    assert record["env"]["PYTHONPATH"].split(":")[0] == str(node.root / "opt/cluster/bundle")
    # The child leads its own process group (so SIGTERM reaches torchrun's whole group).
    assert record["pgid"] == record["pid"] == start_out["pid"]

    status = json.loads(node.cli("status", "--job-id", "j-20261120-231502-ab12").stdout)
    assert status["state"] == "running" and status["exitCode"] is None
    assert status["lastStep"] == 20 and status["lastLoss"] == pytest.approx(1.0)
    assert status["startedAt"].endswith("Z") and status["endedAt"] is None
    assert status["ncclNetwork"] is None and status["ncclProvider"] is None  # the stand-in prints no NCCL

    cancelled = json.loads(node.cli("cancel", "--job-id", "j-20261120-231502-ab12").stdout)
    assert cancelled["state"] == "cancelled" and cancelled["exitCode"] == 0
    assert cancelled["cancel"] == "stopped by SIGTERM"
    assert cancelled["lastStep"] == 25  # the step the trainer logged while handling SIGTERM
    assert "checkpoint saved after SIGTERM" in node.log("j-20261120-231502-ab12")
    assert not pid_alive(start_out["pid"])


def test_failed_job_records_its_exit_code(node_factory):
    node = node_factory("exit", exit_code=3)
    node.start("j-fail-1", check=False)  # may already see the failure: it exits at once
    final = node.wait_state("j-fail-1", "failed")
    assert final["exitCode"] == 3 and final["endedAt"] is not None
    status = node.cli("status", "--job-id", "j-fail-1")
    assert json.loads(status.stdout)["state"] == "failed"
    log = node.log("j-fail-1")
    assert "[rank0]: something went wrong" in log and "exit code 3" in log


def test_a_trainer_stopped_by_another_nodes_stop_request_is_cancelled_not_failed(node_factory):
    # the trainer's checkpointed stop, then a non-zero exit from torchrun's teardown (its rendezvous store left
    # with the node that was stopped first): the job was stopped, so the node says cancelled, with the exit code
    node = node_factory("peer-stop", exit_code=1)
    node.start("j-peer-1", check=False)
    final = node.wait_state("j-peer-1", "cancelled")
    assert (final["exitCode"], final["error"]) == (1, "stopped with a checkpoint at a stop request on another node")
    # the same exit without the trainer's stop line is a failure (test_failed_job_records_its_exit_code), and
    # with exit 0 the stopped trainer's node succeeded as before
    node.write_env("peer-stop", 0)
    node.start("j-peer-2", check=False)
    assert node.wait_state("j-peer-2", "succeeded")["exitCode"] == 0


def test_successful_job_and_status_file_contract(node_factory):
    node = node_factory("exit", exit_code=0)
    node.start("j-ok-1", check=False)
    final = node.wait_state("j-ok-1", "succeeded")
    assert set(final) >= {"state", "exitCode", "startedAt", "endedAt", "pid"}
    assert final["exitCode"] == 0
    assert not list((node.root / "var/lib/cluster/jobs/j-ok-1").glob("*.tmp-*"))  # atomic writes left nothing


def test_cancel_kills_everything_after_the_timeout(node_factory):
    node = node_factory("ignore-sigterm")
    node.start("j-stuck-1")
    worker_file = Path(str(node.record) + ".worker")
    worker_pid = int(wait_until(lambda: worker_file.exists() and worker_file.read_text(), what="worker"))
    assert pid_alive(worker_pid)
    out = json.loads(node.cli("cancel", "--job-id", "j-stuck-1", "--timeout-seconds", "1").stdout)
    assert out["cancel"] == "SIGKILL after 1 s"
    assert out["state"] == "cancelled" and out["exitCode"] == 128 + signal.SIGKILL
    wait_until(lambda: not pid_alive(worker_pid), what="worker in its own session killed")


def test_status_of_a_job_whose_supervisor_is_gone_is_failed(node_factory):
    node = node_factory("exit")
    job_dir = node.root / "var/lib/cluster/jobs/j-lost-1"
    job_dir.mkdir(parents=True)
    dead = subprocess.Popen(["true"])
    dead.wait()
    (job_dir / "status.json").write_text(json.dumps(
        {"jobId": "j-lost-1", "state": "running", "exitCode": None, "startedAt": "2026-11-20T23:15:02Z",
         "endedAt": None, "pid": dead.pid, "supervisorPid": dead.pid}))
    out = json.loads(node.cli("status", "--job-id", "j-lost-1").stdout)
    assert out["state"] == "failed" and "supervisor" in out["error"]
    assert out["lastStep"] is None


def test_unknown_job_and_duplicate_job(node_factory):
    node = node_factory("until-sigterm")
    missing = node.cli("status", "--job-id", "j-nope-1", check=False)
    assert missing.returncode == jobs.EXIT_NOT_FOUND
    assert "no job j-nope-1 on this node" in json.loads(missing.stdout)["error"]
    node.start("j-dup-1")
    again = node.start("j-dup-1", check=False)
    assert again.returncode == jobs.EXIT_FAILED
    assert "job j-dup-1 already exists on this node" in again.stderr
    node.cli("cancel", "--job-id", "j-dup-1")


@pytest.mark.parametrize(
    ("args", "message"),
    [
        (["--job-id", "J;rm"], "job-id='J;rm': allowed"),
        (["--config", "x.yaml"], "config='x.yaml': allowed: a .toml path"),
        (["--config", "../etc/x.toml"], "config='../etc/x.toml'"),
        (["--nodes", "0"], "nodes=0: allowed: 1-4096"),
        (["--rendezvous-host", "$(id)"], "rendezvous-host='$(id)'"),
        (["--overrides", "a=1 b=$(id)"], "overrides item 'b=$(id)'"),
    ],
)
def test_start_rejects_bad_values_before_touching_anything(node_factory, args, message):
    node = node_factory("exit")
    base = {"--job-id": "j-bad-1", "--config": "training/configs/tiny.toml", "--nodes": "2",
            "--gpus-per-node": "8", "--rendezvous-host": "10.0.0.1", "--max-restarts": "0"}
    base.update(dict(zip(args[::2], args[1::2], strict=True)))
    result = node.cli("start", *[x for kv in base.items() for x in kv], check=False)
    assert result.returncode == jobs.EXIT_USAGE
    assert message in result.stderr
    assert not (node.root / "var/lib/cluster/jobs").exists()


def test_node_config_errors_name_the_key(tmp_path):
    (tmp_path / "etc/cluster").mkdir(parents=True)
    config = json.loads(GOLDEN_NODE_CONFIG.read_text())
    config["training"]["rendezvousPort"] = "29400"
    (tmp_path / "etc/cluster/node-config.json").write_text(json.dumps(config))
    wrong_type = r'training\.rendezvousPort="29400" has the wrong type; allowed: an integer'
    with pytest.raises(jobs.JobError, match=wrong_type):
        jobs.load_settings(str(tmp_path))
    config["training"]["rendezvousPort"] = 29400
    del config["training"]["bundleDir"]
    (tmp_path / "etc/cluster/node-config.json").write_text(json.dumps(config))
    with pytest.raises(jobs.JobError, match=r"missing key training\.bundleDir in the node config"):
        jobs.load_settings(str(tmp_path))
    with pytest.raises(jobs.JobError, match="cannot read node config"):
        jobs.load_settings(str(tmp_path / "missing"))


FAKE_SYSTEMD_RUN = """\
#!/bin/bash
# Records its arguments, then runs the command after "--" detached, as systemd would in a unit.
printf '%s\\n' "$@" > "$FAKE_SYSTEMD_RECORD"
while [ "$1" != "--" ]; do
  case "$1" in --setenv=*) export "${1#--setenv=}";; esac
  shift
done
shift
setsid "$@" </dev/null >/dev/null 2>&1 &
"""

# Records its arguments; `kill` signals the unit's main process (the supervisor) as systemd would.
FAKE_SYSTEMCTL = """\
#!/bin/bash
printf '%s\\n' "$@" >> "$FAKE_SYSTEMCTL_RECORD"
if [ "$1" = kill ]; then
  kill -TERM "$(sed -n 's/.*"supervisorPid": \\([0-9]*\\).*/\\1/p' "$FAKE_STATUS")"
fi
"""

FAKE_AGENT_CTL = """\
#!/bin/bash
printf '%s\\n' "$@" > "$(dirname "$0")/ctl-args"
cp "${6#file:}" "$(dirname "$0")/ctl-config.json"
"""


def test_systemd_launcher_and_cloudwatch_agent(node_factory, tmp_path):
    node = node_factory("until-sigterm")
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    for name, text in (("systemd-run", FAKE_SYSTEMD_RUN), ("systemctl", FAKE_SYSTEMCTL)):
        (bin_dir / name).write_text(text)
        (bin_dir / name).chmod(0o755)
    (node.root / "run/systemd/system").mkdir(parents=True)  # sd_booted(): systemd is PID 1
    ctl = node.root / jobs.CLOUDWATCH_AGENT_CTL.lstrip("/")
    ctl.parent.mkdir(parents=True)
    ctl.write_text(FAKE_AGENT_CTL)
    ctl.chmod(0o755)
    record = tmp_path / "systemd-run-args"
    env = dict(os.environ, PATH=f"{bin_dir}:{os.environ['PATH']}", FAKE_SYSTEMD_RECORD=str(record),
               FAKE_SYSTEMCTL_RECORD=str(tmp_path / "systemctl-args"),
               FAKE_STATUS=str(node.root / "var/lib/cluster/jobs/j-unit-1/status.json"))

    out = json.loads(node.start("j-unit-1", env=env).stdout)
    assert out["launcher"] == "systemd" and out["unit"] == "training-job-j-unit-1"
    args = record.read_text().splitlines()
    separator = args.index("--")
    assert args[:separator] == [
        "--unit=training-job-j-unit-1", "--collect", "--no-block", "--description=training job j-unit-1",
        "--property=KillMode=mixed", "--property=TimeoutStopSec=120", "--property=LimitMEMLOCK=infinity",
        "--property=NoNewPrivileges=yes", "--property=PrivateTmp=yes", f"--setenv=PYTHONPATH={REPO}",
    ]
    assert args[separator + 1:] == [
        sys.executable, "-m", "node_bootstrap.jobs", "--root", str(node.root),
        "--node-config", "/etc/cluster/node-config.json", "supervise", "--job-id", "j-unit-1",
    ]

    config_path = node.root / "etc/cluster/cloudwatch-agent-jobs/j-unit-1.json"
    assert (ctl.parent / "ctl-args").read_text().splitlines() == [
        "-a", "append-config", "-m", "ec2", "-c", f"file:{config_path}", "-s"]
    collect = json.loads((ctl.parent / "ctl-config.json").read_text())["logs"]["logs_collected"]
    assert collect["files"]["collect_list"] == [{
        "file_path": str(node.root / "var/log/cluster/jobs/j-unit-1.log"),
        "log_group_name": "/training-cluster/TrainingClusterStack",
        "log_stream_name": "jobs/j-unit-1/{instance_id}",
    }, {  # the trainer's metrics as the supervisor publishes them (node_bootstrap/jobs/job_metrics.py)
        "file_path": str(node.root / "var/log/cluster/jobs/j-unit-1.metrics.log"),
        "log_group_name": "/training-cluster/TrainingClusterStack",
        "log_stream_name": "metrics/jobs/j-unit-1/{instance_id}",
    }]
    assert out["cloudwatch"].startswith("shipping to CloudWatch Logs /training-cluster/TrainingClusterStack")

    cancelled = json.loads(node.cli("cancel", "--job-id", "j-unit-1", env=env).stdout)
    assert cancelled["state"] == "cancelled" and cancelled["cancel"] == "stopped by SIGTERM"
    assert (tmp_path / "systemctl-args").read_text().splitlines() == [
        "kill", "--kill-whom=main", "--signal=SIGTERM", "training-job-j-unit-1.service"]


@pytest.mark.skipif(not PY39.exists(), reason="the nodes' Python 3.9 is not installed here")
def test_runs_on_the_nodes_python_39(node_factory):
    node = node_factory("exit", exit_code=0, interpreter=str(PY39))
    node.start("j-py39-1", check=False)
    assert node.wait_state("j-py39-1", "succeeded")["exitCode"] == 0
    assert json.loads(node.cli("status", "--job-id", "j-py39-1").stdout)["lastStep"] == 20
    node.write_env("exit", resume_step=20)  # a second attempt: the start lock, the kept-aside status
    node.start("j-py39-1", "--attempt", "2", check=False)
    assert node.wait_state("j-py39-1", "succeeded", attempt=2)["resumedFromStep"] == 20
    assert json.loads((node.root / "var/lib/cluster/jobs/j-py39-1/status.attempt-1.json").read_text())[
        "lastStep"] == 20


def test_module_is_python_39_and_lint_clean():
    package = REPO / "node_bootstrap/jobs"
    sources = sorted(str(path) for path in package.glob("*.py"))
    assert sources
    if PY39.exists():
        subprocess.run([str(PY39), "-m", "py_compile", *sources], check=True)
    ruff = shutil.which("ruff", path=str(Path(sys.executable).parent)) or "ruff"
    result = subprocess.run([ruff, "check", "--config", str(REPO / "node_bootstrap/ruff.toml"), str(package)],
                            capture_output=True, text=True)
    assert result.returncode == 0, result.stdout


def test_exit_code_of_signal():
    assert jobs.exit_code_of(-signal.SIGKILL) == (137, "SIGKILL")
    assert jobs.exit_code_of(2) == (2, None)
