"""The training step: the job environment file and the bundle on the DLAMI interpreter's sys.path."""

from __future__ import annotations

import subprocess

import pytest

from node_bootstrap.errors import StepError
from node_bootstrap.plan import execute_plan
from node_bootstrap.training_env import build_training_env, plan_training, render_env_file


def run_training(node, config, *, dry_run=False):
    host = node.host(dry_run=dry_run)
    node.runner.dry_run = dry_run
    plan = plan_training(config, host, node.runner)
    execute_plan(plan, node.runner, dry_run=dry_run)
    return plan, host


def test_env_file_holds_efa_nccl_paths_and_instance_type(config):
    env = build_training_env(config)
    assert env["FI_PROVIDER"] == "efa"
    assert env["FI_EFA_USE_DEVICE_RDMA"] == "1"
    assert env["NCCL_SOCKET_IFNAME"] == "^lo,docker,veth"
    # The job log names the network NCCL chose ("NCCL INFO Using network ..."), which job status reads.
    assert env["NCCL_DEBUG"] == "INFO" and env["NCCL_DEBUG_SUBSYS"] == "INIT"
    assert env["PYTHONPATH"] == "/opt/cluster/bundle"
    assert env["CLUSTER_INSTANCE_TYPE"] == "p5.48xlarge"
    assert env["CHECKPOINT_ROOT"] == "/fsx/checkpoints" and env["DATA_ROOT"] == "/fsx/data"
    assert not {"NCCL_PROTO", "NCCL_BUFFSIZE", "RDMAV_FORK_SAFE"} & set(env)  # see training_env's docstring
    # a dead peer or a stuck NCCL watchdog ends the rank (docs/operations.md, "When a node fails")
    assert (env["TORCH_NCCL_ASYNC_ERROR_HANDLING"], env["TORCH_NCCL_ENABLE_MONITORING"],
            env["TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC"]) == ("3", "1", "180")


def test_env_file_is_read_the_same_by_bash(config, tmp_path):
    env = build_training_env(config)
    env["DATA_ROOT"] = "/fsx/my data"  # a value that needs quoting
    path = tmp_path / "training.env"
    path.write_text(render_env_file(env))
    script = f"set -a; . {path}; set +a; env"
    exported = dict(line.split("=", 1) for line in
                    subprocess.run(["bash", "-c", script], capture_output=True, text=True, check=True)
                    .stdout.splitlines() if "=" in line)
    for key, value in env.items():
        assert exported[key] == value


def test_values_that_cannot_be_quoted_are_refused(config):
    env = build_training_env(config)
    env["DATA_ROOT"] = "/fsx/it's"
    with pytest.raises(StepError, match="quotes and newlines are not allowed"):
        render_env_file(env)


def test_first_run_writes_env_and_pth_and_verifies_the_import(fake_node, config, kit):
    plan, host = run_training(fake_node, config)
    pth = f"{kit.SITE_PACKAGES}/cluster-bundle.pth"
    assert host.changes == ["write /etc/cluster/training.env", f"write {pth}"]
    assert (fake_node.root / pth.lstrip("/")).read_text() == "/opt/cluster/bundle\n"
    env_text = (fake_node.root / "etc/cluster/training.env").read_text()
    assert "\nFI_PROVIDER=efa\n" in env_text and "\nCLUSTER_INSTANCE_TYPE=p5.48xlarge\n" in env_text
    assert "\nNCCL_DEBUG=INFO\nNCCL_DEBUG_SUBSYS=INIT\n" in env_text
    python = fake_node.path("/opt/pytorch/bin/python")
    assert fake_node.runner.commands()[-1] == f"{python} -c 'import training'"
    assert fake_node.runner.mutating_calls == []  # file writes only, through the Host


def test_second_run_changes_nothing(fake_node, config):
    run_training(fake_node, config)
    plan, host = run_training(fake_node, config)
    assert plan.actions == [] and host.changes == []


def test_an_import_that_fails_after_install_is_an_error(fake_node, config):
    fake_node.runner.handlers["python"] = lambda argv: (
        (0, "/opt/pytorch/lib/python3.12/site-packages\n") if "sysconfig" in argv[2]
        else (1, "", "ImportError: libcudart.so.12: cannot open shared object file"))
    with pytest.raises(StepError, match="does not import in /opt/pytorch/bin/python: .*libcudart"):
        run_training(fake_node, config)


def test_missing_bundle_or_interpreter_is_named(fake_node, config):
    (fake_node.root / "opt/pytorch/bin/python").unlink()
    with pytest.raises(StepError, match="training.python=/opt/pytorch/bin/python does not exist"):
        run_training(fake_node, config)
    (fake_node.root / "opt/cluster/bundle/training/__init__.py").unlink()
    with pytest.raises(StepError, match="the bundle at /opt/cluster/bundle has no training package"):
        run_training(fake_node, config)
