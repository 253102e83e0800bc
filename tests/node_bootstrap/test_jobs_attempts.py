"""Attempts: the job keeper restarts a job under the same id (`start --attempt N`). A later attempt keeps the
previous one's status aside and appends to the one log; a repeated or concurrent start is refused; status
reads only the current attempt's part of the log."""

import json
import os
import signal
import subprocess
import sys

import pytest
from node_jobs_support import REPO, expected_argv, pid_alive, wait_until

from node_bootstrap import jobs

pytestmark = pytest.mark.waits  # mostly sleeps on real timeouts: run beside the slow files (conftest.py)


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
        {"jobId": "j-long-1", "attempt": 2, "resumedFromStep": 1200, "resumedFromTier": "local",
         "compileCache": "snapshot", "state": "succeeded", "exitCode": 0,
         "pid": 1, "supervisorPid": 1}))
    (node.root / "var/log/cluster/jobs").mkdir(parents=True)
    (node.root / "var/log/cluster/jobs/j-long-1.log").write_text(
        "[node_bootstrap.jobs] 2026-11-21T01:00:00Z attempt 2 starts on ip-10-42-1-4: x\n"
        + "".join(f'{{"event": "step", "step": {s}, "loss": 1.0}}\n' for s in range(1210, 1300, 10)))
    status = json.loads(node.cli("status", "--job-id", "j-long-1").stdout)
    assert (status["attempt"], status["resumedFromStep"], status["lastStep"]) == (2, 1200, 1290)
    assert (status["resumedFromTier"], status["compileCache"]) == ("local", "snapshot")


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
