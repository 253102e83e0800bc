"""A fake node for node_bootstrap/jobs/ run for real: a fake root with the node config the stack renders
(its golden file), the training env file, the job user, and a stand-in for the DLAMI python (so the real
torchrun argv reaches a script that records it). The `node_factory` fixture (tests/node_bootstrap/
conftest.py) makes these nodes and stops whatever they left running."""

import json
import os
import subprocess
import sys
import time
from pathlib import Path

from node_fake_firewall import install_system_python

from node_bootstrap import jobs

REPO = Path(__file__).resolve().parents[1]
GOLDEN_NODE_CONFIG = Path(__file__).parent / "cluster_constructs" / "golden" / "node-config.json"
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
if mode == "peer-stop":  # another node's stop: the trainer saved and stopped, then torchrun's teardown failed
    print("[rank1]:2026-11-27 07:43:51,318 [rank 1] WARNING training: stopped by SIGTERM after step 20 "
          "(checkpoint saved)", flush=True)
    sys.exit(int(os.environ["FAKE_EXIT_CODE"]))
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
        install_system_python(root)  # the probe at start: the firewall holds the metadata block
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


def expected_argv(node_root: Path, job_id: str):
    return [
        "-m", "training.torchrun", "--exit-barrier-seconds", "30",
        "--nnodes", "2", "--nproc-per-node", "8", "--rdzv-backend", "c10d",
        "--rdzv-endpoint", "10.0.1.17:29400", "--rdzv-id", job_id, "--max-restarts", "2",
        "--shutdown-timeout", "110", "-m", "training", "--config", "training/configs/tiny-cpu.toml", "--resume", "auto",
        "--set", "optim.lr=3e-4", "--set", "train.steps=100",
        "--set", f"checkpoint.local_dir={node_root}/scratch/checkpoints/{job_id}",
        "--set", f"checkpoint.dir={node_root}/fsx/checkpoints/{job_id}",
    ]
