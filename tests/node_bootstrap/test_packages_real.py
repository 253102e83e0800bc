"""The packages step against a real interpreter and real pip (issue 22's acceptance): a fake node whose "DLAMI
PyTorch" (/opt/pytorch, a virtual environment) has torch but not torchao. After the step the jobs' interpreter
imports the lock's torchao, the health gate's FP8 probe passes (on the CPU), the CPU trainer runs with
fp8.backend=torchao (emulate) through the jobs launcher, and a second boot changes nothing.

The "AMI" environment sees this suite's own site-packages through a directory of links without torchao, so
torch is this machine's (no second copy) and torchao can only come from the bundle's wheelhouse.
"""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from pathlib import Path

import pytest
from local_cluster import free_port_block
from node_fake_firewall import install_system_python
from node_fakes import node_config_dict
from node_jobs_support import write_user_database

from cluster_constructs.bundle import stage_bundle
from node_bootstrap.config import ExpectedHardware, parse_node_config
from node_bootstrap.errors import StepError
from node_bootstrap.fp8_check import Fp8Probe, check_fp8
from node_bootstrap.host import Host
from node_bootstrap.package_lock import normalize
from node_bootstrap.packages import plan_packages
from node_bootstrap.plan import execute_plan
from node_bootstrap.runner import Runner
from node_bootstrap.training_env import plan_training

pytestmark = pytest.mark.slow
REPO = Path(__file__).resolve().parents[2]
JOB = "j-20261125-001500-fp8a"


@pytest.fixture(scope="module")
def site_without_torchao(tmp_path_factory) -> Path:
    """This interpreter's site-packages, entry by entry, except torchao."""
    import torch

    site = Path(torch.__file__).resolve().parents[1]
    view = tmp_path_factory.mktemp("site-without-torchao")
    for entry in site.iterdir():
        if not normalize(entry.name).startswith("torchao"):
            (view / entry.name).symlink_to(entry)
    return view


@pytest.fixture
def node(tmp_path, site_without_torchao):
    root = tmp_path / "root"
    ami = root / "opt/pytorch"
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(ami)], check=True, timeout=120)
    purelib = subprocess.run([str(ami / "bin/python"), "-c", "import sysconfig; print(sysconfig.get_paths()"
                              "['purelib'])"], capture_output=True, text=True, check=True).stdout.strip()
    Path(purelib, "ami-torch.pth").write_text(f"{site_without_torchao}\n")
    stage_bundle(root / "opt/cluster/bundle")  # what user-data unpacks: the code and the lock's wheels
    data = node_config_dict(**{"expected.gpuCount": 1, "training.rendezvousPort": free_port_block()})
    (root / "etc/cluster").mkdir(parents=True)
    (root / "etc/cluster/node-config.json").write_text(json.dumps(data))
    write_user_database(root)
    install_system_python(root)  # the probe at start: the firewall holds the metadata block
    return root, parse_node_config(data)


def ami_python(root: Path, code: str) -> subprocess.CompletedProcess:
    return subprocess.run([str(root / "opt/pytorch/bin/python"), "-c", code], capture_output=True, text=True,
                          timeout=120)


def boot_packages(root: Path, config):
    host, runner = Host(str(root)), Runner()
    plan = plan_packages(config, host, runner)
    execute_plan(plan, runner, dry_run=False, print_fn=lambda line: None)
    return plan, host


def test_the_lock_installs_imports_proves_fp8_and_trains(node):
    root, config = node
    # torchao alone: a module that is not there fails before any import of torch (seconds); that the AMI's torch
    # imports is shown below, after the step
    before = ami_python(root, "import torchao")
    assert before.returncode != 0 and "No module named 'torchao'" in before.stderr

    started = time.monotonic()
    boot_packages(root, config)
    seconds = time.monotonic() - started
    [key] = os.listdir(root / "opt/cluster/python-packages")
    after = ami_python(root, "import json, torch, torchao.float8; print(json.dumps([torchao.__version__, "
                             "torchao.__file__, torch.__file__]))")
    assert after.returncode == 0, after.stderr
    version, torchao_file, torch_file = json.loads(after.stdout.splitlines()[-1])
    assert version == "0.18.0"
    assert torchao_file.startswith(str(root / "opt/cluster/python-packages" / key) + "/")
    assert not torch_file.startswith(str(root))  # the AMI's torch, not a copy from the lock
    print(f"packages step: {seconds:.1f} s")

    plan, host = boot_packages(root, config)  # the second boot
    assert plan.actions == [] and host.changes == []

    probe = Fp8Probe.for_node(config, Host(str(root)))
    check = check_fp8(ExpectedHardware(1, 80, 32, 8, True, True), Fp8Probe(probe.python, probe.script,
                                                                            probe.backends, "cpu"), Runner())
    assert check.status == "ok", check.detail
    assert check.detail.startswith("torchao 0.18.0 imports with torch ")

    # the training step's env file, then a job through the launcher, as `clusterctl submit` starts one
    execute_plan(plan_training(config, Host(str(root)), Runner()), Runner(), dry_run=False, print_fn=print)
    start = subprocess.run(
        [sys.executable, "-m", "node_bootstrap.jobs", "--root", str(root), "start", "--job-id", JOB,
         "--config", "training/configs/tiny-cpu.toml", "--nodes", "1", "--gpus-per-node", "1",
         "--rendezvous-host", "127.0.0.1", "--max-restarts", "0", "--launcher", "direct",
         "--overrides", "fp8.backend=torchao fp8.emulate=true run.steps=4 run.log_interval_steps=1"],
        cwd=REPO, capture_output=True, text=True, timeout=60)
    assert start.returncode == 0, start.stdout + start.stderr
    _wait_for_end(root)
    log = (root / "var/log/cluster/jobs" / f"{JOB}.log").read_text()
    status = json.loads(subprocess.run(
        [sys.executable, "-m", "node_bootstrap.jobs", "--root", str(root), "status", "--job-id", JOB],
        cwd=REPO, capture_output=True, text=True, timeout=60, check=True).stdout)
    assert (status["state"], status["exitCode"], status["lastStep"]) == ("succeeded", 0, 4), log[-3000:]
    assert "fp8: torchao 0.18.0 (tensorwise, emulate; " in log


def test_a_torch_outside_the_lock_and_a_changed_wheel_fail_the_step(node):
    root, config = node
    lock = root / "opt/cluster/bundle/training/node-requirements.txt"
    text = lock.read_text()
    lock.write_text(text.replace("# fits-torch: >=2.11,<2.14", "# fits-torch: >=2.14"))
    with pytest.raises(StepError, match=r"^torch 2\.13\.0\S* in /opt/pytorch/bin/python does not fit the lock "):
        boot_packages(root, config)
    lock.write_text(text)
    [wheel] = (root / "opt/cluster/bundle/wheelhouse").glob("torchao-*.whl")
    wheel.write_bytes(wheel.read_bytes()[:-1])  # truncated in transit
    with pytest.raises(StepError, match=r"^torchao==0\.18\.0: hash mismatch: "):
        boot_packages(root, config)
    assert not (root / "opt/cluster/python-packages").exists()
    assert ami_python(root, "import torchao").returncode != 0


def _wait_for_end(root: Path, timeout_s: float = 240.0) -> dict:
    path = root / "var/lib/cluster/jobs" / JOB / "status.json"
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        status = json.loads(path.read_text()) if path.exists() else {}
        if status.get("state") not in (None, "running"):
            return status
        time.sleep(0.2)
    raise AssertionError(f"{JOB} did not end within {timeout_s} s: {status}")
