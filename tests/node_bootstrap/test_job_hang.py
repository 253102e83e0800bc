"""Hang detection in the job supervisor, for real: `python3 -m node_bootstrap.jobs start` with the direct
launcher starts the real supervisor, which runs a stand-in for the DLAMI python (so the torchrun argv
reaches a script) that prints trainer step lines the way training/metrics.py does, then behaves as
FAKE_MODE says. The node config carries timeouts of seconds instead of the defaults' minutes."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from node_jobs_support import wait_until

REPO = Path(__file__).resolve().parents[2]
GOLDEN_NODE_CONFIG = Path(__file__).parents[1] / "cluster_constructs" / "golden" / "node-config.json"
HANG_S, START_S = 2, 5
GRACE_S = 11  # start --stop-grace-seconds: the least it allows (torchrun's exit takes 10 s of the budget)

TRAINER = """\
#!{python}
import json, os, signal, subprocess, sys, time
mode = os.environ["FAKE_MODE"]

def step(n):
    print(json.dumps({{"event": "step", "step": n, "loss": 3.0 - n / 100}}), flush=True)

if mode in ("stall", "stall-ignoring-sigterm", "exit", "stepping"):
    for n in (1, 2, 3):
        step(n)
        time.sleep(0.1)
if mode == "stall":
    def on_term(signum, frame):
        print("SIGTERM received: exiting", flush=True)
        sys.exit(1)
    signal.signal(signal.SIGTERM, on_term)
elif mode == "stall-ignoring-sigterm":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # like torchrun's workers: a new session, so only a kill by pid reaches it
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    with open(os.environ["FAKE_WORKER"], "w") as f:
        f.write(str(worker.pid))
elif mode == "exit":
    print("[rank0]: RuntimeError: something went wrong", flush=True)
    sys.exit(3)
elif mode == "stepping":
    for n in range(4, 24):  # 5 s of steps, more than twice the hang timeout
        time.sleep(0.25)
        step(n)
    sys.exit(0)
elif mode == "slow-start":
    time.sleep({slow_start_s})  # longer than the hang timeout, shorter than the start timeout
    for n in (1, 2, 3):
        step(n)
    sys.exit(0)
elif mode == "restart":
    step(1)
    print("E1123 08:51:46.014000 25655 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
          "(exitcode: 1) local_rank: 3 (pid: 25725) of binary: /opt/pytorch/bin/python3", flush=True)
    time.sleep({slow_start_s})  # the restarted workers load the checkpoint and compile
    step(2)
    sys.exit(0)
elif mode == "silent":
    pass
while True:
    time.sleep(0.05)
"""


def running(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().rsplit(")", 1)[1].split()[0] != "Z"
    except OSError:
        return False


def write_user_database(root: Path) -> None:
    """/etc/passwd and /etc/group as the jobuser boot step leaves them, the job user being this test's user
    (as node_jobs_support.py does: the supervisor then needs no privilege to switch to it)."""
    uid, gid = os.getuid(), os.getgid()
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "etc/passwd").write_text(
        f"root:x:0:0:root:/root:/bin/bash\ncluster-job:x:{uid}:{gid}:training jobs (node_bootstrap):"
        "/var/lib/cluster-job:/usr/sbin/nologin\n")
    (root / "etc/group").write_text(f"root:x:0:\ncluster-job:x:{gid}:\n")


class Node:
    def __init__(self, root: Path, mode: str, *, hang_s=HANG_S, module="training"):
        self.root = root
        self.module = module
        config = json.loads(GOLDEN_NODE_CONFIG.read_text())
        config["training"].update(jobHangTimeoutSeconds=hang_s, jobStartTimeoutSeconds=START_S)
        (root / "etc/cluster").mkdir(parents=True)
        (root / "etc/cluster/node-config.json").write_text(json.dumps(config))
        self.worker_file = root / "worker.pid"
        (root / "etc/cluster/training.env").write_text(f"FAKE_MODE={mode}\nFAKE_WORKER={self.worker_file}\n")
        (root / "opt/cluster/bundle").mkdir(parents=True)
        python = root / "opt/pytorch/bin/python"
        python.parent.mkdir(parents=True)
        python.write_text(TRAINER.format(python=sys.executable, slow_start_s=HANG_S + 1))
        python.chmod(0o755)
        write_user_database(root)

    def cli(self, *args):
        return subprocess.run([sys.executable, "-m", "node_bootstrap.jobs", "--root", str(self.root), *args],
                              cwd=REPO, capture_output=True, text=True, timeout=60)

    def start(self, job_id="j-hang-test"):
        extra = ["--config", "training/configs/tiny-cpu.toml"] if self.module == "training" else []
        result = self.cli("start", "--job-id", job_id, "--module", self.module, *extra, "--nodes", "1",
                          "--gpus-per-node", "1", "--rendezvous-host", "10.0.1.17", "--max-restarts", "0",
                          "--stop-grace-seconds", str(GRACE_S), "--launcher", "direct")
        assert result.returncode == 0, result.stdout + result.stderr
        return job_id

    def status(self, job_id):
        return json.loads((self.root / "var/lib/cluster/jobs" / job_id / "status.json").read_text())

    def wait_end(self, job_id, timeout_s):
        return wait_until(lambda: self.status(job_id)["state"] != "running" and self.status(job_id), timeout_s,
                          f"{job_id} to end")

    def log(self, job_id):
        return (self.root / "var/log/cluster/jobs" / f"{job_id}.log").read_text()


@pytest.fixture
def node(tmp_path):
    made = []

    def make(mode, **kwargs):
        made.append(Node(tmp_path, mode, **kwargs))
        return made[-1]
    yield make
    for n in made:  # never leave a stand-in running
        for status in (n.root / "var/lib/cluster/jobs").glob("*/status.json"):
            pid = json.loads(status.read_text()).get("pid")
            if pid and running(pid):
                subprocess.run(["kill", "-9", str(pid)], check=False)
        if n.worker_file.exists() and running(int(n.worker_file.read_text())):
            subprocess.run(["kill", "-9", n.worker_file.read_text()], check=False)


def test_a_trainer_that_stops_stepping_is_stopped_and_marked_hung(node):
    n = node("stall")
    job = n.start()
    status = n.wait_end(job, HANG_S + GRACE_S + 15)
    assert status["state"] == "hung"
    assert status["lastStepSeen"] == 3 and status["lastStepAt"]
    assert status["error"].startswith(f"hung: no trainer step for {HANG_S} s, waiting for a step "
                                      "(last step seen: 3 at ")
    assert status["exitCode"] == 1  # the stand-in exited on the SIGTERM, as torchrun does
    log = n.log(job)
    assert "SIGTERM received: exiting" in log
    assert f"Z hung: no trainer step for {HANG_S} s, waiting for a step (last step seen: 3 at " in log
    assert f"stopping the job: SIGTERM, SIGKILL after {GRACE_S} s" in log and "still running" not in log
    # `status` (what clusterctl status reads through SSM) reports it
    reported = json.loads(n.cli("status", "--job-id", job).stdout)
    assert reported["state"] == "hung" and reported["lastStep"] == 3


def test_a_hung_trainer_that_ignores_sigterm_is_killed_after_the_grace_period(node):
    n = node("stall-ignoring-sigterm")
    job = n.start()
    status = n.wait_end(job, HANG_S + GRACE_S + 15)
    assert status["state"] == "hung" and status["signal"] == "SIGKILL"
    assert f"still running {GRACE_S} s after SIGTERM: SIGKILL" in n.log(job)
    worker = int(n.worker_file.read_text())
    wait_until(lambda: not running(worker), 10, "the worker in its own session to be killed")


def test_a_trainer_that_keeps_stepping_is_left_alone(node):
    n = node("stepping")
    job = n.start()
    status = n.wait_end(job, 30)
    assert status["state"] == "succeeded" and status["exitCode"] == 0
    assert "hung" not in n.log(job)


def test_a_job_that_exits_on_its_own_is_not_marked_hung(node):
    n = node("exit")
    job = n.start()
    status = n.wait_end(job, 20)
    assert status["state"] == "failed" and status["exitCode"] == 3
    time.sleep(HANG_S + 0.5)  # past the hang timeout: the watchdog must not touch the recorded end
    assert n.status(job)["state"] == "failed" and "hung" not in n.log(job)


def test_the_first_step_gets_the_start_timeout(node):
    n = node("slow-start")
    status = n.wait_end(n.start(), 30)
    assert status["state"] == "succeeded"


def test_a_torchrun_restart_gets_the_start_timeout_again(node):
    n = node("restart")
    status = n.wait_end(n.start(), 30)
    assert status["state"] == "succeeded"


def test_no_step_at_all_is_hung_after_the_start_timeout(node):
    n = node("silent")
    job = n.start()
    status = n.wait_end(job, START_S + GRACE_S + 15)
    assert status["state"] == "hung"
    assert status["error"] == f"hung: no trainer step for {START_S} s, waiting for the first step (no step seen)"
    assert status["lastStepSeen"] is None


def test_a_hang_timeout_of_zero_turns_detection_off(node):
    n = node("silent", hang_s=0)
    job = n.start()
    time.sleep(START_S + 1)
    assert n.status(job)["state"] == "running"
    result = n.cli("cancel", "--job-id", job, "--timeout-seconds", "5")
    assert json.loads(result.stdout)["state"] == "cancelled"


def test_a_commcheck_is_not_watched_for_trainer_steps(node):
    n = node("silent", module="training.commcheck")
    job = n.start()
    time.sleep(START_S + 1)
    assert n.status(job)["state"] == "running"
    n.cli("cancel", "--job-id", job, "--timeout-seconds", "5")


def test_a_job_stopped_by_the_health_monitor_is_failed_with_its_reason(node):
    """What the monitor does (monitor/actions.py): a stop request next to the status, then SIGTERM to the
    supervisor."""
    n = node("stall", hang_s=600)
    job = n.start()
    wait_until(lambda: '"step": 3' in n.log(job), 10, "step 3")
    request = {"by": "node health monitor", "reason": "health monitor: xid: new: Xid 79 on 0000:b9:00",
               "at": "2025-03-11T12:03:20Z"}
    (n.root / "var/lib/cluster/jobs" / job / "stop-request.json").write_text(json.dumps(request))
    subprocess.run(["kill", "-TERM", str(n.status(job)["supervisorPid"])], check=True)
    status = n.wait_end(job, 20)
    assert status["state"] == "failed"
    assert status["error"] == "stopped by the node health monitor: health monitor: xid: new: Xid 79 on 0000:b9:00"
    assert status["stopRequest"] == request
