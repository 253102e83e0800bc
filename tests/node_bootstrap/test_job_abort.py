"""`cancel --mode abort`, the job keeper's stop of an ended attempt's survivors: the real torchrun
(torch.distributed.run) under the real supervisor (direct launcher), with a stand-in trainer that is blocked in a
syscall the way a rank is blocked inside a collective whose peer hangs (its SIGTERM handler only sets a flag, as
training/faults.py does, and the step boundary that would read it never comes).

A save-mode cancel would wait for torchrun's --shutdown-timeout (the stop grace less 10 s) and then SIGKILL; the
abort kills torchrun and the worker at once, and the supervisor records the end within the abort's bound."""

import json
import os
import socket
import subprocess
import sys
from pathlib import Path

from node_fake_firewall import install_system_python
from node_jobs_support import pid_alive, wait_until

REPO = Path(__file__).resolve().parents[2]
GOLDEN_NODE_CONFIG = Path(__file__).parents[1] / "cluster_constructs" / "golden" / "node-config.json"
JOB = "j-20261127-040102-ab0b"
ABORT_BOUND_S = 30  # cancel's --timeout-seconds: generous for a loaded 2-core machine, far below the save path's

# What `-m training` runs: SIGTERM sets a flag for a step boundary that a rank blocked in a collective never
# reaches; the "collective" is a read from a pipe nobody writes (PEP 475: the read resumes after the handler).
BLOCKED_TRAINER = """\
import os, signal

def on_sigterm(signum, frame):
    print("SIGTERM: a checkpoint at the next step boundary", flush=True)

signal.signal(signal.SIGTERM, on_sigterm)
with open(os.environ["FAKE_PID_FILE"], "w") as f:
    f.write(str(os.getpid()))
print("blocked in a collective", flush=True)
r, w = os.pipe()
os.read(r, 1)
print("checkpoint saved", flush=True)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def make_node(tmp_path: Path) -> tuple[Path, Path]:
    """A node root whose `-m training` is BLOCKED_TRAINER; returns the root and where the worker writes its pid."""
    root = tmp_path / "node"
    config = json.loads(GOLDEN_NODE_CONFIG.read_text())
    config["training"]["rendezvousPort"] = free_port()
    (root / "etc/cluster").mkdir(parents=True)
    (root / "etc/cluster/node-config.json").write_text(json.dumps(config))
    pid_file = tmp_path / "worker.pid"
    (root / "etc/cluster/training.env").write_text(f"FAKE_PID_FILE={pid_file}\n")
    trainer = root / "opt/cluster/bundle/training"  # the job's cwd, first on its PYTHONPATH
    trainer.mkdir(parents=True)
    (trainer / "__init__.py").write_text("")
    (trainer / "__main__.py").write_text(BLOCKED_TRAINER)
    (trainer / "torchrun.py").write_text((REPO / "training/torchrun.py").read_text())  # the real torchrun wrapper
    (root / "etc/passwd").write_text(f"cluster-job:x:{os.getuid()}:{os.getgid()}::/var/lib/cluster-job:/bin/false\n")
    (root / "etc/group").write_text(f"cluster-job:x:{os.getgid()}:\n")
    python = root / "opt/pytorch/bin/python"
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    install_system_python(root)  # the probe at start: the firewall holds the metadata block
    return root, pid_file


def test_an_abort_kills_a_rank_blocked_in_a_collective_within_its_bound_and_saves_nothing(tmp_path):
    root, pid_file = make_node(tmp_path)

    def cli(*args):
        return subprocess.run([sys.executable, "-m", "node_bootstrap.jobs", "--root", str(root), *args],
                              cwd=REPO, capture_output=True, text=True, timeout=120)

    # the production stop grace (120 s): a save-mode stop of this trainer would take torchrun's 110 s
    started = cli("start", "--job-id", JOB, "--config", "training/configs/tiny-cpu.toml", "--nodes", "1",
                  "--gpus-per-node", "1", "--rendezvous-host", "127.0.0.1", "--max-restarts", "0",
                  "--launcher", "direct")
    assert started.returncode == 0, started.stdout + started.stderr
    log = root / "var/log/cluster/jobs" / f"{JOB}.log"
    wait_until(lambda: "blocked in a collective" in log.read_text(), 90, "torchrun to start the trainer")
    worker = int(pid_file.read_text())
    running = json.loads((root / "var/lib/cluster/jobs" / JOB / "status.json").read_text())
    torchrun, supervisor = running["pid"], running["supervisorPid"]

    aborted = cli("cancel", "--job-id", JOB, "--mode", "abort", "--timeout-seconds", str(ABORT_BOUND_S))
    assert aborted.returncode == 0, aborted.stdout + aborted.stderr
    status = json.loads(aborted.stdout)
    # the supervisor recorded the end inside the bound: cancel's own SIGKILL after it was not needed
    assert status["cancel"] == "aborted: SIGKILL at once", status
    assert (status["state"], status["stopMode"], status["signal"]) == ("cancelled", "abort", "SIGKILL"), status
    assert status["stopRequest"]["mode"] == "abort" and status["error"].startswith(
        "aborted without a checkpoint by the cancel --mode abort: ")
    # the supervisor writes the end before it exits, and a SIGKILLed process is reaped a moment after the
    # signal: gone within seconds, not at the instant cancel returns
    processes = {"worker": worker, "torchrun": torchrun, "supervisor": supervisor}
    wait_until(lambda: not [name for name, pid in processes.items() if pid_alive(pid)], 10,
               "the worker, torchrun and the supervisor to be gone")
    assert "checkpoint saved" not in log.read_text()

