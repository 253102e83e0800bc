"""Step imdsblock and the check imds-block: the job user cannot reach the instance metadata service.

Three levels: the boot plan on the fake P5 node (iptables and the probe answered by node_fake_firewall.py); the
real probe, run as an unprivileged uid, against a real TCP server on 127.0.0.1 standing in for IMDS; the real
rules checked by iptables-restore and, in a network namespace of their own, applied by the real step and
proven against the real kernel.
"""

from __future__ import annotations

import json
import os
import shutil
import socket
import subprocess
import sys
from pathlib import Path

import pytest

from node_bootstrap.accounts import JOB_USER, read_account
from node_bootstrap.bootstrap import STEPS
from node_bootstrap.cli import main
from node_bootstrap.errors import StepError
from node_bootstrap.fp8_check import Fp8Probe
from node_bootstrap.health import FAIL, OK, HealthGateFailed, plan_health
from node_bootstrap.imds_block import (
    CHAIN,
    FAMILIES,
    SERVICE,
    MetadataProbe,
    check_metadata_blocked,
    plan_imds_block,
    render_restore,
)
from node_bootstrap.job_user import plan_job_user
from node_bootstrap.plan import execute_plan
from node_bootstrap.runner import Runner

REPO = Path(__file__).resolve().parents[2]
PROBE_SCRIPT = str(REPO / "node_bootstrap" / "metadata_probe.py")
IPV4_RULE = (f"-A {CHAIN} -d 169.254.169.254/32 -m owner --uid-owner 998 -j REJECT "
             "--reject-with icmp-port-unreachable")
IPV6_RULE = (f"-A {CHAIN} -d fd00:ec2::254/128 -m owner --uid-owner 998 -j REJECT "
             "--reject-with icmp6-port-unreachable")


def with_job_user(node, config):
    """The fake node after step jobuser: cluster-job is uid 998."""
    Path(node.path("/scratch")).mkdir(exist_ok=True)
    execute_plan(plan_job_user(config, node.host(), node.runner), node.runner, dry_run=False)
    node.runner.calls.clear()
    return node


def run_step(node, config, *, dry_run=False, printed=None):
    print_fn = printed.append if printed is not None else print
    node.runner.dry_run = dry_run
    plan = plan_imds_block(config, node.host(dry_run=dry_run, print_fn=print_fn), node.runner)
    execute_plan(plan, node.runner, dry_run=dry_run, print_fn=print_fn)
    return plan


# ----- the boot plan on the fake node -----------------------------------------------------------------------------


def test_the_step_runs_after_jobuser_and_before_training():
    assert STEPS.index("jobuser") < STEPS.index("imdsblock") < STEPS.index("training") < STEPS.index("signal")


def test_the_plan_rejects_the_job_users_metadata_traffic_then_does_nothing(fake_node, config):
    node = with_job_user(fake_node, config)
    run_step(node, config)
    assert node.runner.commands(mutating=True) == [
        "iptables-restore -w --noflush", "ip6tables-restore -w --noflush",
        "systemctl daemon-reload", f"systemctl enable {SERVICE}"]
    assert node.firewall.restores == [
        ("iptables", f"*filter\n:{CHAIN} - [0:0]\n{IPV4_RULE}\n-I OUTPUT 1 -j {CHAIN}\nCOMMIT\n"),
        ("ip6tables", f"*filter\n:{CHAIN} - [0:0]\n{IPV6_RULE}\n-I OUTPUT 1 -j {CHAIN}\nCOMMIT\n")]
    unit = (node.root / f"etc/systemd/system/{SERVICE}").read_text()
    assert ("ExecStart=/usr/bin/python3 -m node_bootstrap run --only imdsblock "
            "--config /etc/cluster/node-config.json") in unit
    # after the network is up (the verification tells the block's REJECT from no route), before the SSM agent
    assert "After=network-online.target iptables.service" in unit and "Wants=network-online.target" in unit
    assert "Before=amazon-ssm-agent.service snap.amazon-ssm-agent.amazon-ssm-agent.service" in unit
    assert "Environment=PYTHONPATH=/opt/cluster/bundle" in unit
    assert SERVICE in node.enabled_units
    # the step verified its work: the probe ran as cluster-job against both metadata addresses
    assert node.runner.commands(mutating=False)[-1] == (
        f"/usr/bin/python3 -I {node.root}/opt/cluster/bundle/node_bootstrap/metadata_probe.py "
        "--uid 998 --gid 998 --timeout-s 2 169.254.169.254:80 '[fd00:ec2::254]:80'")

    node.runner.calls.clear()
    second = run_step(node, config)
    assert second.actions == [] and node.runner.mutating_calls == []
    assert second.notes == ["iptables: cluster-job's traffic to 169.254.169.254/32 is already rejected",
                            "ip6tables: cluster-job's traffic to fd00:ec2::254/128 is already rejected"]


def test_a_rule_put_above_the_jump_is_overtaken_again(fake_node, config):
    node = with_job_user(fake_node, config)
    run_step(node, config)
    node.firewall.chains["iptables"]["OUTPUT"].insert(0, "-d 169.254.169.254/32 -j ACCEPT")  # e.g. an agent's
    node.runner.calls.clear()
    run_step(node, config)
    assert node.firewall.restores[-1] == (
        "iptables", f"*filter\n:{CHAIN} - [0:0]\n{IPV4_RULE}\n-D OUTPUT -j {CHAIN}\n-I OUTPUT 1 -j {CHAIN}\nCOMMIT\n")
    assert node.firewall.chains["iptables"]["OUTPUT"] == [f"-j {CHAIN}", "-d 169.254.169.254/32 -j ACCEPT"]
    assert node.runner.commands(mutating=True) == ["iptables-restore -w --noflush"]


def test_a_block_that_does_not_hold_fails_the_step_naming_the_user_and_address(fake_node, config):
    node = with_job_user(fake_node, config)
    node.firewall.ignore_restores = True  # the tool says yes, the kernel has nothing
    with pytest.raises(StepError) as err:
        run_step(node, config)
    assert str(err.value) == (
        "cluster-job (uid 998) can open a connection to the instance metadata service at 169.254.169.254:80, "
        "[fd00:ec2::254]:80: jobs could take the node role's credentials (step imdsblock blocks it)")


def test_missing_iptables_fails_the_step_with_the_package_to_install(fake_node, config):
    node = with_job_user(fake_node, config)
    node.runner.on_path.discard("ip6tables-restore")
    with pytest.raises(StepError, match=r"^ip6tables-restore not found: the metadata block for cluster-job needs "
                                        r"it \(Amazon Linux 2023: dnf install iptables-nft; Ubuntu: apt-get "):
        run_step(node, config)
    assert node.runner.mutating_calls == []  # refused while planning


def test_without_the_job_user_the_step_refuses_and_a_dry_run_names_it(fake_node, config):
    with pytest.raises(StepError, match="the user cluster-job does not exist: step jobuser creates it"):
        run_step(fake_node, config)
    printed = []
    run_step(fake_node, config, dry_run=True, printed=printed)  # a fresh node's dry run: jobuser has not run
    assert any(line.startswith("[imdsblock] would reject cluster-job's traffic to the metadata service "
                               "169.254.169.254/32") and line.endswith("--uid-owner cluster-job -j REJECT "
                                                                       "--reject-with icmp-port-unreachable")
               for line in printed)
    assert fake_node.firewall.restores == [] and fake_node.runner.mutating_calls == []


def test_check_runs_the_probe_and_its_dry_run_lists_it(fake_node, config, kit, capsys):
    node = with_job_user(fake_node, config)
    run_step(node, config)
    node.runner.calls.clear()

    def check(*args):
        return main(["check", "--root", str(node.root), *args], make_runner=lambda dry_run: node.runner,
                    imds=kit.FakeImds())
    assert check("--dry-run") == 0 and node.runner.calls == []
    assert (f"$ /usr/bin/python3 -I {node.root}/opt/cluster/bundle/node_bootstrap/metadata_probe.py --uid 998 "
            "--gid 998 --timeout-s 2 169.254.169.254:80 '[fd00:ec2::254]:80'") in capsys.readouterr().out
    assert check("--json") == 0
    [imds] = [c for c in json.loads(capsys.readouterr().out)["checks"] if c["name"] == "imds-block"]
    assert imds == {"name": "imds-block", "status": "ok",
                    "detail": "cluster-job (uid 998) cannot connect to 169.254.169.254:80, [fd00:ec2::254]:80"}
    node.firewall.chains["iptables"]["OUTPUT"].clear()  # flushed by hand after the boot
    assert check() == 1
    [line] = [line for line in capsys.readouterr().out.splitlines() if line.startswith("imds-block ")]
    assert line.split(None, 2)[1:] == ["FAIL", "cluster-job (uid 998) can open a connection to the instance "
                                               "metadata service at 169.254.169.254:80: jobs could take the node "
                                               "role's credentials (step imdsblock blocks it)"]


# ----- the real probe against a fake metadata server on 127.0.0.1 -------------------------------------------------


@pytest.fixture
def fake_imds():
    """A real TCP server on 127.0.0.1 (a random port) standing in for the metadata service."""
    server = socket.socket()
    server.bind(("127.0.0.1", 0))
    server.listen(8)
    yield server
    server.close()


def job_user_root(tmp_path) -> tuple[Path, int]:
    """A root whose user database names the job user: as root, nobody's uid, which the probe really switches
    to; as another user (no right to switch), that user itself, so the real probe still runs."""
    uid, gid = (65534, 65534) if os.geteuid() == 0 else (os.getuid(), os.getgid())
    (tmp_path / "etc").mkdir(parents=True, exist_ok=True)
    (tmp_path / "etc/passwd").write_text(f"{JOB_USER}:x:{uid}:{gid}::/nonexistent:/usr/sbin/nologin\n")
    groups = "".join(f"g{g}:x:{g}:{JOB_USER}\n" for g in os.getgroups() if g != gid) if os.geteuid() else ""
    (tmp_path / "etc/group").write_text(f"{JOB_USER}:x:{gid}:\n" + groups)
    return tmp_path, uid


def real_probe(root, port) -> MetadataProbe:
    return MetadataProbe(python=sys.executable, script=PROBE_SCRIPT, root=str(root),
                         targets=(("127.0.0.1", port),), timeout_s=5)


def test_the_real_probe_runs_as_the_job_user(tmp_path, fake_imds):
    root, uid = job_user_root(tmp_path)
    probe = real_probe(root, fake_imds.getsockname()[1])
    result = Runner().run(probe.command(read_account(str(root))), mutating=False, timeout=30)
    assert json.loads(result.stdout) == {"uid": uid, "targets": [
        {"target": f"127.0.0.1:{fake_imds.getsockname()[1]}", "connected": True, "error": None}]}


def test_the_check_fails_while_the_job_user_reaches_the_server_and_passes_once_it_is_closed(tmp_path, fake_imds):
    root, uid = job_user_root(tmp_path)
    port = fake_imds.getsockname()[1]
    probe = real_probe(root, port)
    reachable = check_metadata_blocked(probe, Runner())
    assert (reachable.name, reachable.status) == ("imds-block", FAIL)
    assert reachable.detail == (
        f"cluster-job (uid {uid}) can open a connection to the instance metadata service at 127.0.0.1:{port}: "
        "jobs could take the node role's credentials (step imdsblock blocks it)")
    fake_imds.close()  # now the port refuses, as the block's REJECT makes the real address do
    refused = check_metadata_blocked(probe, Runner())
    assert (refused.status, refused.detail) == (OK, f"cluster-job (uid {uid}) cannot connect to 127.0.0.1:{port}")


def test_the_health_gate_fails_a_node_whose_job_user_reaches_the_metadata_server(fake_node, config, tmp_path,
                                                                                 fake_imds):
    """The whole gate on the fake P5 (its hardware healthy), with the real probe against the real server."""
    root, uid = job_user_root(tmp_path / "users")
    port = fake_imds.getsockname()[1]
    fp8 = Fp8Probe.for_node(config, fake_node.host())
    runner = fake_node.runner
    answer_python = runner.handlers[os.path.basename(sys.executable)]

    def python(argv):  # the metadata probe runs for real; the interpreter's other uses stay the fake node's
        if argv[2:3] != [PROBE_SCRIPT]:
            return answer_python(argv)
        result = Runner().run(argv, mutating=False, check=False, timeout=30)
        return result.returncode, result.stdout, result.stderr
    runner.on(os.path.basename(sys.executable), python, on_path=False)
    with pytest.raises(HealthGateFailed) as err:
        plan_health(config.expected, config.instance_type, runner, fp8, real_probe(root, port))
    assert str(err.value) == (
        f"health gate failed: imds-block: cluster-job (uid {uid}) can open a connection to the instance "
        f"metadata service at 127.0.0.1:{port}: jobs could take the node role's credentials (step imdsblock "
        "blocks it)")
    fake_imds.close()
    plan = plan_health(config.expected, config.instance_type, runner, fp8, real_probe(root, port))
    assert f"OK imds-block: cluster-job (uid {uid}) cannot connect to 127.0.0.1:{port}" in plan.notes


def test_before_jobuser_the_gate_has_no_user_to_check(fake_node, config):
    probe = MetadataProbe.for_node(config, fake_node.host())
    check = check_metadata_blocked(probe, fake_node.runner)
    assert check.status == OK and check.detail.startswith("cluster-job does not exist yet")
    assert fake_node.runner.calls == []


def test_a_probe_that_cannot_run_fails_the_check(tmp_path):
    root, uid = job_user_root(tmp_path)
    probe = MetadataProbe(python="/nonexistent/python3", script=PROBE_SCRIPT, root=str(root))
    check = check_metadata_blocked(probe, Runner())
    assert check.status == FAIL
    assert check.detail.startswith(f"cannot verify that cluster-job (uid {uid}) is kept from the instance "
                                   "metadata service: `/nonexistent/python3 -I ")


# ----- the real rules: iptables-restore's syntax check, and the real kernel in a network namespace ---------------


def usable_restore_tool(tool: str) -> str:
    """The tool's path, or skip: not installed, or not allowed to read the rule set here (no CAP_NET_ADMIN)."""
    path = shutil.which(tool, path=os.pathsep.join([os.environ.get("PATH", ""), "/usr/sbin", "/sbin"]))
    if path is None:
        pytest.skip(f"{tool} is not installed here (apt-get install iptables)")
    trial = subprocess.run([path, "--test", "--noflush"], input="*filter\nCOMMIT\n", capture_output=True,
                           text=True, timeout=30)
    if trial.returncode != 0:
        pytest.skip(f"{tool} --test cannot run here: {trial.stderr.strip()[:200]}")
    return path


@pytest.mark.parametrize("family", FAMILIES, ids=lambda f: f.tool)
def test_the_rules_pass_iptables_restore_test(family):
    tool = usable_restore_tool(family.tool + "-restore")
    for jump in ({}, {"jump_first": True}):  # a fresh node, and a node whose chain only needs refilling
        text = render_restore(family, "998", **jump)
        result = subprocess.run([tool, "--test", "--noflush"], input=text, capture_output=True, text=True,
                                timeout=30)
        assert result.returncode == 0, (text, result.stderr)
    broken = render_restore(family, "998").replace("--uid-owner", "--uid-owned")
    result = subprocess.run([tool, "--test", "--noflush"], input=broken, capture_output=True, text=True, timeout=30)
    assert result.returncode != 0  # the check reads the rules: a misspelt option does not pass


NETNS_SCRIPT = """
import json, socket, subprocess, sys
from node_bootstrap.config import load_node_config
from node_bootstrap.host import Host
from node_bootstrap.imds_block import METADATA_IPV4, METADATA_IPV6, MetadataProbe, check_metadata_blocked
from node_bootstrap.imds_block import plan_imds_block
from node_bootstrap.plan import execute_plan
from node_bootstrap.runner import CommandResult, Runner

root, script = sys.argv[1], sys.argv[2]
links = subprocess.run(["ip", "-o", "link"], capture_output=True, text=True, check=True).stdout.splitlines()
assert [line.split(":")[1].strip() for line in links] == ["lo"], links  # nothing leaves this namespace
subprocess.run(["ip", "link", "set", "lo", "up"], check=True)
subprocess.run(["ip", "addr", "add", METADATA_IPV4 + "/32", "dev", "lo"], check=True)
servers = [socket.create_server((METADATA_IPV4, 0))]
if subprocess.run(["ip", "-6", "addr", "add", METADATA_IPV6 + "/128", "dev", "lo", "nodad"]).returncode == 0:
    servers.append(socket.create_server((METADATA_IPV6, 0), family=socket.AF_INET6))
targets = tuple((s.getsockname()[0], s.getsockname()[1]) for s in servers)


class NoSystemd(Runner):
    # systemd is not PID 1 here: systemctl's answers are kept, every other command runs for real
    enabled = set()

    def _execute(self, argv, timeout, input_text):
        if argv[0] != "systemctl":
            return super()._execute(argv, timeout, input_text)
        if argv[1] == "enable":
            self.enabled.add(argv[2])
        return CommandResult(argv, 1 if argv[1] == "is-enabled" and argv[2] not in self.enabled else 0, "", "")


runner = NoSystemd()
host = Host(root)
config = load_node_config(host.path("/etc/cluster/node-config.json"))
probe = MetadataProbe(python=sys.executable, script=script, root=root, targets=targets, timeout_s=5)
before = check_metadata_blocked(probe, runner)
execute_plan(plan_imds_block(config, host, runner, probe), runner, dry_run=False)  # verify: as the job user
after = check_metadata_blocked(probe, runner)
for address, port in targets:
    socket.create_connection((address, port), timeout=5).close()  # root, and every other user, still connects
runner.calls.clear()
again = plan_imds_block(config, host, runner, probe)
listing = [subprocess.run([tool, "-S", "OUTPUT"], capture_output=True, text=True).stdout
           for tool in ("iptables", "ip6tables")]
print(json.dumps({"targets": [list(t) for t in targets], "before": [before.status, before.detail],
                  "after": [after.status, after.detail], "again": [a.summary for a in again.actions],
                  "mutating_again": [list(c.argv) for c in runner.mutating_calls], "output": listing}))
"""


def test_the_real_step_blocks_the_job_user_and_only_it_in_a_network_namespace(tmp_path, kit):
    """The rules as the real tools apply them to the real kernel. In a network namespace of its own, where lo
    is the only interface: 169.254.169.254 (and fd00:ec2::254) are addresses on lo there, each with a
    listening server, so nothing is sent off this machine and the instance metadata service is never asked."""
    if os.geteuid() != 0:
        pytest.skip("needs root: a network namespace, an address on its lo and iptables in it")
    usable_restore_tool("iptables-restore")
    usable_restore_tool("ip6tables-restore")
    if shutil.which("unshare") is None or shutil.which("ip") is None:
        pytest.skip("unshare (util-linux) or ip (iproute2) is not installed here")
    if subprocess.run(["unshare", "--net", "true"], capture_output=True).returncode != 0:
        pytest.skip("cannot create a network namespace here")
    root, uid = job_user_root(tmp_path)
    (root / "etc/cluster").mkdir(parents=True)
    (root / "etc/cluster/node-config.json").write_text(json.dumps(kit.node_config_dict()))
    result = subprocess.run(["unshare", "--net", sys.executable, "-c", NETNS_SCRIPT, str(root), PROBE_SCRIPT],
                            capture_output=True, text=True, timeout=120, cwd=REPO,
                            env={**os.environ, "PYTHONPATH": str(REPO)})
    assert result.returncode == 0, result.stderr
    seen = json.loads(result.stdout)
    where = ", ".join(f"[{a}]:{p}" if ":" in a else f"{a}:{p}" for a, p in seen["targets"])
    assert seen["before"] == [FAIL, f"cluster-job (uid {uid}) can open a connection to the instance metadata "
                                    f"service at {where}: jobs could take the node role's credentials (step "
                                    "imdsblock blocks it)"]
    assert seen["after"] == [OK, f"cluster-job (uid {uid}) cannot connect to {where}"]
    # iptables prints the rules in the form the step compares against: the second plan has nothing to do
    assert seen["again"] == [] and seen["mutating_again"] == []
    assert seen["targets"][0][0] == "169.254.169.254"  # and fd00:ec2::254 second, where the kernel has IPv6
    assert [out.splitlines()[1] for out in seen["output"]] == [f"-A OUTPUT -j {CHAIN}"] * 2
