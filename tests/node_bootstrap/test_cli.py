"""`python3 -m node_bootstrap run|check` end to end on a fake P5 node, through cli.main and its seams."""

from __future__ import annotations

import json
from pathlib import Path

from node_bootstrap.cli import main


def run_main(node, kit, *args, sleeps=None):
    def make_runner(dry_run):
        node.runner.dry_run = dry_run
        return node.runner
    argv = [args[0], "--root", str(node.root), *args[1:]]
    return main(argv, make_runner=make_runner, imds=kit.FakeImds(),
                sleep=(sleeps if sleeps is not None else []).append)


def test_run_brings_a_fresh_node_to_ready_and_logs_every_step(fake_node, kit, capsys):
    assert run_main(fake_node, kit, "run") == 0
    assert fake_node.tags == {"cluster:bootstrap": "ready"}
    assert fake_node.health_status == "Healthy"
    log = (fake_node.root / "var/log/cluster/bootstrap.log").read_text()
    for step in ("logging", "scratch", "lustre", "packages", "health", "jobuser", "imdsblock", "training",
                 "monitor", "signal"):
        assert f"INFO == {step}\n" in log
    # the job user's traffic to the metadata service is rejected, and the block is set again at every boot
    assert [rules["OUTPUT"][0] for rules in fake_node.firewall.chains.values()] == ["-j CLUSTER-IMDS-BLOCK"] * 2
    assert "cluster-imds-block.service" in fake_node.enabled_units
    assert "bootstrap complete: node is ready" in log
    assert "bootstrap complete: node is ready" in capsys.readouterr().out  # and on stdout for cloud-init
    fstab = fake_node.fstab()
    assert " /scratch xfs defaults,noatime,nofail 0 0" in fstab and " /fsx lustre " in fstab
    # jobs run as cluster-job, created by the jobuser step, which keeps the scratch and the user's home root's
    # (each job gets its own directories in the scratch at its start)
    assert "cluster-job:x:998:998:" in (fake_node.root / "etc/passwd").read_text()
    assert fake_node.stat_of("/scratch")[1:] == fake_node.stat_of("/var/lib/cluster-job")[1:] == (0, 0)


def test_running_twice_issues_no_mutating_command_the_second_time(fake_node, kit):
    assert run_main(fake_node, kit, "run") == 0
    fake_node.runner.calls.clear()
    assert run_main(fake_node, kit, "run") == 0
    assert fake_node.runner.mutating_calls == []
    assert fake_node.agent_config_loads == 1


def test_a_failed_health_gate_tags_failed_marks_unhealthy_and_exits_3(fake_node, kit):
    fake_node.kernel_log = "journal-kernel-xid.txt"
    assert run_main(fake_node, kit, "run") == 3
    assert fake_node.tags["cluster:bootstrap"] == "failed"
    assert fake_node.tags["cluster:bootstrap-reason"] == (
        "health: health gate failed: xid: node unusable: "
        "Xid 79 on 0000:b9:00: GPU has fallen off the bus (no longer reachable over PCIe) (NVIDIA: RESTART_BM) "
        "(read: journalctl -k -b 0)")
    assert fake_node.health_status == "Unhealthy"
    log = (fake_node.root / "var/log/cluster/bootstrap.log").read_text()
    assert "ERROR bootstrap failed in step health: health gate failed" in log
    # user_data.sh reads this marker to not signal a second time, even if this process could not exit.
    marker = (fake_node.root / "var/lib/cluster/bootstrap-signalled").read_text()
    assert marker.startswith("health: health gate failed: xid: node unusable: Xid 79")
    assert not (fake_node.root / "etc/cluster/training.env").exists()  # later steps did not run


def test_a_step_error_is_signalled_with_its_step_and_reason(fake_node, kit):
    fake_node.lustre_mount_failures = 99
    assert run_main(fake_node, kit, "run") == 3
    reason = fake_node.tags["cluster:bootstrap-reason"]
    assert reason.startswith("lustre: mounting FSx for Lustre failed 5 times")


def test_a_lock_the_node_cannot_satisfy_fails_it_with_the_package_and_the_reason(fake_node, kit):
    [wheel] = (fake_node.root / "opt/cluster/bundle/wheelhouse").glob("torchao-*.whl")
    wheel.unlink()
    assert run_main(fake_node, kit, "run") == 3
    assert fake_node.tags["cluster:bootstrap"] == "failed" and fake_node.health_status == "Unhealthy"
    assert fake_node.tags["cluster:bootstrap-reason"] == (
        "packages: torchao==0.18.0: no wheel in /opt/cluster/bundle/wheelhouse: the bundle was built without it "
        "(run `make setup` before `cdk deploy`)")
    assert not (fake_node.root / "opt/cluster/python-packages").exists()  # nothing half-installed for jobs


def test_an_unexpected_bug_still_fails_visibly(fake_node, kit):
    fake_node.runner.handlers["nvidia-smi"] = lambda argv: 1 / 0
    assert run_main(fake_node, kit, "run") == 3
    reason = fake_node.tags["cluster:bootstrap-reason"]
    assert reason == "health: unexpected ZeroDivisionError: division by zero"
    assert "Traceback" in (fake_node.root / "var/log/cluster/bootstrap.log").read_text()


def test_skip_signal_leaves_tags_alone_and_exits_1_on_failure(fake_node, kit):
    fake_node.fi_info_txt = "fi_info-efa-rdm.31-devices.txt"
    assert run_main(fake_node, kit, "run", "--skip", "signal") == 1
    assert fake_node.tags == {} and fake_node.health_status == "Healthy"
    assert not any(c.startswith("aws") for c in fake_node.runner.commands())


def test_only_runs_the_named_steps(fake_node, kit):
    assert run_main(fake_node, kit, "run", "--only", "training", "--only", "logging") == 0
    tools = {c.argv[0].rsplit("/", 1)[-1] for c in fake_node.runner.calls}
    assert tools == {"amazon-cloudwatch-agent-ctl", "systemctl", "python"}
    assert (fake_node.root / "etc/cluster/training.env").exists()


def test_dry_run_prints_the_plan_and_changes_nothing(fake_node, kit, capsys):
    assert run_main(fake_node, kit, "run", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "[scratch] would create RAID0 /dev/md/cluster-scratch across 8 instance-store devices" in out
    assert "[lustre] would mount" in out and "[training] would write /etc/cluster/training.env" in out
    assert "[signal] would tag i-0a1b2c3d4e5f60718 cluster:bootstrap=ready" in out
    assert fake_node.runner.mutating_calls == []
    assert fake_node.tags == {} and fake_node.arrays == {}
    assert not (fake_node.root / "var/log/cluster").exists()
    assert not (fake_node.root / "etc/cluster/training.env").exists()


def test_dry_run_of_a_failing_node_says_what_it_would_signal(fake_node, kit, capsys):
    fake_node.gpu_csv = "nvidia-smi-query-gpu.seven-gpus.csv"
    assert run_main(fake_node, kit, "run", "--dry-run") == 1
    assert "would tag the instance cluster:bootstrap=failed" in capsys.readouterr().out
    assert fake_node.tags == {}


def test_check_prints_a_table_and_exits_0_when_healthy(fake_node, kit, capsys):
    assert run_main(fake_node, kit, "check") == 0
    out = capsys.readouterr().out
    assert out.splitlines()[0].split() == ["CHECK", "STATUS", "DETAIL"]
    assert "p5.48xlarge: HEALTHY" in out
    assert fake_node.runner.mutating_calls == []


def test_check_json_exits_1_when_unhealthy(fake_node, kit, capsys):
    fake_node.gpu_csv = "nvidia-smi-query-gpu.ecc-error.csv"
    assert run_main(fake_node, kit, "check", "--json") == 1
    report = json.loads(capsys.readouterr().out)
    assert report["healthy"] is False
    assert [c["name"] for c in report["checks"] if c["status"] == "fail"] == ["gpu-ecc"]


def test_check_dry_run_lists_its_probes(fake_node, kit, capsys):
    assert run_main(fake_node, kit, "check", "--dry-run") == 0
    out = capsys.readouterr().out
    assert "$ nvidia-smi --query-gpu=index,name,pci.bus_id,memory.total," in out
    assert "$ /usr/bin/fi_info -p efa -t FI_EP_RDM" in out
    assert fake_node.runner.calls == []


def test_config_errors_exit_2_with_the_key(fake_node, kit, capsys):
    config = json.loads((fake_node.root / "etc/cluster/node-config.json").read_text())
    del config["expected"]["efaInterfaceCount"]
    (fake_node.root / "etc/cluster/node-config.json").write_text(json.dumps(config))
    assert run_main(fake_node, kit, "check") == 2
    assert "missing key expected.efaInterfaceCount" in capsys.readouterr().err
    assert run_main(fake_node, kit, "run", "--config", "/etc/cluster/nope.json") == 2


def test_usage_errors_exit_2(fake_node, kit, capsys):
    assert main(["run", "--only", "nonsense"]) == 2
    assert "invalid choice: 'nonsense'" in capsys.readouterr().err
    assert run_main(fake_node, kit, "run", "--only", "health", "--skip", "health") == 2
    assert main(["--help"]) == 0


def test_relative_config_is_taken_from_the_working_directory(tmp_path, monkeypatch, capsys):
    # A user verifying a node by hand: `python3 -m node_bootstrap check --dry-run --config my-config.json`
    golden = json.loads((Path(__file__).parents[1] / "cluster_constructs/golden/node-config.json").read_text())
    (tmp_path / "my-config.json").write_text(json.dumps(golden))
    monkeypatch.chdir(tmp_path)
    assert main(["check", "--dry-run", "--config", "my-config.json"]) == 0
    assert "fi_info -p efa" in capsys.readouterr().out


def test_relative_config_with_a_root_is_a_usage_error(tmp_path, capsys):
    assert main(["check", "--root", str(tmp_path), "--config", "my-config.json"]) == 2
    assert "--config='my-config.json': with --root it must be an absolute path" in capsys.readouterr().err
