"""Hang detection in the job supervisor, for real: `python3 -m node_bootstrap.jobs start` with the direct
launcher starts the real supervisor, which runs a stand-in for the DLAMI python (so the torchrun argv
reaches a script) that prints trainer step lines the way training/metrics.py does, then behaves as
FAKE_MODE says. The node config carries timeouts of seconds instead of the defaults' minutes, and every such
job is started at once (SCENARIOS), so that the tests' waits overlap. The learned timeout's rules (progress.py)
are checked on their own in test_hang_timeout.py."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
import time
from dataclasses import dataclass
from pathlib import Path

import pytest
from node_fake_firewall import install_system_python
from node_jobs_support import wait_until

from node_bootstrap.job_contract import ABORT_STOP_SECONDS
from node_bootstrap.jobs.hang_origin import HEALTH_CHECK_REQUEST_PATH, PEER_WAIT_S
from node_bootstrap.jobs.progress import HANG_FACTOR

pytestmark = pytest.mark.waits  # mostly sleeps on real timeouts: run beside the slow files (conftest.py)

REPO = Path(__file__).resolve().parents[2]
GOLDEN_NODE_CONFIG = Path(__file__).parents[1] / "cluster_constructs" / "golden" / "node-config.json"
HANG_S, START_S = 2, 5
# the start timeout of the tests whose stand-in never steps: nothing they check needs the slow-start margin
QUICK_START_S = 1
GRACE_S = 11  # start --stop-grace-seconds: the least it allows (torchrun's exit takes 10 s of the budget)

TRAINER = """\
#!{python}
import json, os, signal, subprocess, sys, time
mode = os.environ["FAKE_MODE"]

def step(n):
    print(json.dumps({{"event": "step", "step": n, "loss": 3.0 - n / 100}}), flush=True)

if mode in ("stall", "stall-ignoring-sigterm", "stopped-worker", "exit", "stepping", "cadence", "cadence-restart"):
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
elif mode == "stopped-worker":
    # a worker (torchrun's child, RANK 5 in its environment) stops itself: SIGSTOP, as a debugger would
    worker = subprocess.Popen([sys.executable, "-c", "import os, signal; os.kill(os.getpid(), signal.SIGSTOP)"],
                              start_new_session=True, env={{**os.environ, "RANK": "5"}})
    with open(os.environ["FAKE_WORKER"], "w") as f:
        f.write(str(worker.pid))
elif mode == "exit":
    print("[rank0]: RuntimeError: something went wrong", flush=True)
    sys.exit(3)
elif mode == "stepping":
    for n in range(4, 16):  # 3 s of steps, longer than the hang timeout
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
elif mode in ("cadence", "cadence-restart"):
    # a step line every 0.1 s (steps 4..12), then a stall (cadence) or a restart of the workers
    for n in range(4, 13):
        step(n)
        time.sleep(0.1)
    if mode == "cadence":
        def on_term(signum, frame):
            sys.exit(1)
        signal.signal(signal.SIGTERM, on_term)
    else:
        print("E1123 08:51:46.014000 25655 torch/distributed/elastic/multiprocessing/api.py:1002] failed "
              "(exitcode: 1) local_rank: 3 (pid: 25725) of binary: /opt/pytorch/bin/python3", flush=True)
        time.sleep({slow_start_s})  # far longer than the learned timeout, shorter than the start timeout
        for n in range(13, 16):
            step(n)
            time.sleep(0.1)
        sys.exit(0)
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
    def __init__(self, root: Path, mode: str, *, hang_s=HANG_S, start_s=START_S, module="training", floor_s=None):
        self.root = root
        self.module = module
        config = json.loads(GOLDEN_NODE_CONFIG.read_text())
        config["training"].update(jobHangTimeoutSeconds=hang_s, jobStartTimeoutSeconds=start_s)
        if floor_s is not None:
            config["training"]["jobHangFloorSeconds"] = floor_s
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
        install_system_python(root)  # the probe at start: the firewall holds the metadata block

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


# Every live job below, started at once by one module fixture: each test waits on real timeouts of seconds
# (hang, start, SIGTERM-to-SIGKILL), and their waits overlap instead of adding up (~45 s in series).
SCENARIOS: dict[str, dict] = {
    "stall": dict(mode="stall"),
    "ignores-sigterm": dict(mode="stall-ignoring-sigterm"),
    "stopped-worker": dict(mode="stopped-worker"),
    "stepping": dict(mode="stepping"),
    "exit": dict(mode="exit"),
    "slow-start": dict(mode="slow-start"),
    "restart": dict(mode="restart"),
    "silent": dict(mode="silent", start_s=QUICK_START_S),
    "detection-off": dict(mode="silent", hang_s=0, start_s=QUICK_START_S),
    "commcheck": dict(mode="silent", module="training.commcheck", start_s=QUICK_START_S),
    "monitor-stop": dict(mode="stall", hang_s=600),
    "cadence": dict(mode="cadence", hang_s=600, floor_s=1),  # the upper bound: 10 minutes
    "cadence-restart": dict(mode="cadence-restart", hang_s=600, floor_s=1),
}


@dataclass
class Started:
    node: Node
    job: str
    started_at: float  # time.monotonic() when `start` returned


@pytest.fixture(scope="module")
def started(tmp_path_factory):
    jobs = {}
    try:
        for name, kwargs in SCENARIOS.items():
            node = Node(tmp_path_factory.mktemp(name), **kwargs)
            jobs[name] = Started(node, node.start(), time.monotonic())
        yield jobs
    finally:
        for each in jobs.values():  # never leave a stand-in running
            kill_what_is_left(each.node)


def kill_what_is_left(node: Node) -> None:
    for status in (node.root / "var/lib/cluster/jobs").glob("*/status.json"):
        pid = json.loads(status.read_text()).get("pid")
        if pid and running(pid):
            subprocess.run(["kill", "-9", str(pid)], check=False)
    if node.worker_file.exists() and running(int(node.worker_file.read_text())):
        subprocess.run(["kill", "-9", node.worker_file.read_text()], check=False)


def sleep_until(started: Started, seconds_after_start: float) -> None:
    time.sleep(max(0.0, started.started_at + seconds_after_start - time.monotonic()))


def test_a_trainer_that_stops_stepping_is_stopped_and_marked_hung(started):
    n, job = started["stall"].node, started["stall"].job
    status = n.wait_end(job, HANG_S + GRACE_S + 15)
    assert status["state"] == "hung"
    assert status["lastStepSeen"] == 3 and status["lastStepAt"]
    # two intervals between three step lines are too few to learn from: the upper bound applies
    why = f"no trainer step for {HANG_S} s (the upper bound, jobHangTimeoutSeconds: too few steps seen to learn from)"
    assert status["error"].startswith(f"hung: {why}, waiting for a step (last step seen: 3 at ")
    assert status["exitCode"] == 1  # the stand-in exited on the SIGTERM, as torchrun does
    log = n.log(job)
    assert "SIGTERM received: exiting" in log
    assert f"Z hung: {why}, waiting for a step (last step seen: 3 at " in log
    assert (f"stopping the job: SIGTERM in {PEER_WAIT_S:g} s (the node at fault first), SIGKILL after "
            f"{ABORT_STOP_SECONDS} s") in log and "still running" not in log
    # the stand-in is torchrun without workers: nothing on the host tells where the hang is
    assert (status["hangOrigin"], status["hangEvidence"]) == ("unknown", "no worker of torchrun is left to look at")
    assert "; not here (unknown): no worker of torchrun is left to look at; stopping the job: SIGTERM" in log
    assert not (n.root / HEALTH_CHECK_REQUEST_PATH.lstrip("/")).exists()
    # `status` (what clusterctl status reads through SSM) reports it
    reported = json.loads(n.cli("status", "--job-id", job).stdout)
    assert reported["state"] == "hung" and reported["lastStep"] == 3


def test_a_hung_trainer_that_ignores_sigterm_is_killed_after_the_grace_period(started):
    n, job = started["ignores-sigterm"].node, started["ignores-sigterm"].job
    status = n.wait_end(job, HANG_S + GRACE_S + 15)
    assert status["state"] == "hung" and status["signal"] == "SIGKILL"
    # not the job's stop grace (GRACE_S): a hung rank never reaches the step boundary where SIGTERM saves
    assert f"still running {ABORT_STOP_SECONDS} s after SIGTERM: SIGKILL" in n.log(job)
    worker = int(n.worker_file.read_text())
    # its one worker sleeps (as a rank blocked in a collective's receive): the hang is on a peer
    assert status["hangOrigin"] == "peer"
    assert status["hangEvidence"] == f"every rank here sleeps (a rank (pid {worker})): blocked on a peer, as inside " \
                                     "a collective"
    wait_until(lambda: not running(worker), 10, "the worker in its own session to be killed")


def test_a_stopped_rank_is_named_killed_at_once_and_the_node_asked_for_a_health_check(started):
    n, job = started["stopped-worker"].node, started["stopped-worker"].job
    status = n.wait_end(job, HANG_S + 15)
    worker = int(n.worker_file.read_text())
    evidence = f"rank 5 (pid {worker}) is stopped (state T: SIGSTOP, a debugger or a job-control stop)"
    assert status["state"] == "hung" and status["signal"] == "SIGKILL"  # no SIGTERM: a stopped rank never reads it
    assert (status["hangOrigin"], status["hangEvidence"]) == ("here", evidence)
    # its last progress (step 3's line), to the millisecond: the job's goodput counts the silence from there
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", status["quietSince"])
    assert status["quietSince"][:19] <= status["endedAt"][:19] and status["quietSince"][:19] >= status["startedAt"][:19]
    log = n.log(job)
    assert f"; on this node: {evidence}; stopping the job: SIGKILL\n" in log and "SIGTERM" not in log
    wait_until(lambda: not running(worker), 10, "the stopped worker to be killed")
    request = json.loads((n.root / HEALTH_CHECK_REQUEST_PATH.lstrip("/")).read_text())
    assert request == {"jobId": job, "attempt": 1, "evidence": evidence, "at": request["at"]}
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\dZ", request["at"])


def test_a_trainer_that_keeps_stepping_is_left_alone(started):
    n, job = started["stepping"].node, started["stepping"].job
    status = n.wait_end(job, 30)
    assert status["state"] == "succeeded" and status["exitCode"] == 0
    assert "hung" not in n.log(job)


def test_a_job_that_exits_on_its_own_is_not_marked_hung(started):
    n, job = started["exit"].node, started["exit"].job
    status = n.wait_end(job, 20)
    assert status["state"] == "failed" and status["exitCode"] == 3
    time.sleep(HANG_S + 0.5)  # past the hang timeout: the watchdog must not touch the recorded end
    assert n.status(job)["state"] == "failed" and "hung" not in n.log(job)


def test_the_first_step_gets_the_start_timeout(started):
    n, job = started["slow-start"].node, started["slow-start"].job
    assert n.wait_end(job, 30)["state"] == "succeeded"


def test_a_torchrun_restart_gets_the_start_timeout_again(started):
    n, job = started["restart"].node, started["restart"].job
    assert n.wait_end(job, 30)["state"] == "succeeded"


def test_no_step_at_all_is_hung_after_the_start_timeout(started):
    n, job = started["silent"].node, started["silent"].job
    status = n.wait_end(job, QUICK_START_S + GRACE_S + 15)
    assert status["state"] == "hung"
    assert status["error"] == (f"hung: no trainer step for {QUICK_START_S} s (the start timeout, "
                               "jobStartTimeoutSeconds), waiting for the first step (no step seen)")
    assert status["lastStepSeen"] is None


def test_a_hang_timeout_of_zero_turns_detection_off(started):
    n, job = started["detection-off"].node, started["detection-off"].job
    sleep_until(started["detection-off"], QUICK_START_S + 1.5)  # a watched job would be hung (and its stand-in gone)
    assert n.status(job)["state"] == "running"
    result = n.cli("cancel", "--job-id", job, "--timeout-seconds", "5")
    assert json.loads(result.stdout)["state"] == "cancelled"


def test_a_commcheck_is_not_watched_for_trainer_steps(started):
    n, job = started["commcheck"].node, started["commcheck"].job
    sleep_until(started["commcheck"], QUICK_START_S + 1.5)  # a watched job would be hung (and its stand-in gone)
    assert n.status(job)["state"] == "running"
    n.cli("cancel", "--job-id", job, "--timeout-seconds", "5")


def test_a_job_stopped_by_the_health_monitor_is_failed_with_its_reason(started):
    """What the monitor does (monitor/actions.py): a stop request next to the status, then SIGTERM to the
    supervisor."""
    n, job = started["monitor-stop"].node, started["monitor-stop"].job
    wait_until(lambda: '"step": 3' in n.log(job), 10, "step 3")
    request = {"by": "node health monitor", "reason": "health monitor: xid: new: Xid 79 on 0000:b9:00",
               "at": "2025-03-11T12:03:20Z"}
    (n.root / "var/lib/cluster/jobs" / job / "stop-request.json").write_text(json.dumps(request))
    subprocess.run(["kill", "-TERM", str(n.status(job)["supervisorPid"])], check=True)
    status = n.wait_end(job, 20)
    assert status["state"] == "failed"
    assert status["error"] == "stopped by the node health monitor: health monitor: xid: new: Xid 79 on 0000:b9:00"
    assert status["stopRequest"] == request


# --- the timeout learned from the step cadence ------------------------------------------------------------


def test_a_stall_is_hung_after_the_learned_timeout_long_before_the_upper_bound(started):
    n, job = started["cadence"].node, started["cadence"].job
    status = n.wait_end(job, 1 + GRACE_S + 30)  # long before the upper bound
    assert status["state"] == "hung" and status["lastStepSeen"] == 12
    found = re.match(r"hung: no trainer step for ([0-9.]+) s \((the floor, jobHangFloorSeconds, above )?5 x the "
                     r"slowest step interval ([0-9.e+-]+) s\), waiting for a step \(last step seen: 12 at ",
                     status["error"])
    assert found, status["error"]
    timeout_s, slowest_s = float(found.group(1)), float(found.group(3))
    assert timeout_s == round(max(1.0, HANG_FACTOR * slowest_s), 1) or found.group(2) is None
    assert slowest_s >= 0.1  # the stand-in sleeps 0.1 s between its step lines
    assert timeout_s < 600


def test_the_first_step_after_a_restart_keeps_its_allowance_after_the_cadence_was_learned(started):
    # steps every 0.1 s teach a timeout of about the 1 s floor; the restarted workers' first step comes
    # 3 s later, inside the 5 s start timeout
    n, job = started["cadence-restart"].node, started["cadence-restart"].job
    status = n.wait_end(job, 30)
    assert status["state"] == "succeeded", status
