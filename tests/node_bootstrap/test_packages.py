"""The packages step on the fake node: the training lock installed from the bundle's wheels, once per lock and
torch, with every way it can fail named (a real interpreter and pip: test_packages_real.py)."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from node_bootstrap.errors import StepError
from node_bootstrap.packages import MARKER_NAME, PTH_FILE_NAME, plan_packages
from node_bootstrap.plan import execute_plan

SITE = "/opt/pytorch/lib/python3.12/site-packages"
LOCK = "/opt/cluster/bundle/training/node-requirements.txt"
WHEELHOUSE = "/opt/cluster/bundle/wheelhouse"
PACKAGES = "/opt/cluster/python-packages"


def run_packages(node, config, *, dry_run=False):
    host = node.host(dry_run=dry_run)
    node.runner.dry_run = dry_run
    plan = plan_packages(config, host, node.runner)
    execute_plan(plan, node.runner, dry_run=dry_run, print_fn=lambda line: None)
    return plan, host


def environments(node) -> list[str]:
    root = Path(node.path(PACKAGES))
    return sorted(p.name for p in root.iterdir()) if root.exists() else []


def test_first_boot_installs_the_lock_and_puts_it_first_on_the_path(fake_node, config):
    plan, host = run_packages(fake_node, config)
    [key] = environments(fake_node)
    target = Path(fake_node.path(f"{PACKAGES}/{key}"))
    assert len(key) == 16 and (target / "torchao/__init__.py").exists()
    marker = json.loads((target / MARKER_NAME).read_text())
    assert marker["packages"] == {"torchao": "0.18.0", "safetensors": "0.8.0"} and marker["torch"] == "2.13.0+cu130"
    assert sorted(marker["wheels"]) == ["safetensors-0.8.0-cp310-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
                                        "torchao-0.18.0-cp310-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl"]
    pth = Path(fake_node.path(f"{SITE}/{PTH_FILE_NAME}")).read_text()
    # ahead of the AMI's site-packages, so a torchao the AMI ships cannot shadow the lock's
    assert pth.startswith("import sys; sys.path.insert(") and repr(str(target)) in pth
    pip = [c for c in fake_node.runner.commands(mutating=True) if " -m pip install " in c]
    assert len(pip) == 1 and "--no-index --no-deps --require-hashes" in pip[0]
    assert f"--target {target}.partial" in pip[0] and f"--find-links {fake_node.path(WHEELHOUSE)}" in pip[0]
    assert host.changes[-2:] == [f"rename {PACKAGES}/{key}.partial -> {PACKAGES}/{key}",
                                 f"write {SITE}/{PTH_FILE_NAME}"]
    assert any("torch 2.13.0+cu130" in note and "torchao==0.18.0" in note for note in plan.notes)


def test_a_second_boot_changes_nothing(fake_node, config):
    run_packages(fake_node, config)
    plan, host = run_packages(fake_node, config)
    assert plan.actions == [] and host.changes == []
    assert fake_node.ami_python.pip_installs == 1


def test_dry_run_installs_nothing(fake_node, config):
    plan, host = run_packages(fake_node, config, dry_run=True)
    assert [a.summary.split()[0] for a in plan.actions] == ["install", "put"]
    assert environments(fake_node) == [] and fake_node.ami_python.pip_installs == 0


def test_a_new_torch_gets_its_own_environment_and_the_old_one_goes(fake_node, config):
    run_packages(fake_node, config)
    [old] = environments(fake_node)
    fake_node.ami_python.torch_version = "2.13.1+cu130"  # a later deploy resolved a newer DLAMI
    plan, _ = run_packages(fake_node, config)
    [new] = environments(fake_node)
    assert new != old and fake_node.ami_python.pip_installs == 2
    assert plan.actions[-1].summary == f"remove earlier environments from {PACKAGES}: {old}"
    assert repr(fake_node.path(f"{PACKAGES}/{new}")) in Path(fake_node.path(f"{SITE}/{PTH_FILE_NAME}")).read_text()


def test_a_torch_the_lock_does_not_fit_is_refused(fake_node, config):
    fake_node.ami_python.torch_version = "2.14.0+cu130"
    with pytest.raises(StepError) as err:
        run_packages(fake_node, config)
    assert str(err.value) == (
        f"torch 2.14.0+cu130 in /opt/pytorch/bin/python does not fit the lock {LOCK} (fits-torch: >=2.11,<2.14): "
        "update the lock for this AMI (docs/node-bootstrap.md, 'Changing the training lock')")
    assert environments(fake_node) == []


def test_a_missing_wheel_is_named(fake_node, config):
    for wheel in Path(fake_node.path(WHEELHOUSE)).iterdir():
        wheel.unlink()
    with pytest.raises(StepError, match=r"^torchao==0\.18\.0: no wheel in /opt/cluster/bundle/wheelhouse: the "
                                        r"bundle was built without it \(run `make setup` before `cdk deploy`\)$"):
        run_packages(fake_node, config)


def test_a_wheel_with_another_hash_is_refused_before_pip_runs(fake_node, config):
    [wheel] = Path(fake_node.path(WHEELHOUSE)).glob("torchao-*.whl")
    wheel.unlink()
    wheel.write_bytes(b"not the wheel the lock pins")
    with pytest.raises(StepError, match=r"^torchao==0\.18\.0: hash mismatch: torchao-0\.18\.0-cp310-abi3-.*\.whl "
                                        r"has sha256 [0-9a-f]{64}; the lock allows 6540b148"):
        run_packages(fake_node, config)
    assert fake_node.ami_python.pip_installs == 0 and environments(fake_node) == []


def test_a_pip_failure_leaves_no_environment_behind(fake_node, config):
    fake_node.ami_python.pip_error = (
        "ERROR: torchao-0.18.0-cp310-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl is not a supported "
        "wheel on this platform.\n")
    with pytest.raises(StepError) as err:
        run_packages(fake_node, config)
    assert str(err.value) == (
        f"pip could not install the lock {LOCK}: ERROR: torchao-0.18.0-cp310-abi3-manylinux_2_24_x86_64."
        "manylinux_2_28_x86_64.whl is not a supported wheel on this platform.")
    assert environments(fake_node) == []  # not even the .partial
    assert not Path(fake_node.path(f"{SITE}/{PTH_FILE_NAME}")).exists()


def test_a_torch_that_does_not_import_is_named(fake_node, config):
    fake_node.ami_python.torch_error = "ImportError: libcudart.so.13: cannot open shared object file"
    with pytest.raises(StepError, match="^torch does not import in /opt/pytorch/bin/python: ImportError: libcudart"):
        run_packages(fake_node, config)


def test_a_lock_that_cannot_be_read_fails_with_its_line(fake_node, config):
    lock = Path(fake_node.path(LOCK))
    lock.write_text(lock.read_text().replace("torchao==0.18.0", "torchao>=0.18"))
    with pytest.raises(StepError, match=r"training/node-requirements\.txt line 12: 'torchao>=0\.18': allowed: "
                                        r"name==version with --hash options"):
        run_packages(fake_node, config)


def test_a_crash_mid_install_is_redone_at_the_next_boot(fake_node, config):
    run_packages(fake_node, config)
    [key] = environments(fake_node)
    # as if the node lost power between pip and the rename: a .partial and no final directory
    Path(fake_node.path(f"{PACKAGES}/{key}")).rename(fake_node.path(f"{PACKAGES}/{key}.partial"))
    plan, _ = run_packages(fake_node, config)
    assert environments(fake_node) == [key] and fake_node.ami_python.pip_installs == 2
