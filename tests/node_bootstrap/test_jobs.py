"""node_bootstrap/jobs/ for real: a fake root, a stand-in for the DLAMI python (so the real torchrun argv
reaches a script that records it), the direct launcher (systemd is not PID 1 here) and a fake systemd-run
on PATH for the systemd path. Each test waits on the job's real status file."""

import json
import os
import shutil
import signal
import subprocess
import sys
import textwrap
import time
from pathlib import Path

import pytest

from node_bootstrap import jobs

REPO = Path(__file__).resolve().parents[2]
GOLDEN_NODE_CONFIG = Path(__file__).parents[1] / "cluster_constructs" / "golden" / "node-config.json"
PY39 = Path("/root/.pyenv/versions/3.9.18/bin/python3.9")

# Stands in for /opt/pytorch/bin/python: records how torchrun would have been called, prints trainer step
# lines (or, for training.commcheck, its all_reduce lines as training/commcheck.py prints them) and behaves
# as FAKE_MODE (set through the training env file, which proves the file is sourced) says.
FAKE_PYTHON = """\
#!{python}
import json, os, signal, subprocess, sys, time
with open(os.environ["FAKE_RECORD"], "w") as f:
    json.dump({{"argv": sys.argv[1:], "cwd": os.getcwd(), "pgid": os.getpgid(0), "pid": os.getpid(),
               "env": {{k: os.environ.get(k) for k in ("FI_PROVIDER", "NCCL_DEBUG", "PYTHONPATH",
                                                       "CLUSTER_JOB_ID", "PYTHONUNBUFFERED")}}}}, f)
mode = os.environ["FAKE_MODE"]
resumed = int(os.environ.get("FAKE_RESUME_STEP", "0"))  # the checkpoint step this attempt "resumed" from
if "training.commcheck" in sys.argv:
    for size, busbw in ((67108864, 301.5), (1073741824, 452.25)):
        print(json.dumps({{"event": "allreduce", "size_bytes": size, "dtype": "bfloat16", "ranks": 16,
                          "backend": "nccl", "time_ms": 1.0, "algbw_gbps": busbw / 1.875,
                          "busbw_gbps": busbw}}), flush=True)
    print(json.dumps({{"event": "allreduce_summary", "backend": "nccl", "dtype": "bfloat16", "ranks": 16,
                      "nodes": 2, "sizes_bytes": [67108864, 1073741824], "largest_size_bytes": 1073741824,
                      "busbw_gbps": 452.25, "peak_busbw_gbps": 452.25, "min_busbw_gbps": 350.0,
                      "passed": True}}), flush=True)
else:
    # training/metrics.py's resume line, under the "[rank0]:" prefix torchrun can add
    path = "/fsx/checkpoints/step-%d" % resumed if resumed else None
    print("[rank0]:" + json.dumps({{"event": "resume", "step": resumed, "path": path}}), flush=True)
    for step in (10, 20):
        print(json.dumps({{"event": "step", "step": resumed + step, "loss": 3.0 - step / 10}}), flush=True)
if mode == "exit":
    print("[rank0]: something went wrong", flush=True)
    sys.exit(int(os.environ["FAKE_EXIT_CODE"]))
if mode == "until-sigterm":
    def on_term(signum, frame):
        print(json.dumps({{"event": "step", "step": resumed + 25, "loss": 0.5}}), flush=True)
        print("checkpoint saved after SIGTERM", flush=True)
        sys.exit(0)
    signal.signal(signal.SIGTERM, on_term)
if mode == "ignore-sigterm":
    signal.signal(signal.SIGTERM, signal.SIG_IGN)
    # torchrun starts workers in new sessions: a process-group signal does not reach them.
    worker = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(600)"], start_new_session=True)
    with open(os.environ["FAKE_RECORD"] + ".worker", "w") as f:
        f.write(str(worker.pid))
print("ready", flush=True)
while True:
    time.sleep(0.05)
"""


def write_user_database(root: Path, uid: int | None = None, gid: int | None = None) -> None:
    """/etc/passwd and /etc/group of a fake node, as the jobuser boot step leaves them; the job user is whoever
    runs the tests unless uid/gid say otherwise (then the supervisor really switches to them)."""
    uid = os.getuid() if uid is None else uid
    gid = os.getgid() if gid is None else gid
    (root / "etc").mkdir(parents=True, exist_ok=True)
    (root / "etc/passwd").write_text(
        f"root:x:0:0:root:/root:/bin/bash\ncluster-job:x:{uid}:{gid}:training jobs (node_bootstrap):"
        "/var/lib/cluster-job:/usr/sbin/nologin\n")
    (root / "etc/group").write_text(f"root:x:0:\nvideo:x:44:cluster-job\ncluster-job:x:{gid}:\n")


def wait_until(predicate, timeout_s=20.0, what="condition"):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        value = predicate()
        if value:
            return value
        time.sleep(0.05)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def pid_alive(pid):
    try:
        with open(f"/proc/{pid}/stat") as f:
            return f.read().split(") ")[1][0] != "Z"
    except OSError:
        return False


class Node:
    """A fake node root with the node config, the training env file and the stand-in python."""

    def __init__(self, root: Path, mode: str, exit_code: int = 0, interpreter: str = sys.executable):
        self.root = root
        self.interpreter = interpreter
        self.record = root / "record.json"
        # the node config the stack renders (its golden file), so the launcher reads the real contract
        config = json.loads(GOLDEN_NODE_CONFIG.read_text())
        (root / "etc/cluster").mkdir(parents=True)
        (root / "etc/cluster/node-config.json").write_text(json.dumps(config))
        self.write_env(mode, exit_code)
        (root / "opt/cluster/bundle").mkdir(parents=True)
        python = root / "opt/pytorch/bin/python"
        python.parent.mkdir(parents=True)
        python.write_text(FAKE_PYTHON.format(python=sys.executable))
        python.chmod(0o755)
        write_user_database(root)
        self.settings = jobs.load_settings(str(root))

    def write_env(self, mode: str, exit_code: int = 0, resume_step: int = 0) -> None:
        """The training env file: what the stand-in does at the next start."""
        (self.root / "etc/cluster/training.env").write_text(
            f"FI_PROVIDER=efa\nNCCL_DEBUG='WARN'\nFAKE_MODE={mode}\nFAKE_EXIT_CODE={exit_code}\n"
            f"FAKE_RECORD={self.record}\nFAKE_RESUME_STEP={resume_step}\n")

    def cli(self, *args, env=None, check=True):
        result = subprocess.run(
            [self.interpreter, "-m", "node_bootstrap.jobs", "--root", str(self.root), *args],
            cwd=REPO, capture_output=True, text=True, timeout=60, env=env)
        if check and result.returncode != 0:
            raise AssertionError(f"{args} exited {result.returncode}: {result.stdout} {result.stderr}")
        return result

    def start(self, job_id, *extra, env=None, check=True):
        return self.cli("start", "--job-id", job_id, "--config", "training/configs/tiny-cpu.toml",
                        "--nodes", "2", "--gpus-per-node", "8", "--rendezvous-host", "10.0.1.17",
                        "--max-restarts", "2", "--overrides", "optim.lr=3e-4 train.steps=100", *extra,
                        env=env, check=check)

    def status_file(self, job_id):
        return json.loads((self.root / "var/lib/cluster/jobs" / job_id / "status.json").read_text())

    def wait_state(self, job_id, state, attempt=1):
        def reached():
            status = self.status_file(job_id)
            return status.get("attempt", 1) == attempt and status["state"] == state and status
        return wait_until(reached, what=f"{job_id} attempt {attempt} {state}")

    def log(self, job_id):
        return (self.root / "var/log/cluster/jobs" / f"{job_id}.log").read_text()


@pytest.fixture()
def node_factory(tmp_path):
    started = []

    def make(mode, **kwargs):
        node = Node(tmp_path, mode, **kwargs)
        started.append(node)
        return node

    yield make
    for node in started:  # never leave a stand-in job running
        for status_path in (node.root / "var/lib/cluster/jobs").glob("*/status.json"):
            status = json.loads(status_path.read_text())
            if status.get("state") == "running" and pid_alive(status.get("supervisorPid")):
                for pid in jobs.descendants(status["supervisorPid"]) + [status["supervisorPid"]]:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass


def expected_argv(node_root: Path, job_id: str):
    return [
        "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "8", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "10.0.1.17:29400", "--rdzv-id", job_id, "--max-restarts", "2",
        "--shutdown-timeout", "110", "-m", "training", "--config", "training/configs/tiny-cpu.toml", "--resume", "auto",
        "--set", "optim.lr=3e-4", "--set", "train.steps=100",
        "--set", f"checkpoint.dir={node_root}/fsx/checkpoints/{job_id}",
    ]


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
        "-m", "torch.distributed.run", "--nnodes", "2", "--nproc-per-node", "8", "--rdzv-backend", "c10d",
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


def test_failed_job_records_its_exit_code(node_factory):
    node = node_factory("exit", exit_code=3)
    node.start("j-fail-1", check=False)  # may already see the failure: it exits at once
    final = node.wait_state("j-fail-1", "failed")
    assert final["exitCode"] == 3 and final["endedAt"] is not None
    status = node.cli("status", "--job-id", "j-fail-1")
    assert json.loads(status.stdout)["state"] == "failed"
    log = node.log("j-fail-1")
    assert "[rank0]: something went wrong" in log and "exit code 3" in log


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


# --- attempts: the job keeper restarts a job under the same id -------------------------------------------


def test_a_later_attempt_restarts_an_ended_job_keeping_its_status_and_log(node_factory):
    node = node_factory("exit", exit_code=3)
    first = json.loads(node.start("j-again-1", check=False).stdout)  # may already see the failure
    assert first.get("attempt", 1) == 1
    node.wait_state("j-again-1", "failed")
    job_dir = node.root / "var/lib/cluster/jobs/j-again-1"
    (job_dir / "stop-request.json").write_text(json.dumps({"by": "node health monitor", "reason": "xid 79"}))
    status = json.loads(node.cli("status", "--job-id", "j-again-1").stdout)
    assert (status["attempt"], status["state"], status["resumedFromStep"], status["lastStep"]) == (1, "failed", 0, 20)

    # attempt 2 (a surviving node of the job the keeper restarts): it resumes from step 20
    node.write_env("until-sigterm", resume_step=20)
    started = json.loads(node.start("j-again-1", "--attempt", "2").stdout)
    assert (started["attempt"], started["state"]) == (2, "running")
    assert started["previousStatusPath"] == str(job_dir / "status.attempt-1.json")
    wait_until(lambda: "ready" in node.log("j-again-1"), what="attempt 2 ready")

    kept = json.loads((job_dir / "status.attempt-1.json").read_text())
    assert (kept["attempt"], kept["state"], kept["exitCode"]) == (1, "failed", 3)
    assert (kept["lastStep"], kept["resumedFromStep"]) == (20, 0)  # what attempt 1 logged, kept with it
    # the monitor's reason for stopping attempt 1 does not become attempt 2's
    assert not (job_dir / "stop-request.json").exists()
    assert json.loads((job_dir / "stop-request.attempt-1.json").read_text())["reason"] == "xid 79"

    # one log, appended: attempt 1's lines, then the line where attempt 2 begins, then attempt 2's
    log = node.log("j-again-1")
    assert log.index("attempt 1 starts on") < log.index("something went wrong") < log.index(
        "exit code 3") < log.index("attempt 2 starts on") < log.index('"step": 40')
    # the same job: its checkpoint directory and rendezvous id
    record = json.loads(node.record.read_text())
    assert record["argv"] == expected_argv(node.root, "j-again-1")
    assert json.loads((job_dir / "job.json").read_text())["attempt"] == 2

    status = json.loads(node.cli("status", "--job-id", "j-again-1").stdout)
    assert (status["attempt"], status["state"], status["resumedFromStep"], status["lastStep"]) == (
        2, "running", 20, 40)
    # the supervisor recorded the resume line as it passed (for when it has left the log's tail)
    assert node.status_file("j-again-1")["resumedFromStep"] == 20

    # while attempt 2 runs, no start is taken: neither a repeated delivery nor a later attempt
    for attempt in ("2", "3"):
        refused = node.start("j-again-1", "--attempt", attempt, check=False)
        assert refused.returncode == jobs.EXIT_FAILED
        assert json.loads(refused.stdout)["error"] == (
            f"job j-again-1 already exists on this node ({job_dir}): attempt 2 is running; cancel it before "
            f"starting attempt {attempt}")
    assert not (job_dir / "status.attempt-2.json").exists()

    # cancelled (the keeper stops a job's survivors before it restarts it), then attempt 3
    assert json.loads(node.cli("cancel", "--job-id", "j-again-1").stdout)["state"] == "cancelled"
    for attempt in ("1", "2"):
        repeated = node.start("j-again-1", "--attempt", attempt, check=False)
        assert repeated.returncode == jobs.EXIT_FAILED
        assert json.loads(repeated.stdout)["error"].endswith(
            f"attempt 2 is cancelled, and attempt {attempt} is not later (a repeated start); allowed: an attempt "
            "greater than 2")
    node.write_env("exit", exit_code=0, resume_step=45)
    node.start("j-again-1", "--attempt", "3", check=False)
    final = node.wait_state("j-again-1", "succeeded", attempt=3)
    assert final["exitCode"] == 0
    kept2 = json.loads((job_dir / "status.attempt-2.json").read_text())
    assert (kept2["attempt"], kept2["state"], kept2["lastStep"], kept2["resumedFromStep"]) == (2, "cancelled", 45, 20)
    status = json.loads(node.cli("status", "--job-id", "j-again-1").stdout)
    assert (status["attempt"], status["resumedFromStep"], status["lastStep"]) == (3, 45, 65)
    assert node.log("j-again-1").count(" starts on ") == 3


def test_a_job_new_to_the_node_starts_at_the_attempt_it_is_given(node_factory):
    # a replacement node joins the job at attempt 4: nothing of the earlier attempts is on it
    node = node_factory("exit", exit_code=0)
    node.start("j-new-4", "--attempt", "4", check=False)
    final = node.wait_state("j-new-4", "succeeded", attempt=4)
    assert final["attempt"] == 4
    assert list((node.root / "var/lib/cluster/jobs/j-new-4").glob("status.attempt-*")) == []
    assert node.log("j-new-4").startswith("[node_bootstrap.jobs] ")
    assert " attempt 4 starts on " in node.log("j-new-4").splitlines()[0]


def test_two_deliveries_of_one_restart_start_it_once(node_factory):
    node = node_factory("exit", exit_code=1)
    node.start("j-twice-1", check=False)
    node.wait_state("j-twice-1", "failed")
    node.write_env("until-sigterm", resume_step=10)
    argv = [sys.executable, "-m", "node_bootstrap.jobs", "--root", str(node.root), "start", "--job-id",
            "j-twice-1", "--config", "training/configs/tiny-cpu.toml", "--nodes", "2", "--gpus-per-node", "8",
            "--rendezvous-host", "10.0.1.17", "--attempt", "2"]
    both = [subprocess.Popen(argv, cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True)
            for _ in range(2)]
    results = sorted((p.wait(timeout=90), p.communicate()[0]) for p in both)
    try:
        assert [rc for rc, _ in results] == [0, jobs.EXIT_FAILED]  # one started it, the other found it running
        assert "attempt 2 is running" in json.loads(results[1][1])["error"]
        assert node.log("j-twice-1").count("attempt 2 starts on") == 1
    finally:  # the fixture stops the supervisor status.json names; should both have started, stop both
        for _, out in results:
            pid = json.loads(out).get("supervisorPid")
            for victim in (jobs.descendants(pid) + [pid]) if pid_alive(pid) else []:
                os.kill(victim, signal.SIGKILL)


def test_a_later_attempt_is_refused_while_the_previous_ones_torchrun_outlives_its_supervisor(node_factory):
    node = node_factory("exit")
    job_dir = node.root / "var/lib/cluster/jobs/j-orphan-1"
    job_dir.mkdir(parents=True)
    gone = subprocess.Popen(["true"])
    gone.wait()
    # what a SIGKILLed supervisor leaves with the direct launcher: torchrun (its argv names the job) runs on
    torchrun = subprocess.Popen([sys.executable, "-c", "import time; time.sleep(60)", "--rdzv-id", "j-orphan-1"])
    try:
        (job_dir / "status.json").write_text(json.dumps(
            {"jobId": "j-orphan-1", "state": "running", "exitCode": None, "pid": torchrun.pid,
             "supervisorPid": gone.pid}))
        refused = node.start("j-orphan-1", "--attempt", "2", check=False)
        assert refused.returncode == jobs.EXIT_FAILED
        assert json.loads(refused.stdout)["error"].endswith(
            f"attempt 1 is failed, but its torchrun (pid {torchrun.pid}) still runs without its supervisor; stop "
            "it before starting the next attempt")
    finally:
        torchrun.kill()
        torchrun.wait()
    assert not (job_dir / "status.attempt-1.json").exists()

    (job_dir / "status.json").unlink()  # a start whose supervisor never recorded anything
    refused = node.start("j-orphan-1", "--attempt", "2", check=False)
    assert refused.returncode == jobs.EXIT_FAILED
    assert "without a recorded status: its start never recorded one" in json.loads(refused.stdout)["error"]


@pytest.mark.parametrize("value", ["0", "1001", "two", "-1", "01", " 2", ""])
def test_start_rejects_an_attempt_outside_1_to_1000(node_factory, value):
    node = node_factory("exit")
    result = node.start("j-att-1", f"--attempt={value}", check=False)
    assert result.returncode == jobs.EXIT_USAGE
    assert json.loads(result.stdout)["error"] == f"attempt={value!r}: allowed: an integer 1-1000"
    assert not (node.root / "var/lib/cluster/jobs").exists()


def test_attempt_validation_for_direct_callers():
    spec = jobs.JobSpec(job_id="j-att-2", config="training/configs/tiny-cpu.toml", nodes=1, gpus_per_node=8,
                        rendezvous_host="10.0.0.1", max_restarts=0, attempt=1001)
    with pytest.raises(jobs.JobError, match=r"^attempt=1001: allowed: an integer 1-1000$"):
        spec.validate()
    assert jobs.parse_attempt("1000") == 1000 and jobs.ATTEMPT_RE.fullmatch("999")


def test_start_help_describes_attempts():
    result = subprocess.run([sys.executable, "-m", "node_bootstrap.jobs", "start", "--help"], cwd=REPO,
                            capture_output=True, text=True, timeout=60)
    text = " ".join(result.stdout.split())
    assert "--attempt N the job's attempt, an integer 1-1000: 1 (default) for its first start" in text
    assert "the previous attempt's status is kept as status.attempt-<K>.json, the job log is appended to" in text


# Two attempts in one log, as the supervisor writes them, with a torchrun-prefixed resume line in each.
TWO_ATTEMPTS_LOG = """\
[node_bootstrap.jobs] 2026-11-20T23:15:04Z attempt 1 starts on ip-10-42-1-4: -m torch.distributed.run
ip-10-42-1-4:48211:48327 [0] NCCL INFO Using network Libfabric
[rank0]:{"event": "resume", "step": 0, "path": null}
{"event": "step", "step": 10, "loss": 2.0}
{"event": "step", "step": 20, "loss": 1.5}
[node_bootstrap.jobs] 2026-11-20T23:45:00Z exit code 1
[node_bootstrap.jobs] 2026-11-20T23:52:11Z attempt 2 starts on ip-10-42-1-4: -m torch.distributed.run
"""
ATTEMPT_2_LINES = """\
[rank0]:{"event": "resume", "step": 20, "path": "/fsx/checkpoints/j-1/step-20"}
{"event": "step", "step": 21, "loss": 1.49}
"""


def test_status_falls_back_to_the_recorded_resume_point_when_the_log_tail_has_none(node_factory):
    node = node_factory("exit")
    job_dir = node.root / "var/lib/cluster/jobs/j-long-1"
    job_dir.mkdir(parents=True)
    (job_dir / "status.json").write_text(json.dumps(
        {"jobId": "j-long-1", "attempt": 2, "resumedFromStep": 1200, "state": "succeeded", "exitCode": 0,
         "pid": 1, "supervisorPid": 1}))
    (node.root / "var/log/cluster/jobs").mkdir(parents=True)
    (node.root / "var/log/cluster/jobs/j-long-1.log").write_text(
        "[node_bootstrap.jobs] 2026-11-21T01:00:00Z attempt 2 starts on ip-10-42-1-4: x\n"
        + "".join(f'{{"event": "step", "step": {s}, "loss": 1.0}}\n' for s in range(1210, 1300, 10)))
    status = json.loads(node.cli("status", "--job-id", "j-long-1").stdout)
    assert (status["attempt"], status["resumedFromStep"], status["lastStep"]) == (2, 1200, 1290)


def test_status_reads_only_the_current_attempts_part_of_the_log(tmp_path):
    def read(text, attempt, head_bytes=jobs.LOG_HEAD_BYTES, tail_bytes=jobs.LOG_TAIL_BYTES):
        log = tmp_path / "job.log"
        log.write_text(text)
        ends = jobs.read_log_ends(str(log), head_bytes, tail_bytes)
        head, tail = jobs.attempt_part(ends.head, ends.tail, attempt)
        step = jobs.find_last_step(tail)
        return (jobs.find_resumed_from_step(tail), step["step"] if step else None,
                jobs.find_nccl_network(jobs.LogEnds(head, tail)).network)

    # attempt 2 has begun but not logged yet: nothing of attempt 1 is reported as attempt 2's
    assert read(TWO_ATTEMPTS_LOG, 2) == (None, None, None)
    assert read(TWO_ATTEMPTS_LOG + ATTEMPT_2_LINES, 2) == (20, 21, None)
    # status.json still says attempt 1 (attempt 2's supervisor has not recorded yet): attempt 1's answers
    assert read(TWO_ATTEMPTS_LOG.split("[node_bootstrap.jobs] 2026-11-20T23:52")[0], 1) == (0, 20, "Libfabric")
    # a status for attempt 1 while the log's newest marker is attempt 2's: attempt 1 logged nothing after it
    assert read(TWO_ATTEMPTS_LOG + ATTEMPT_2_LINES, 1) == (None, None, None)
    # a log from before attempts existed ("start on", no marker): all of it is the one attempt's
    assert read('[node_bootstrap.jobs] 2026-11-20T23:15:04Z start on ip-10-42-1-4: x\n' + ATTEMPT_2_LINES, 1) == (
        20, 21, None)
    # the marker is anchored at a line start: a worker's line that quotes it is no boundary
    assert read(ATTEMPT_2_LINES + "[rank0]:[node_bootstrap.jobs] t attempt 9 starts on x: y\n", 1)[:2] == (20, 21)

    # attempt 2 logged more than the tail holds: the tail is all attempt 2's; the head (attempt 1's
    # start, 2's marker out of sight) is not
    filler = "".join(f'{{"event": "step", "step": {20 + i}, "loss": 1.0}}\n' for i in range(1, 200))
    big = TWO_ATTEMPTS_LOG + ATTEMPT_2_LINES + filler
    assert read(big, 2, head_bytes=256, tail_bytes=2048) == (None, 219, None)
    # and a head whose newest marker is the current attempt's counts from that marker on
    one = TWO_ATTEMPTS_LOG.split("[node_bootstrap.jobs] 2026-11-20T23:45")[0] + filler
    assert read(one, 1, head_bytes=400, tail_bytes=2048) == (None, 219, "Libfabric")


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
        "--property=NoNewPrivileges=yes", f"--setenv=PYTHONPATH={REPO}",
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


def test_last_step_reads_prefixed_lines_and_ignores_noise(tmp_path):
    log = tmp_path / "job.log"
    log.write_text(textwrap.dedent("""\
        [rank0]: {"event": "step", "step": 7, "loss": 2.5}
        {"event": "checkpoint", "step": 7}
        [rank0]: {"event": "step", "step": 8, "loss": 2.25, "tokens_per_s": 1000}
        Traceback (most recent call last): not json {"step"
        """))
    assert jobs.last_step(str(log)) == {"event": "step", "step": 8, "loss": 2.25, "tokens_per_s": 1000}
    assert jobs.last_step(str(tmp_path / "missing.log")) is None


def test_exit_code_of_signal():
    assert jobs.exit_code_of(-signal.SIGKILL) == (137, "SIGKILL")
    assert jobs.exit_code_of(2) == (2, None)


# NCCL lines as NCCL and aws-ofi-nccl print them at NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT. Each line follows
# a format string read in the sources (hosts, pids and versions are made up):
# - NVIDIA/nccl src/debug.cc: INFO lines are "<host>:<pid>:<tid> [<cudaDev>] NCCL INFO <msg>", WARN lines
#   "\n<host>:<pid>:<tid> [<cudaDev>] <file>:<line> NCCL WARN <msg>", an optional "[%F %T] " timestamp first.
# - src/init.cc: "Using network %s"; src/plugin/net.cc: "Initialized NET plugin %s", "Assigned NET plugin %s
#   to comm", "Failed to initialize NET plugin %s".
# - aws/aws-ofi-nccl src/nccl_ofi_net.cpp, every message prefixed "NET/OFI ": "Initializing " PACKAGE_STRING,
#   "Using Libfabric version %u.%u", "Plugin selected platform: %s", "Using transport protocol %s (platform
#   set)", "Selected provider is %s, fabric is %s (found %d nics)" (older: "Selected Provider is %s (found %d
#   nics)"); its plugin is named "Libfabric" ("AWS Libfabric" up to 1.11.0).
NCCL_EFA_LOG = """\
[node_bootstrap.jobs] 2026-11-20T23:15:04Z start on ip-10-42-1-4: -m torch.distributed.run --nnodes 2
NCCL version 2.27.5+cuda12.9
ip-10-42-1-4:48211:48327 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.16.0
ip-10-42-1-4:48211:48327 [0] NCCL INFO NET/OFI Using Libfabric version 2.1
ip-10-42-1-4:48211:48327 [0] NCCL INFO NET/OFI Plugin selected platform: AWS
ip-10-42-1-4:48211:48327 [0] NCCL INFO NET/OFI Using transport protocol RDMA (platform set)
ip-10-42-1-4:48211:48327 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa-direct (found 32 nics)
ip-10-42-1-4:48211:48327 [0] NCCL INFO Initialized NET plugin Libfabric
ip-10-42-1-4:48211:48327 [0] NCCL INFO Assigned NET plugin Libfabric to comm
ip-10-42-1-4:48211:48327 [0] NCCL INFO Using network Libfabric
ip-10-42-1-4:48214:48330 [3] NCCL INFO Using network Libfabric
[rank0]: {"event": "step", "step": 10, "loss": 2.0}
"""

# aws-ofi-nccl <= 1.11.0 under torchrun's "[rankN]:" line prefix.
NCCL_OLD_PLUGIN_LOG = """\
[rank0]:ip-10-42-1-5:9021:9140 [0] NCCL INFO NET/OFI Selected Provider is efa (found 32 nics)
[rank0]:ip-10-42-1-5:9021:9140 [0] NCCL INFO Using network AWS Libfabric
"""

# The plugin failed on this node (after picking its provider), IB found no device: NCCL fell back to TCP.
NCCL_SOCKET_LOG = """\
ip-10-42-1-6:7311:7402 [0] NCCL INFO NET/OFI Initializing aws-ofi-nccl 1.16.0
ip-10-42-1-6:7311:7402 [0] NCCL INFO NET/OFI Selected provider is efa, fabric is efa (found 32 nics)

[2026-11-20 23:15:09] ip-10-42-1-6:7311:7402 [0] nccl_net_ofi_init:1415 NCCL WARN NET/OFI aws-ofi-nccl \
initialization failed
ip-10-42-1-6:7311:7402 [0] NCCL INFO Failed to initialize NET plugin Libfabric
ip-10-42-1-6:7311:7402 [0] NCCL INFO NET/IB : No device found.
ip-10-42-1-6:7311:7402 [0] NCCL INFO Failed to initialize NET plugin IB
ip-10-42-1-6:7311:7402 [0] NCCL INFO Initialized NET plugin Socket
ip-10-42-1-6:7311:7402 [0] NCCL INFO Assigned NET plugin Socket to comm
ip-10-42-1-6:7311:7402 [0] NCCL INFO Using network Socket
"""

# A recorded line from an InfiniBand/RoCE cluster (huggingface.co yuccaaa/ProtT3_model, log/nccl_debug.log).
NCCL_IB_LINE = "dsw-251511-c5cfcb8-lwcpt:167975:169648 [5] NCCL INFO Using network IB\n"


def nccl_of(text):
    return jobs.find_nccl_network(jobs.LogEnds("", text))


@pytest.mark.parametrize(
    ("log", "expected"),
    [
        (NCCL_EFA_LOG, ("Libfabric", "efa")),
        (NCCL_OLD_PLUGIN_LOG, ("Libfabric", "efa")),  # "AWS Libfabric" is the same plugin
        (NCCL_SOCKET_LOG, ("Socket", None)),  # the failed plugin's provider is not reported
        (NCCL_IB_LINE, ("IB", None)),
        ("[rank0]: {\"event\": \"step\", \"step\": 1, \"loss\": 9.0}\n", (None, None)),  # no communicator yet
    ],
)
def test_nccl_network_from_the_lines_nccl_prints(log, expected):
    assert nccl_of(log) == expected


def test_nccl_network_is_the_newest_and_ignores_a_line_being_written():
    # torchrun restarted the workers (--max-restarts) and NCCL chose again: the newest line counts.
    assert nccl_of(NCCL_EFA_LOG + NCCL_SOCKET_LOG) == ("Socket", None)
    assert nccl_of(NCCL_SOCKET_LOG + NCCL_EFA_LOG) == ("Libfabric", "efa")
    # A line still being written (no newline yet) is not read as a network named "Lib".
    assert nccl_of("ip-10-42-1-4:48211:48327 [0] NCCL INFO Using network Lib") == (None, None)


def test_log_ends_are_bounded_and_the_tail_wins(tmp_path):
    log = tmp_path / "job.log"
    filler = "".join(f'[rank0]: {{"event": "step", "step": {i}, "loss": 1.0}}\n' for i in range(200))
    assert len(filler) > 4096
    log.write_text(NCCL_EFA_LOG + filler + NCCL_SOCKET_LOG.replace("Using network Socket", "Using network X")
                   + filler + NCCL_SOCKET_LOG + filler)
    ends = jobs.read_log_ends(str(log), head_bytes=2048, tail_bytes=4096)
    assert len(ends.head) == 2048 and len(ends.tail) == 4096
    assert jobs.find_nccl_network(ends) == ("Libfabric", "efa")  # the Socket line is in neither end
    assert jobs.find_last_step(ends.tail)["step"] == 199

    log.write_text(NCCL_EFA_LOG + filler + NCCL_SOCKET_LOG)  # the restart's line reached the tail
    assert jobs.find_nccl_network(jobs.read_log_ends(str(log), 2048, 4096)) == ("Socket", None)
    # A log that fits is read whole, once.
    small = jobs.read_log_ends(str(log), head_bytes=len(filler), tail_bytes=len(filler))
    assert small.head == "" and small.tail == log.read_text()
    assert jobs.read_log_ends(str(tmp_path / "missing.log")) is None


def test_status_reports_the_network_nccl_chose(node_factory):
    node = node_factory("exit")
    for job_id, log, network, provider in (("j-efa-1", NCCL_EFA_LOG, "Libfabric", "efa"),
                                           ("j-tcp-1", NCCL_SOCKET_LOG, "Socket", None)):
        job_dir = node.root / "var/lib/cluster/jobs" / job_id
        job_dir.mkdir(parents=True)
        (job_dir / "status.json").write_text(json.dumps(
            {"jobId": job_id, "state": "succeeded", "exitCode": 0, "startedAt": "2026-11-20T23:15:02Z",
             "endedAt": "2026-11-20T23:45:02Z", "pid": 1, "supervisorPid": 1}))
        (node.root / "var/log/cluster/jobs").mkdir(parents=True, exist_ok=True)
        (node.root / "var/log/cluster/jobs" / f"{job_id}.log").write_text(log)
        out = json.loads(node.cli("status", "--job-id", job_id).stdout)
        assert (out["ncclNetwork"], out["ncclProvider"]) == (network, provider)


# --- the job user -----------------------------------------------------------------------------------------


def test_start_records_the_job_user_and_gives_it_the_checkpoint_dir_and_log(node_factory):
    node = node_factory("exit", exit_code=0)
    node.start("j-user-1")
    spec = json.loads((node.root / "var/lib/cluster/jobs/j-user-1/job.json").read_text())
    assert spec["user"] == {"name": "cluster-job", "uid": os.getuid(), "gid": os.getgid(), "groups": [44],
                            "home": "/var/lib/cluster-job"}
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
        assert (who["home"], who["user"]) == ("/var/lib/cluster-job", "cluster-job")
        # its own checkpoint directory, yes; the state root reads and acts on, or the system, no
        assert (who["checkpoints"], who["job_dir"], who["etc"]) == (True, False, False)
        assert (root / "fsx/checkpoints/j-drop-1").stat().st_uid == 65534
        assert (job_dir / "status.json").stat().st_uid == 0
    finally:
        shutil.rmtree(base)
