"""node_bootstrap runs on the nodes' system Python, 3.9 on Amazon Linux 2023: compile and run it with 3.9."""

from __future__ import annotations

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).parents[2]
PYTHON39 = "/root/.pyenv/versions/3.9.18/bin/python3.9"

pytestmark = pytest.mark.skipif(not os.path.exists(PYTHON39), reason=f"{PYTHON39} is not installed here")


def run39(*args, cwd=REPO):
    return subprocess.run([PYTHON39, *args], cwd=cwd, capture_output=True, text=True, timeout=120,
                          env={"PATH": "/usr/bin:/bin", "PYTHONDONTWRITEBYTECODE": "1"})


def test_every_module_byte_compiles_with_python39(tmp_path):
    modules = sorted(str(p) for p in (REPO / "node_bootstrap").glob("*.py"))
    script = ("import os, py_compile, sys\n"
              "for path in sys.argv[2:]:\n"
              "    py_compile.compile(path, doraise=True, cfile=os.path.join(sys.argv[1], 'm.pyc'))\n")
    result = run39("-c", script, str(tmp_path), *modules)
    assert result.returncode == 0, result.stderr
    assert len(modules) >= 15


def test_help_runs_under_python39():
    result = run39("-m", "node_bootstrap", "--help")
    assert result.returncode == 0, result.stderr
    assert "usage: python3 -m node_bootstrap" in result.stdout


def test_check_runs_under_python39_on_a_machine_without_gpu_tools(tmp_path, kit):
    """The real runner on this GPU-less box: every check fails with a reason and the JSON says so."""
    (tmp_path / "etc/cluster").mkdir(parents=True)
    (tmp_path / "etc/cluster/node-config.json").write_text(json.dumps(kit.node_config_dict()))
    result = run39("-m", "node_bootstrap", "check", "--json", "--root", str(tmp_path))
    assert result.returncode == 1, result.stderr
    report = json.loads(result.stdout)
    failed = {c["name"] for c in report["checks"] if c["status"] == "fail"}
    assert {"gpu-count", "efa"} <= failed and report["healthy"] is False


def test_run_dry_run_under_python39_prints_a_plan(tmp_path, kit):
    (tmp_path / "etc/cluster").mkdir(parents=True)
    (tmp_path / "etc/cluster/node-config.json").write_text(json.dumps(kit.node_config_dict()))
    result = run39("-m", "node_bootstrap", "run", "--dry-run", "--only", "training", "--root", str(tmp_path))
    # No bundle under this fake root: the training step stops with a clear reason, and nothing is written.
    assert result.returncode == 1
    assert "the bundle at /opt/cluster/bundle has no training package" in result.stdout
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["cluster", "etc", "node-config.json"]


def test_a_timed_out_command_is_killed_and_abandoned_under_python39():
    """Python 3.9's subprocess is what the nodes run: the bounded kill must hold there, not just here."""
    script = (
        "import time\n"
        "from node_bootstrap.runner import Runner\n"
        "from node_bootstrap.xid import classify_xid\n"
        "start = time.monotonic()\n"
        "r = Runner(kill_grace_s=1).run(['sh', '-c', 'echo started; setsid sleep 20 & sleep 20'],\n"
        "                                mutating=False, check=False, timeout=0.5)\n"
        "print(r.returncode, repr(r.stdout), round(time.monotonic() - start) < 8)\n"
        "print(classify_xid(154, 'GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)'))\n"
    )
    result = run39("-c", script)
    assert result.returncode == 0, result.stderr
    first, second = result.stdout.splitlines()
    assert first == "124 'started\\n' True"
    assert "action='reset'" in second
