"""The fake P5 node's parts that are not the machine itself: the node config the stack renders, a command
runner that answers through per-tool handlers, the node's Auto Scaling group as `aws` sees it, the IMDS seam,
and the recorded tool output in tests/node_bootstrap/fixtures/. The machine is node_fake_machine.FakeNode;
tests/node_bootstrap/conftest.py assembles both into the `fake_node`, `make_node` and `kit` fixtures.
"""

from __future__ import annotations

import json
import os
import shlex
from dataclasses import dataclass, field
from pathlib import Path

from cluster_constructs.cloudwatch_agent import EFA_METRICS_DIR, render_agent_config
from node_bootstrap.imds import InstanceIdentity
from node_bootstrap.runner import CommandResult, Runner

FIXTURES = Path(__file__).parent / "node_bootstrap" / "fixtures"
INSTANCE_ID = "i-0a1b2c3d4e5f60718"
REGION = "us-east-1"
KERNEL = "6.1.128-136.201.amzn2023.x86_64"
SITE_PACKAGES = "/opt/pytorch/lib/python3.12/site-packages"  # what the DLAMI interpreter prints (a node path)


def fixture_text(name: str) -> str:
    return (FIXTURES / name).read_text()


def node_config_dict(**overrides) -> dict:
    """The node config the stack renders for p5.48xlarge (docs/architecture.md section 2)."""
    log_group = "/training-cluster/TrainingClusterStack"
    config = {
        "schemaVersion": 5,
        "stackName": "TrainingClusterStack",
        "region": REGION,
        "instanceType": "p5.48xlarge",
        "expected": {"gpuCount": 8, "gpuMemoryGiB": 80, "efaInterfaceCount": 32, "nvmeDeviceCount": 8,
                     "nvswitch": True, "fp8": True},
        "scratch": {"mountPoint": "/scratch", "dlamiMountPoint": "/opt/dlami/nvme"},
        "lustre": {"dnsName": "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com", "mountName": "abcdefgh",
                   "mountPoint": "/fsx", "efaEnabled": False},
        "logging": {"logGroupName": log_group},
        "metrics": {"intervalSeconds": 60, "namespace": "TrainingCluster", "efaMetricsDir": EFA_METRICS_DIR},
        "cloudwatchAgent": render_agent_config(log_group_name=log_group, interval_seconds=60,
                                               disk_mount_points=("/", "/scratch", "/opt/dlami/nvme", "/fsx")),
        "training": {"bundleDir": "/opt/cluster/bundle", "envFile": "/etc/cluster/training.env",
                     "python": "/opt/pytorch/bin/python",
                     "lockFile": "/opt/cluster/bundle/training/node-requirements.txt",
                     "wheelhouseDir": "/opt/cluster/bundle/wheelhouse",
                     "packagesDir": "/opt/cluster/python-packages", "fp8Backends": ["none", "torchao"],
                     "jobsDir": "/var/lib/cluster/jobs",
                     "jobLogDir": "/var/log/cluster/jobs", "checkpointRoot": "/fsx/checkpoints",
                     "dataRoot": "/fsx/data", "rendezvousPort": 29400, "jobHangTimeoutSeconds": 1800,
                     "jobStartTimeoutSeconds": 3600},
        "bootstrap": {"deadlineSeconds": 1200, "autoScalingGroupName": "TrainingClusterStack-nodes",
                      "protectedModeFailures": 3, "protectedModeWindowSeconds": 3600},
        "monitor": {"intervalSeconds": 60},
    }
    for dotted, value in overrides.items():
        section, _, key = dotted.partition(".")
        if key:
            config[section][key] = value
        else:
            config[section] = value
    return config


class FakeRunner(Runner):
    """The real Runner (recording, dry-run) with `_execute` answered by per-tool handlers."""

    def __init__(self, *, dry_run: bool = False, print_fn=print) -> None:
        super().__init__(dry_run=dry_run, print_fn=print_fn)
        self.handlers = {}  # tool basename -> handler(argv list) -> (rc, stdout[, stderr])
        self.on_path = set()  # tools `which` finds
        self.stdin = None  # the input_text of the command being answered

    def on(self, tool: str, handler, *, on_path: bool = True) -> None:
        self.handlers[tool] = handler
        if on_path:
            self.on_path.add(tool)

    def which(self, name, extra_dirs=()):
        return "/usr/bin/" + name if name in self.on_path else None

    def _execute(self, argv, timeout, input_text):
        tool = os.path.basename(argv[0])
        handler = self.handlers.get(tool)
        if handler is None:
            return CommandResult(argv, 127, "", f"{tool}: command not found")
        self.stdin = input_text  # what the command reads (iptables-restore's rules), for its handler
        answer = handler(list(argv))
        rc, out = answer[0], answer[1]
        err = answer[2] if len(answer) > 2 else ""
        return CommandResult(argv, rc, out, err)

    def commands(self, *, mutating=None):
        """The recorded calls as shell lines, optionally only the (non-)mutating ones."""
        return [shlex.join(c.argv) for c in self.calls if mutating is None or c.mutating == mutating]


@dataclass
class FakeGroup:
    """The node's Auto Scaling group as `aws autoscaling` and `aws cloudwatch` see it (shared between nodes)."""

    name: str = "TrainingClusterStack-nodes"
    tags: dict = field(default_factory=dict)  # key -> value
    suspended: list = field(default_factory=list)
    metrics: list = field(default_factory=list)  # (metric name, value)
    fail_calls: set = field(default_factory=set)  # "autoscaling suspend-processes", ... answer AccessDenied

    def handle(self, service, op, argv):
        if f"{service} {op}" in self.fail_calls:
            return 254, "", f"An error occurred (AccessDenied) when calling the {op} operation"
        if (service, op) == ("autoscaling", "create-or-update-tags"):
            for tag in json.loads(argv[argv.index("--tags") + 1]):
                assert tag["ResourceId"] == self.name and tag["PropagateAtLaunch"] is False
                assert len(tag["Value"]) <= 256
                self.tags[tag["Key"]] = tag["Value"]
            return 0, ""
        if (service, op) == ("autoscaling", "delete-tags"):
            for tag in json.loads(argv[argv.index("--tags") + 1]):
                self.tags.pop(tag["Key"], None)
            return 0, ""
        if (service, op) == ("autoscaling", "describe-tags"):
            assert argv[argv.index("--filters") + 1] == f"Name=auto-scaling-group,Values={self.name}"
            tags = [{"ResourceId": self.name, "ResourceType": "auto-scaling-group", "Key": k, "Value": v,
                     "PropagateAtLaunch": False} for k, v in sorted(self.tags.items())]
            return 0, json.dumps({"Tags": tags})
        if (service, op) == ("autoscaling", "suspend-processes"):
            assert argv[argv.index("--auto-scaling-group-name") + 1] == self.name
            self.suspended.append(argv[argv.index("--scaling-processes") + 1])
            return 0, ""
        if (service, op) == ("cloudwatch", "put-metric-data"):
            assert argv[argv.index("--dimensions") + 1] == f"AutoScalingGroupName={self.name}"
            self.metrics.append((argv[argv.index("--metric-name") + 1], int(argv[argv.index("--value") + 1])))
            return 0, ""
        return None


class FakeImds:
    """The IMDS seam for code that needs the instance identity (the real client is tested over HTTP)."""

    def identity(self) -> InstanceIdentity:
        return InstanceIdentity(INSTANCE_ID, REGION)
