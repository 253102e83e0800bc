"""A SIGTERM checkpoint gets the job's stop grace, not torchrun's default 30 s: the real torchrun
(torch.distributed.run) under the real supervisor (direct launcher), with a stand-in trainer whose save after
SIGTERM takes longer than torchrun's default and less than the time the launcher gives it.

The constants are injected to keep the test short: torchrun's default comes from TORCH_ELASTIC_SHUTDOWN_TIMEOUT
when no --shutdown-timeout is given (torch/distributed/launcher/api.py), so the test sets it to 2 s as the
"default", gives the job a stop grace of 20 s (torchrun --shutdown-timeout 10), and the trainer needs 4 s."""

import json
import os
import socket
import subprocess
import sys
import time
from pathlib import Path

import pytest
from node_fake_firewall import install_system_python

from node_bootstrap import jobs

pytestmark = pytest.mark.waits  # mostly sleeps on real timeouts: run beside the slow files (conftest.py)

REPO = Path(__file__).resolve().parents[2]
GOLDEN_NODE_CONFIG = Path(__file__).parents[1] / "cluster_constructs" / "golden" / "node-config.json"
JOB = "j-20261120-231502-5a7e"
SAVE_SECONDS = 4.0  # the stand-in's checkpoint after SIGTERM
DEFAULT_EQUIVALENT_SECONDS = 2  # torchrun's default (30 s on a node) as this test sets it
STOP_GRACE_SECONDS = 20  # the job's: torchrun gets --shutdown-timeout 10

# What `-m training` runs here: a trainer whose checkpoint after SIGTERM takes SAVE_SECONDS.
STAND_IN_TRAINER = """\
import os, signal, sys, time

def on_sigterm(signum, frame):
    print("SIGTERM: saving a checkpoint", flush=True)
    time.sleep(float(os.environ["FAKE_SAVE_SECONDS"]))
    with open(os.environ["FAKE_SAVE_MARKER"], "w") as f:
        f.write("saved")
    print("checkpoint saved", flush=True)
    sys.exit(0)

signal.signal(signal.SIGTERM, on_sigterm)
print("trainer ready", flush=True)
while True:
    time.sleep(0.05)
"""


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


def wait_until(predicate, timeout_s, what):
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if predicate():
            return
        time.sleep(0.1)
    raise AssertionError(f"timed out after {timeout_s} s waiting for {what}")


def test_a_sigterm_save_slower_than_torchruns_default_is_not_killed(tmp_path):
    root = tmp_path / "node"
    config = json.loads(GOLDEN_NODE_CONFIG.read_text())
    config["training"]["rendezvousPort"] = free_port()
    (root / "etc/cluster").mkdir(parents=True)
    (root / "etc/cluster/node-config.json").write_text(json.dumps(config))
    marker = tmp_path / "saved"
    (root / "etc/cluster/training.env").write_text(
        f"FAKE_SAVE_SECONDS={SAVE_SECONDS}\nFAKE_SAVE_MARKER={marker}\n")
    trainer = root / "opt/cluster/bundle/training"  # the job's cwd, first on its PYTHONPATH
    trainer.mkdir(parents=True)
    (trainer / "__init__.py").write_text("")
    (trainer / "__main__.py").write_text(STAND_IN_TRAINER)
    (trainer / "torchrun.py").write_text((REPO / "training/torchrun.py").read_text())  # the real torchrun wrapper
    (root / "etc/passwd").write_text(
            f"cluster-job:x:{os.getuid()}:{os.getgid()}::/var/lib/cluster-job:/bin/false\n")
    (root / "etc/group").write_text(f"cluster-job:x:{os.getgid()}:\n")
    python = root / "opt/pytorch/bin/python"  # the DLAMI's interpreter: here the one with torch
    python.parent.mkdir(parents=True)
    python.write_text(f'#!/bin/sh\nexec {sys.executable} "$@"\n')
    python.chmod(0o755)
    install_system_python(root)  # the probe at start: the firewall holds the metadata block
    env = {**os.environ, "TORCH_ELASTIC_SHUTDOWN_TIMEOUT": str(DEFAULT_EQUIVALENT_SECONDS)}

    def cli(*args):
        return subprocess.run(
            [sys.executable, "-m", "node_bootstrap.jobs", "--root", str(root), *args],
            cwd=REPO, capture_output=True, text=True, timeout=120, env=env)

    started = cli("start", "--job-id", JOB, "--config", "training/configs/tiny-cpu.toml", "--nodes", "1",
                  "--gpus-per-node", "1", "--rendezvous-host", "127.0.0.1", "--max-restarts", "0",
                  "--stop-grace-seconds", str(STOP_GRACE_SECONDS), "--launcher", "direct")
    assert started.returncode == 0, started.stdout + started.stderr
    log = root / "var/log/cluster/jobs" / f"{JOB}.log"
    wait_until(lambda: "trainer ready" in log.read_text(), 90, "torchrun to start the trainer")

    cancelled = cli("cancel", "--job-id", JOB, "--timeout-seconds", "60")
    assert cancelled.returncode == 0, cancelled.stdout + cancelled.stderr
    text = log.read_text()
    assert marker.exists(), text  # the save finished: torchrun waited for it, past its "default"
    assert "checkpoint saved" in text and "forcefully exiting" not in text
    status = json.loads(cancelled.stdout)
    assert status["state"] == "cancelled" and status["cancel"] == "stopped by SIGTERM"
    spec = json.loads((root / "var/lib/cluster/jobs" / JOB / "job.json").read_text())
    assert spec["stopGraceSeconds"] == STOP_GRACE_SECONDS
    assert spec["argv"][spec["argv"].index("--shutdown-timeout") + 1] == str(
        STOP_GRACE_SECONDS - jobs.TORCHRUN_EXIT_SECONDS)


def test_the_production_grace_gives_torchrun_more_than_its_default():
    spec = jobs.JobSpec(job_id=JOB, config="training/configs/tiny-cpu.toml", nodes=2, gpus_per_node=8,
                        rendezvous_host="10.0.0.1", max_restarts=0)
    settings = jobs.JobSettings(root="/", python="/opt/pytorch/bin/python", bundle_dir="/b", env_file="/e",
                                jobs_dir="/j", job_log_dir="/l", checkpoint_root="/fsx/checkpoints",
                                rendezvous_port=29400, log_group_name="g")
    argv = jobs.build_torchrun_argv(settings, spec)
    timeout = int(argv[argv.index("--shutdown-timeout") + 1])
    assert timeout == jobs.STOP_GRACE_SECONDS - jobs.TORCHRUN_EXIT_SECONDS == 110
    assert 30 < timeout < jobs.STOP_GRACE_SECONDS  # past torchrun's default, inside systemd's TimeoutStopSec
