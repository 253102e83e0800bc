"""A fake cluster node for the status and cancel tests: a node root with the stack's node config and a stand-in
for torchrun's python, driven through the real node_bootstrap.jobs CLI, and the SSM answers (Stubber
responses) that carry what it prints."""

import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import boto3
from botocore.stub import ANY
from node_fake_firewall import install_system_python

REPO = Path(__file__).resolve().parents[1]
GOLDEN_NODE_CONFIG = REPO / "tests" / "cluster_constructs" / "golden" / "node-config.json"
JOB = "j-20261120-231502-ab12"
COMMAND_ID = "11111111-2222-3333-4444-555555555555"
START_ID = "99999999-2222-3333-4444-555555555555"

# NCCL's lines as it prints them at NCCL_DEBUG=INFO (format strings from NVIDIA/nccl src/debug.cc and
# src/init.cc, and aws/aws-ofi-nccl src/nccl_ofi_net.cpp; see tests/node_bootstrap/test_jobs_log_reading.py).
STAND_IN = """\
#!{python}
import json, os, signal, sys, time
network = os.environ.get("FAKE_NCCL_NETWORK")
prefix = "ip-10-42-1-4:%d:%d [0] NCCL INFO " % (os.getpid(), os.getpid() + 116)
if network == "Libfabric":
    print(prefix + "NET/OFI Selected provider is efa, fabric is efa-direct (found 32 nics)", flush=True)
if network:
    print(prefix + "Using network " + network, flush=True)
if "training.commcheck" in sys.argv and os.environ.get("FAKE_RANK0") == "1":  # rank 0's lines, as
    # training/commcheck.py prints them
    print(json.dumps({{"event": "allreduce", "size_bytes": 1073741824, "dtype": "bfloat16", "ranks": 16,
                      "backend": "nccl", "time_ms": 4.5, "algbw_gbps": 238.6, "busbw_gbps": 447.4}}), flush=True)
    print(json.dumps({{"event": "allreduce_summary", "backend": "nccl", "dtype": "bfloat16", "ranks": 16,
                      "nodes": 2, "sizes_bytes": [1073741824], "largest_size_bytes": 1073741824,
                      "busbw_gbps": 447.4, "peak_busbw_gbps": 447.4, "min_busbw_gbps": None,
                      "passed": None}}), flush=True)
elif "training.commcheck" not in sys.argv:
    for step in (10, 20):
        print(json.dumps({{"event": "step", "step": step, "loss": 3.0 - step / 10}}), flush=True)
if os.environ["FAKE_MODE"] == "exit":
    sys.exit(int(os.environ["FAKE_EXIT_CODE"]))
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
while True:
    time.sleep(0.05)
"""


class FakeNode:
    """A node root with the node config and a stand-in for torchrun's python, driven through the real CLI."""

    def __init__(self, root: Path, mode: str, exit_code: int = 0, nccl_network: str = "", rank0: bool = False):
        self.root = root
        (root / "etc/cluster").mkdir(parents=True)
        # the node config the stack renders (its golden file): the launcher reads the real contract
        (root / "etc/cluster/node-config.json").write_text(GOLDEN_NODE_CONFIG.read_text())
        (root / "etc/cluster/training.env").write_text(
            f"FAKE_MODE={mode}\nFAKE_EXIT_CODE={exit_code}\nFAKE_NCCL_NETWORK={nccl_network}\n"
            f"FAKE_RANK0={int(rank0)}\n"
        )
        (root / "opt/cluster/bundle").mkdir(parents=True)
        # the jobuser boot step's user database; the job user is whoever runs the tests
        (root / "etc/passwd").write_text(
            f"cluster-job:x:{os.getuid()}:{os.getgid()}::/var/lib/cluster-job:/bin/false\n")
        (root / "etc/group").write_text(f"cluster-job:x:{os.getgid()}:\n")
        python = root / "opt/pytorch/bin/python"
        python.parent.mkdir(parents=True)
        python.write_text(STAND_IN.format(python=sys.executable))
        python.chmod(0o755)
        install_system_python(root)  # the probe at start: the firewall holds the metadata block

    def run(self, *args):
        result = self.invoke(*args)
        return result.stdout, result.returncode

    def invoke(self, *args):
        return subprocess.run(
            [sys.executable, "-m", "node_bootstrap.jobs", "--root", str(self.root), *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )

    def start(self, *module_args):
        result = self.invoke(
            "start",
            "--job-id",
            JOB,
            *(module_args or ("--config", "training/configs/tiny-cpu.toml")),
            "--nodes",
            "2",
            "--gpus-per-node",
            "8",
            "--rendezvous-host",
            "10.42.1.4",
            "--launcher",
            "direct",
        )
        # a start that failed leaves no status.json: say why here, not as a missing file in wait_ended
        assert result.returncode == 0, (
            f"start on the stand-in node exited {result.returncode}: {result.stdout} {result.stderr}")

    def wait_ended(self):
        status_path = self.root / "var/lib/cluster/jobs" / JOB / "status.json"
        deadline = time.monotonic() + 20
        while json.loads(status_path.read_text())["state"] == "running":
            assert time.monotonic() < deadline, "stand-in job did not end"
            time.sleep(0.05)


def invocation(instance_id, status, stdout, code):
    return {
        "CommandId": COMMAND_ID,
        "InstanceId": instance_id,
        "Status": status,
        "ResponseCode": code,
        "StandardOutputContent": stdout,
        "StandardErrorContent": "",
    }


def expect_job_lookup(stub, fakes, instance_ids):
    stub.add_response(
        "list_commands",
        {
            "Commands": [
                {
                    "CommandId": START_ID,
                    "DocumentName": fakes.DOCUMENT,
                    "InstanceIds": instance_ids,
                    "Parameters": {"action": ["start"], "jobId": [JOB]},
                    "RequestedDateTime": datetime.datetime(2026, 11, 20, 23, 15, 3, tzinfo=datetime.UTC),
                },
                {
                    "CommandId": COMMAND_ID,
                    "DocumentName": fakes.DOCUMENT,
                    "InstanceIds": instance_ids,
                    "Parameters": {"action": ["start"], "jobId": ["j-20261120-231502-ffff"]},
                    "RequestedDateTime": datetime.datetime(2026, 11, 20, 23, 15, 3, tzinfo=datetime.UTC),
                },
            ]
        },
        {
            "Filters": [
                {"key": "DocumentName", "value": fakes.DOCUMENT},
                {"key": "InvokedAfter", "value": "2026-11-20T22:15:02Z"},
            ]
        },
    )


def expect_status(stub, fakes, answers):
    """The job's start command, the status command, and each node's answer (stdout, exit code)."""
    instance_ids = sorted(answers)
    expect_job_lookup(stub, fakes, instance_ids)
    expect_command(stub, fakes, "status", instance_ids, answers, timeout=120)


def terminate(instance_id):
    """What the Auto Scaling group does to an unhealthy node (moto keeps it visible as terminated)."""
    boto3.client("ec2", region_name="us-east-1").terminate_instances(InstanceIds=[instance_id])


def expect_command(stub, fakes, action, instance_ids, answers, parameters=None, timeout=ANY):
    stub.add_response(
        "send_command",
        {"Command": {"CommandId": COMMAND_ID}},
        {
            "DocumentName": fakes.DOCUMENT,
            "DocumentVersion": "$DEFAULT",
            "InstanceIds": instance_ids,
            "Parameters": parameters or {"action": [action], "jobId": [JOB]},
            "Comment": f"clusterctl {action} {JOB}",
            "TimeoutSeconds": timeout,
        },
    )
    for instance_id in instance_ids:
        stdout, code = answers[instance_id]
        stub.add_response(
            "get_command_invocation",
            invocation(instance_id, "Success", stdout, code),
            {"CommandId": COMMAND_ID, "InstanceId": instance_id},
        )
