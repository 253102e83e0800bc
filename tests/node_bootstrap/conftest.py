"""A fake P5 node for node_bootstrap's tests, and the fixtures that hand it out: build_fake_node puts the
machine (node_fake_machine.FakeNode: a fake root on disk) together and wires its tool handlers to the command
runner (node_fakes.FakeRunner), so the code under test is the real node_bootstrap with only the external
binaries replaced. Also the fixtures of the jobs tests (node_jobs_support) and of the health monitor's end to
end tests (node_monitor_support: moto's AWS)."""

from __future__ import annotations

import json
import os
import signal
import sys
from pathlib import Path

import pytest
from node_fake_firewall import FakeFirewall
from node_fake_machine import FakeNode
from node_fakes import (
    FIXTURES,
    INSTANCE_ID,
    KERNEL,
    REGION,
    SITE_PACKAGES,
    FakeImds,
    FakeRunner,
    fixture_text,
    node_config_dict,
)
from node_jobs_support import Node, pid_alive

from node_bootstrap import jobs
from node_bootstrap.cli import main
from node_bootstrap.config import parse_node_config

REPO = Path(__file__).resolve().parents[2]
NODE_LOCK = "training/node-requirements.txt"
WHEELHOUSE = REPO / "build" / "wheelhouse"  # cluster_constructs/bundle.py WHEELHOUSE: `make setup` fills it


def build_fake_node(root: Path, *, dry_run: bool = False, instance_store: int = 8, dlami: bool = False,
                    print_fn=print) -> FakeNode:
    runner = FakeRunner(dry_run=dry_run, print_fn=print_fn)
    node = FakeNode(root=root, runner=runner)
    node.write("/proc/mounts", "")
    node.write("/proc/sys/kernel/osrelease", KERNEL + "\n")
    node.write("/proc/sys/kernel/random/boot_id", "3f1c2b4a-9d8e-4f7a-b6c5-1e2d3c4b5a69\n")
    node.write("/etc/fstab", "UUID=8f1c2d3e-4b5a-6978-8796-a5b4c3d2e1f0 / xfs defaults,noatime 1 1\n")
    # The EBS root volume: an NVMe device too, with a partition, mounted at /.
    node.add_nvme("nvme0n1", "Amazon Elastic Block Store",
                  "nvme-Amazon_Elastic_Block_Store_vol0a1b2c3d4e5f60718")
    Path(node.path("/sys/block/nvme0n1/nvme0n1p1")).mkdir(parents=True)
    node.signatures[node.path("/dev/nvme0n1")] = {"PTUUID": "0c1d2e3f", "PTTYPE": "gpt"}
    for i in range(1, instance_store + 1):
        node.add_nvme(f"nvme{i}n1", "Amazon EC2 NVMe Instance Storage",
                      f"nvme-Amazon_EC2_NVMe_Instance_Storage_AWS{0x1F3A5C7E9B2D4F60 + i:016X}")
    if dlami:
        node.dlami_volume(mounted=True)
    # The bundle user-data unpacked, and the DLAMI's PyTorch interpreter.
    node.write("/opt/cluster/bundle/training/__init__.py", "")
    node.write("/opt/cluster/bundle/node_bootstrap/__init__.py", "")
    # ... with the training lock and its wheels (make setup downloads them; linked, not copied: 3 MB).
    node.write("/opt/cluster/bundle/training/node-requirements.txt", (REPO / NODE_LOCK).read_text())
    wheelhouse = Path(node.path("/opt/cluster/bundle/wheelhouse"))
    wheelhouse.mkdir(parents=True)
    for wheel in WHEELHOUSE.glob("*.whl"):
        (wheelhouse / wheel.name).symlink_to(wheel)
    node.write("/opt/pytorch/bin/python", "#!/bin/sh\n")
    node.write("/etc/cluster/node-config.json", json.dumps(node_config_dict(), indent=2))
    Path(node.path("/fsx")).mkdir()
    Path(node.path("/run/systemd/system")).mkdir(parents=True)  # systemd is PID 1, as on a node
    # The user database, and the device nodes the drivers create: 8 GPUs and 32 EFA devices.
    node.write("/etc/passwd", "root:x:0:0:root:/root:/bin/bash\nnobody:x:65534:65534::/:/usr/sbin/nologin\n")
    node.write("/etc/group", "root:x:0:\nvideo:x:44:\nrdma:x:997:\nnogroup:x:65534:\n")
    for device in [f"nvidia{i}" for i in range(8)] + ["nvidiactl", "nvidia-uvm", "nvidia-uvm-tools"] + [
            f"infiniband/uverbs{i}" for i in range(32)]:
        node.write(f"/dev/{device}", "")

    runner.on("blkid", node.blkid)
    runner.on("mdadm", node.mdadm)
    runner.on("mkfs.xfs", node.mkfs("xfs"))
    runner.on("mount", node.mount)
    runner.on("nvme", node.nvme_list)
    runner.on("modinfo", lambda argv: (0, f"filename: /lib/modules/{KERNEL}/extra/lustre/fs/lustre.ko.xz\n")
              if node.lustre_module else (1, "", "modinfo: ERROR: Module lustre not found.\n"))
    runner.on("dnf", node.dnf)
    runner.on("nvidia-smi", node.nvidia_smi)
    runner.on("systemctl", node.systemctl)
    runner.on("fi_info", lambda argv: (0, fixture_text(node.fi_info_txt)))
    runner.on("journalctl", lambda argv: (0, fixture_text(node.kernel_log)))
    runner.on("aws", node.aws)
    for tool in ("useradd", "usermod", "chown", "chmod", "stat"):
        runner.on(tool, getattr(node, tool))
    runner.on("python", node.python, on_path=False)  # run by absolute path
    runner.on(os.path.basename(sys.executable), node.python, on_path=False)  # the CUDA probe's interpreter
    runner.on("amazon-cloudwatch-agent-ctl", node.agent_ctl, on_path=False)
    node.write("/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl", "#!/bin/sh\n")
    node.firewall = FakeFirewall()  # iptables, and the metadata service the job user may or may not reach
    node.firewall.install(runner)
    return node


@pytest.fixture
def fake_node(tmp_path) -> FakeNode:
    return build_fake_node(tmp_path / "root")


@pytest.fixture
def config():
    return parse_node_config(node_config_dict())


@pytest.fixture
def make_node(tmp_path):
    """build_fake_node with options: make_node(dlami=True), make_node(instance_store=1), ..."""
    def make(**kwargs) -> FakeNode:
        return build_fake_node(tmp_path / "root", **kwargs)
    return make


@pytest.fixture
def kit():
    """The fake node's helpers as one fixture (test modules may also import them from node_fakes)."""
    from types import SimpleNamespace
    return SimpleNamespace(
        fixture_text=fixture_text, node_config_dict=node_config_dict, FakeRunner=FakeRunner,
        FakeImds=FakeImds, build_fake_node=build_fake_node,
        INSTANCE_ID=INSTANCE_ID, REGION=REGION, KERNEL=KERNEL, SITE_PACKAGES=SITE_PACKAGES, FIXTURES=FIXTURES,
    )


# --- node_bootstrap/jobs/ run for real (node_jobs_support) -------------------------------------------------


@pytest.fixture()
def node_factory(tmp_path):
    started = []

    def make(mode, **kwargs):
        node = Node(tmp_path, mode, **kwargs)
        started.append(node)
        return node

    yield make
    for node in started:  # never leave a stand-in job running
        for status_path in (node.root / "var/lib/cluster/jobs").glob("*/status.json"):
            status = json.loads(status_path.read_text())
            if status.get("state") == "running" and pid_alive(status.get("supervisorPid")):
                for pid in jobs.descendants(status["supervisorPid"]) + [status["supervisorPid"]]:
                    try:
                        os.kill(pid, signal.SIGKILL)
                    except ProcessLookupError:
                        pass


# --- the health monitor end to end, aws on moto (node_monitor_support) ------------------------------------


@pytest.fixture
def cloud():
    """moto's AWS with the node's group (one instance), log group; yields the instance id."""
    import boto3
    from moto import mock_aws
    from node_monitor_support import GROUP, LOG_GROUP, REGION

    with mock_aws():
        ec2 = boto3.client("ec2", region_name=REGION)
        image = "ami-12c6146b"  # any id: moto does not validate AMIs, and its default images may not be loaded
        subnet = ec2.describe_subnets()["Subnets"][0]["SubnetId"]
        ec2.create_launch_template(LaunchTemplateName="node-template",
                                   LaunchTemplateData={"ImageId": image, "InstanceType": "p5.48xlarge"})
        autoscaling = boto3.client("autoscaling", region_name=REGION)
        autoscaling.create_auto_scaling_group(
            AutoScalingGroupName=GROUP, LaunchTemplate={"LaunchTemplateName": "node-template"}, MinSize=1,
            MaxSize=1, DesiredCapacity=1, VPCZoneIdentifier=subnet)
        instance_id = autoscaling.describe_auto_scaling_groups()["AutoScalingGroups"][0]["Instances"][0]["InstanceId"]
        boto3.client("logs", region_name=REGION).create_log_group(logGroupName=LOG_GROUP)
        yield instance_id


@pytest.fixture
def monitored(fake_node, kit, cloud):
    """The fake node with a journal that grows, aws on moto, and `round()` to run one monitor round."""
    from node_monitor_support import AwsOnMoto, Imds, Journal

    node = fake_node
    node.journal = Journal(kit.fixture_text("journal-kernel-clean.txt"))
    node.aws_calls = AwsOnMoto()
    node.runner.on("journalctl", node.journal)
    node.runner.on("aws", node.aws_calls)
    node.runner.on("kill", lambda argv: (os.kill(int(argv[-1]), getattr(signal, "SIG" + argv[2])), (0, ""))[1])

    def round_(*extra):
        node.runner.calls.clear()
        node.aws_calls.calls.clear()

        def make_runner(dry_run):
            node.runner.dry_run = dry_run
            return node.runner
        return main(["monitor", "--once", "--root", str(node.root), *extra], make_runner=make_runner,
                    imds=Imds(cloud))
    node.round = round_
    node.instance_id = cloud
    return node
