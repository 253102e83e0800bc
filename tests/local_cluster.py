"""A cluster on this machine for failure drills: moto holds the AWS side (Auto Scaling group, EC2, SSM, the
job table, the alarm topic), and every "instance" is a fake node root whose jobs run for real: the jobs
document's own script (cluster_constructs/jobs.py build_job_script) runs node_bootstrap.jobs with the direct
launcher, which runs torchrun and the real training package on the CPU.

CloudFormation holds the stack's outputs as a deployed stack has them (cluster_aws/stack_outputs.py), so the drills run
`clusterctl submit/cancel/status/jobs` in-process against this cluster: give clusterctl's SSM client to
`attach` and its commands run here too.

SSM is the seam. moto records every SendCommand (so ListCommands works), and this module then does what the
SSM agent on each target would: checks the parameters against the document's allowedPattern/allowedValues,
sets SSM_<name> for each (interpolationType ENV_VAR), and runs the script. GetCommandInvocation answers from
those runs. A command to an instance that has no live node is refused as SSM refuses it (InvalidInstanceId).

What a laptop cannot be is mapped, in one place (NODE_PYTHON_SHIM): every node's torchrun meets on
127.0.0.1 instead of the private IP the keeper chose (that IP is recorded for the assertions), on a port per
attempt, with one process per node instead of 8 GPUs; FSx for Lustre is one directory all node roots link to
(each root's /fsx), so a path on the nodes, such as a job record's checkpoint_dir, is `local_path(path)` here.
"""

from __future__ import annotations

import json
import os
import random
import re
import shutil
import signal
import socket
import subprocess
import sys
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import boto3
from inductor_isa import VEC_ISA_OK_ENV
from node_jobs_support import install_system_python, write_user_database

from cluster_constructs.jobs import PARAMETERS, build_job_script
from node_bootstrap import jobs as node_jobs

REPO = Path(__file__).resolve().parents[1]
GOLDEN_NODE_CONFIG = REPO / "tests" / "cluster_constructs" / "golden" / "node-config.json"
REGION = "us-east-1"
STACK = "DrillStack"
GROUP = "DrillStack-nodes"
DOCUMENT = "DrillStack-JobsDocument-Drill1"
TABLE = "DrillStack-JobTable-Drill1"
LOG_GROUP = f"/training-cluster/{STACK}"
NODE_CONFIG = json.loads(GOLDEN_NODE_CONFIG.read_text())
# The stack's CheckpointRoot output is the node config's training.checkpointRoot (both are
# cluster_constructs.node_config.checkpoint_root), so the checkpoint_dir clusterctl records is the directory the
# nodes write.
CHECKPOINT_ROOT = NODE_CONFIG["training"]["checkpointRoot"]
CHECKPOINT_BUCKET = "drillstack-checkpointbucket-1a2b3c"  # the stack output CheckpointBucketName (no bucket here)
FSX_MOUNT = "/fsx"
IMAGE_ID = "ami-12c6146b"
COMMAND_TIMEOUT_S = 300

# Stands in for `python3` on the node's PATH: the document's script runs `python3 -m node_bootstrap.jobs ...`.
NODE_PYTHON_SHIM = """\
#!{python}
import json, os, sys
root = os.environ["DRILL_NODE_ROOT"]
args = sys.argv[1:]
assert args[:2] == ["-m", "node_bootstrap.jobs"], args
rest = args[2:]
if rest and rest[0] == "start":
    attempt = int(rest[rest.index("--attempt") + 1]) if "--attempt" in rest else 1
    i = rest.index("--rendezvous-host")
    with open(os.path.join(root, "rendezvous-hosts.log"), "a") as f:
        f.write(json.dumps({{"attempt": attempt, "host": rest[i + 1]}}) + "\\n")
    rest[i + 1] = "127.0.0.1"  # every drill node is this machine
    rest[rest.index("--gpus-per-node") + 1] = "1"  # one CPU process per node
    config_path = os.path.join(root, "etc/cluster/node-config.json")
    with open(config_path) as f:
        config = json.load(f)
    config["training"]["rendezvousPort"] = int(os.environ["DRILL_BASE_PORT"]) + attempt
    with open(config_path, "w") as f:
        json.dump(config, f)
    rest += ["--launcher", "direct", "--stop-grace-seconds", os.environ.get("DRILL_STOP_GRACE_S", "20")]
os.execv(sys.executable, [sys.executable, "-m", "node_bootstrap.jobs", "--root", root] + rest)
"""

TRAINER_PYTHON = """\
#!/bin/sh
exec {python} "$@"
"""


def free_port_block(size: int = 20) -> int:
    """A base port with `size` ports above it that are free now.

    Drills run in parallel (pytest-xdist): each worker draws its blocks from its own range below the kernel's
    ephemeral ports (32768 and up on Linux), so two drills, or a drill and a socket the kernel hands out, do not
    pick the same rendezvous port. Every port of the block is probed, not just the first.
    """
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    index = int(worker[2:]) if worker[2:].isdigit() else 0
    low = 20000 + (index % 8) * 1500
    for _ in range(50):
        base = random.randrange(low, low + 1500 - size)
        if all(_port_is_free(port) for port in range(base, base + size)):
            return base
    raise RuntimeError(f"no block of {size} free ports in {low}-{low + 1500}")


def _port_is_free(port: int) -> bool:
    with socket.socket() as s:
        try:
            s.bind(("127.0.0.1", port))
        except OSError:
            return False
    return True


class FakeHttp:
    def __init__(self, status_code: int) -> None:
        self.status_code = status_code
        self.headers: dict[str, str] = {}
        self.content = b""
        self.raw = None


def _is_supervisor(pid: int) -> bool:
    try:
        return b"node_bootstrap.jobs" in Path(f"/proc/{pid}/cmdline").read_bytes()
    except OSError:
        return False


@dataclass
class NodeRoot:
    instance_id: str
    root: Path
    shim_dir: Path

    def job_status(self, job_id: str) -> dict[str, Any] | None:
        path = self.root / "var/lib/cluster/jobs" / job_id / "status.json"
        return json.loads(path.read_text()) if path.is_file() else None

    def job_log(self, job_id: str) -> str:
        path = self.root / "var/log/cluster/jobs" / f"{job_id}.log"
        return path.read_text(errors="replace") if path.is_file() else ""

    def rendezvous_hosts(self) -> list[dict[str, Any]]:
        path = self.root / "rendezvous-hosts.log"
        return [json.loads(line) for line in path.read_text().splitlines()] if path.is_file() else []

    def kill_everything(self, signum: int = signal.SIGKILL) -> list[int]:
        """SIGKILL every process of every job on this node (a node that lost power); SIGSTOP: a node that hangs,
        its sockets left open, so its peers see no reset and block inside their collectives."""
        killed = []
        for status_path in (self.root / "var/lib/cluster/jobs").glob("*/status.json"):
            pid = json.loads(status_path.read_text()).get("supervisorPid")
            if not pid or not _is_supervisor(pid):  # finished long ago: the pid may be another process now
                continue
            for victim in [*node_jobs.descendants(pid), pid]:
                try:
                    os.kill(victim, signum)
                    killed.append(victim)
                except ProcessLookupError:
                    pass
        return killed


INDUCTOR_DIR_ENV = "TORCHINDUCTOR_CACHE_DIR"


def machine_env(machine_tmp: Path) -> dict[str, str]:
    """What a job on the drills' machine gets: its temporary directory (where Inductor looks for its C++
    precompiled header: the drills' machine shares the session's, tests/drills/conftest.py), one Inductor directory
    in it for every job, and the test process's answer to Inductor's ISA check (tests/inductor_isa.py)."""
    isa_check = {VEC_ISA_OK_ENV: os.environ[VEC_ISA_OK_ENV]} if VEC_ISA_OK_ENV in os.environ else {}
    return {"TMPDIR": str(machine_tmp), INDUCTOR_DIR_ENV: str(machine_tmp / "torchinductor-drills"), **isa_check}


@dataclass
class LocalCluster:
    """The moto resources and the node roots; `attach(client)` makes an SSM client run commands here."""

    base: Path
    node_count: int
    instance_type: str = "p5.48xlarge"
    capacity_mode: str = "on-demand"  # the stack's CapacityMode output
    max_job_restarts: int = 5  # the stack's MaxJobRestarts output (settings: jobKeeper.maxJobRestarts)
    spare_nodes: int = 0  # the stack's SpareNodes output: the group holds node_count + spare_nodes
    # The nodes are processes of one machine, and share its temporary directory (machine_env): by default the
    # cluster's own; the drills share one per session, which a straight run of the same job fills first
    # (test_spare_drill.py): a drill compiles warm, as a node whose job ran before does (or not: empty_inductor_dir)
    machine_tmp: Path | None = None
    nodes: dict[str, NodeRoot] = field(default_factory=dict)
    base_port: int = field(default_factory=free_port_block)
    results: dict[tuple[str, str], dict[str, Any]] = field(default_factory=dict)
    sent: list[dict[str, Any]] = field(default_factory=list)
    frozen: list[NodeRoot] = field(default_factory=list)  # nodes lost while hung: their processes are killed at cleanup

    def __post_init__(self) -> None:
        self.fsx = self.base / "fsx"
        self.fsx.mkdir(parents=True)
        self.machine_tmp = self.machine_tmp or self.base / "tmp"
        self.machine_tmp.mkdir(exist_ok=True)
        self.ec2 = boto3.client("ec2", region_name=REGION)
        self.autoscaling = boto3.client("autoscaling", region_name=REGION)
        vpc = self.ec2.create_vpc(CidrBlock="10.42.0.0/16")["Vpc"]["VpcId"]
        subnet = self.ec2.create_subnet(VpcId=vpc, CidrBlock="10.42.1.0/24",
                                        AvailabilityZone=f"{REGION}a")["Subnet"]["SubnetId"]
        self.ec2.create_launch_template(LaunchTemplateName="drill-nodes", LaunchTemplateData={
            "ImageId": IMAGE_ID, "InstanceType": self.instance_type})
        self.autoscaling.create_auto_scaling_group(
            AutoScalingGroupName=GROUP, LaunchTemplate={"LaunchTemplateName": "drill-nodes"},
            MinSize=self.group_size, MaxSize=self.group_size, DesiredCapacity=self.group_size,
            VPCZoneIdentifier=subnet)
        boto3.client("ssm", region_name=REGION).create_document(
            Name=DOCUMENT, Content=json.dumps({"schemaVersion": "2.2", "description": "drill",
                                               "parameters": PARAMETERS,
                                               "mainSteps": [{"action": "aws:runShellScript", "name": "run",
                                                              "inputs": {"runCommand": ["true"]}}]}),
            DocumentType="Command", DocumentFormat="JSON")
        dynamodb = boto3.client("dynamodb", region_name=REGION)
        dynamodb.create_table(TableName=TABLE, KeySchema=[{"AttributeName": "pk", "KeyType": "HASH"}],
                              AttributeDefinitions=[{"AttributeName": "pk", "AttributeType": "S"}],
                              BillingMode="PAY_PER_REQUEST")
        sns = boto3.client("sns", region_name=REGION)
        self.topic_arn = sns.create_topic(Name="drill-alarms")["TopicArn"]
        sqs = boto3.client("sqs", region_name=REGION)
        self.alarm_queue = sqs.create_queue(QueueName="drill-alarms")["QueueUrl"]
        queue_arn = sqs.get_queue_attributes(QueueUrl=self.alarm_queue, AttributeNames=["QueueArn"])[
            "Attributes"]["QueueArn"]
        sns.subscribe(TopicArn=self.topic_arn, Protocol="sqs", Endpoint=queue_arn)
        self._create_stack()
        for instance_id in self.instance_ids():
            self.boot(instance_id)

    def _create_stack(self) -> None:
        """The stack clusterctl reads: the outputs TrainingClusterStack has (stacks/, cluster_aws/stack_outputs.py),
        naming this cluster's group, document and table."""
        outputs = {
            "AutoScalingGroupName": GROUP,
            "LogGroupName": LOG_GROUP,
            "JobDocumentName": DOCUMENT,
            "InstanceType": self.instance_type,
            "NodeCount": str(self.node_count),
            "SpareNodes": str(self.spare_nodes),
            "CapacityMode": self.capacity_mode,
            "JobTableName": TABLE,
            "MaxJobRestarts": str(self.max_job_restarts),
            "CheckpointRoot": CHECKPOINT_ROOT,
            "CheckpointBucketName": CHECKPOINT_BUCKET,
            "Fp8Backends": "none,torchao",
        }
        template = {
            "Resources": {"Logs": {"Type": "AWS::Logs::LogGroup", "Properties": {"LogGroupName": LOG_GROUP}}},
            "Outputs": {key: {"Value": value} for key, value in outputs.items()},
        }
        boto3.client("cloudformation", region_name=REGION).create_stack(
            StackName=STACK, TemplateBody=json.dumps(template))

    @property
    def group_size(self) -> int:
        return self.node_count + self.spare_nodes

    def local_path(self, node_path: str) -> Path:
        """Where a path on the nodes' shared FSx (/fsx/...) is on this machine."""
        relative = Path(node_path).relative_to(FSX_MOUNT)
        return self.fsx / relative

    # --- the group --------------------------------------------------------------------------------------

    def instance_ids(self) -> list[str]:
        group = self.autoscaling.describe_auto_scaling_groups(AutoScalingGroupNames=[GROUP])["AutoScalingGroups"][0]
        return [i["InstanceId"] for i in group["Instances"]]

    def private_ip(self, instance_id: str) -> str:
        reservations = self.ec2.describe_instances(InstanceIds=[instance_id])["Reservations"]
        return reservations[0]["Instances"][0]["PrivateIpAddress"]

    def boot(self, instance_id: str) -> NodeRoot:
        """A node's root as node_bootstrap leaves it, and its cluster:bootstrap=ready tag."""
        root = self.base / instance_id
        (root / "etc/cluster").mkdir(parents=True)
        (root / "etc/cluster/node-config.json").write_text(json.dumps(NODE_CONFIG))
        (root / "etc/cluster/training.env").write_text("OMP_NUM_THREADS=1\nPYTHONUNBUFFERED=1\n" + "".join(
            f"{name}={value}\n" for name, value in machine_env(self.machine_tmp).items()))
        (root / "opt/cluster").mkdir(parents=True)
        (root / "opt/cluster/bundle").symlink_to(REPO)
        trainer_python = root / "opt/pytorch/bin/python"
        trainer_python.parent.mkdir(parents=True)
        trainer_python.write_text(TRAINER_PYTHON.format(python=sys.executable))
        trainer_python.chmod(0o755)
        (root / FSX_MOUNT.lstrip("/")).symlink_to(self.fsx)  # FSx for Lustre: one file system every node mounts
        write_user_database(root)  # the job user is whoever runs the drill
        install_system_python(root)  # the probe at start: the firewall holds the metadata block
        shim_dir = root / "shim"
        shim_dir.mkdir()
        shim = shim_dir / "python3"
        shim.write_text(NODE_PYTHON_SHIM.format(python=sys.executable))
        shim.chmod(0o755)
        self.ec2.create_tags(Resources=[instance_id], Tags=[{"Key": "cluster:bootstrap", "Value": "ready"}])
        node = NodeRoot(instance_id, root, shim_dir)
        self.nodes[instance_id] = node
        return node

    def empty_inductor_dir(self, instance_id: str) -> Path:
        """The node's jobs compile into an Inductor directory of its own, empty: a spare that never ran the job,
        whose warm compile can come only from the job's snapshot (training/compile_cache.py). Returns it."""
        node = self.nodes[instance_id]
        env_file = node.root / "etc/cluster/training.env"
        own = node.root / "inductor"
        inductor = machine_env(self.machine_tmp)[INDUCTOR_DIR_ENV]
        env_file.write_text(env_file.read_text().replace(f"{INDUCTOR_DIR_ENV}={inductor}\n",
                                                         f"{INDUCTOR_DIR_ENV}={own}\n"))
        return own

    def lose(self, instance_id: str, *, hang: bool = False) -> str:
        """The node dies: its processes are killed, Auto Scaling terminates it and launches a replacement,
        which boots. hang: its processes are stopped instead (SIGSTOP: an instance gone silent, a GPU hung in a
        kernel), so its sockets stay open until the cleanup. Returns the replacement's instance id."""
        node = self.nodes.pop(instance_id)
        if hang:
            node.kill_everything(signal.SIGSTOP)
            self.frozen.append(node)
        else:
            node.kill_everything()
        before = set(self.instance_ids())
        self.autoscaling.terminate_instance_in_auto_scaling_group(
            InstanceId=instance_id, ShouldDecrementDesiredCapacity=False)
        (replacement,) = set(self.instance_ids()) - before
        return replacement

    def alarms(self) -> list[dict[str, Any]]:
        sqs = boto3.client("sqs", region_name=REGION)
        messages = sqs.receive_message(QueueUrl=self.alarm_queue, MaxNumberOfMessages=10).get("Messages", [])
        return [json.loads(m["Body"]) for m in messages]

    # --- SSM: what the agent on each node would do -------------------------------------------------------

    def attach(self, ssm_client: Any) -> Any:
        ssm_client.meta.events.register("before-call.ssm.SendCommand", self._before_send)
        ssm_client.meta.events.register("after-call.ssm.SendCommand", self._after_send)
        ssm_client.meta.events.register("before-call.ssm.GetCommandInvocation", self._get_invocation)
        return ssm_client

    def _before_send(self, params: dict[str, Any], context: dict[str, Any], **_: Any) -> Any:
        request = json.loads(params["body"])
        unknown = [i for i in request["InstanceIds"] if i not in self.nodes]
        if unknown:
            return FakeHttp(400), {"Error": {"Code": "InvalidInstanceId",
                                             "Message": f"Instances {unknown} not in a valid state for account"}}
        parameters = request.get("Parameters", {})
        for name, values in parameters.items():
            spec = PARAMETERS.get(name)
            value = values[0]
            allowed = spec and (value in spec["allowedValues"] if "allowedValues" in spec
                                else re.fullmatch(spec["allowedPattern"][1:-1], value) is not None)
            if not allowed:
                return FakeHttp(400), {"Error": {"Code": "InvalidParameters",
                                                 "Message": f"parameter {name}={value!r} is not allowed"}}
        context["drill_request"] = request
        return None

    def _after_send(self, parsed: dict[str, Any], context: dict[str, Any], **_: Any) -> None:
        request = context.pop("drill_request", None)
        if request is None or "Command" not in parsed:
            return
        self.sent.append(request)
        command_id = parsed["Command"]["CommandId"]
        parameters = {name: spec.get("default", "") for name, spec in PARAMETERS.items()}
        parameters.update({name: values[0] for name, values in request.get("Parameters", {}).items()})
        script = "\n".join(build_job_script(str(REPO))) + "\n"
        for instance_id in request["InstanceIds"]:
            node = self.nodes[instance_id]
            env = {
                "PATH": f"{node.shim_dir}:{os.environ['PATH']}",
                "DRILL_NODE_ROOT": str(node.root),
                "DRILL_BASE_PORT": str(self.base_port),
                "HOME": str(node.root),
                **{f"SSM_{name}": value for name, value in parameters.items()},
            }
            proc = subprocess.run(["bash", "-c", script], env=env, cwd=str(node.root), capture_output=True,
                                  text=True, timeout=COMMAND_TIMEOUT_S)
            self.results[(command_id, instance_id)] = {
                "CommandId": command_id, "InstanceId": instance_id,
                "Status": "Success" if proc.returncode == 0 else "Failed", "ResponseCode": proc.returncode,
                "StandardOutputContent": proc.stdout, "StandardErrorContent": proc.stderr,
            }

    def _get_invocation(self, params: dict[str, Any], **_: Any) -> Any:
        request = json.loads(params["body"])
        result = self.results.get((request["CommandId"], request["InstanceId"]))
        if result is None:
            return FakeHttp(400), {"Error": {"Code": "InvocationDoesNotExist", "Message": "no such invocation"}}
        return FakeHttp(200), dict(result)

    def cleanup(self) -> None:
        for node in [*self.nodes.values(), *self.frozen]:
            node.kill_everything()
        shutil.rmtree(self.base, ignore_errors=True)
