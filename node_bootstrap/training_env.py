"""Step 4, training: make the bundled training package importable in the DLAMI's PyTorch environment, and
write the environment jobs source (/etc/cluster/training.env).

The bundle is already unpacked by user-data; a `.pth` file in the interpreter's site-packages puts the bundle
directory on its sys.path (Python docs, `site` module: "path configuration files"), so `import training` works
for every process of that interpreter, torchrun's workers included.

Environment, with sources:
- FI_PROVIDER=efa: pins libfabric to the EFA provider so NCCL never falls back to TCP sockets silently.
- FI_EFA_USE_DEVICE_RDMA=1: GPUDirect RDMA over EFA; p4d/p5 support it, and aws-ofi-nccl's EFA cheatsheet
  (doc/efa-env-var.md) says it is "not harmful to set it on p4/p5 instances" with current libfabric, where it
  is also the default. Every instance type in the catalog (p4d, p4de, p5, p5e, p5en, p6-b200) supports RDMA.
- NCCL_SOCKET_IFNAME=^lo,docker,veth: NCCL's bootstrap sockets never pick loopback or container bridges
  (NCCL docs, Environment Variables: a leading ^ excludes interfaces by prefix).
- NCCL_DEBUG=INFO, NCCL_DEBUG_SUBSYS=INIT: every job log names the network NCCL chose ("NCCL INFO Using
  network Libfabric", or "... Socket" when it fell back to TCP), which `node_bootstrap.jobs status` reads and
  clusterctl status warns about. NCCL docs, Environment Variables
  (docs.nvidia.com/deeplearning/nccl/user-guide/docs/env.html): NCCL_DEBUG=INFO "prints debug information";
  NCCL_DEBUG_SUBSYS "allows the user to filter the NCCL_DEBUG=INFO output based on subsystems"
  (default INIT,BOOTSTRAP,ENV). INIT is the narrowest filter that keeps both lines this relies on: NCCL logs
  "Using network %s" under INIT (src/init.cc) and aws-ofi-nccl its "Selected provider is efa" under INIT|NET,
  and a line prints when any of its subsystems is selected (src/debug.cc). NET would add what only the
  network transports log, and INIT lines come only when a communicator is created, so the log stays small.
- Failure detection (docs/operations.md, "When a node fails", says how long each failure takes to surface).
  torch 2.13's ProcessGroupNCCL reads these (torch/csrc/distributed/c10d/ProcessGroupNCCL.hpp; "PYTORCH
  ProcessGroupNCCL Environment Variables" in the PyTorch docs):
  TORCH_NCCL_ASYNC_ERROR_HANDLING=3: on a collective error or timeout the watchdog tears the process down
  without aborting the communicators first (ncclCommAbort can itself hang on a dead peer); 3 is the default,
  pinned so a changed default or an inherited setting cannot leave a rank hung.
  TORCH_NCCL_ENABLE_MONITORING=1 (the default, pinned) with TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC=180 (default
  480): a monitor thread ends the process when the watchdog thread itself is stuck (a CUDA call on a GPU
  that fell off the bus) for 3 minutes instead of 8.
  The collective timeout itself is the process group's: the trainer sets it (training/parallel/,
  parallel.init_timeout_seconds until the first step, then parallel.train_timeout_seconds).
  No NCCL_* variable shortens EFA failure detection: NCCL_IB_TIMEOUT and NCCL_IB_RETRY_CNT tune NCCL's own
  InfiniBand verbs transport, which is not used when the aws-ofi-nccl plugin carries the traffic, and the
  EFA cheatsheet (aws-ofi-nccl doc/efa-env-var.md) lists no timeout setting.
- Deliberately not set: NCCL_PROTO (aws-ofi-nccl >= 1.6 needs no override; the cheatsheet limits
  NCCL_PROTO=simple to aws-ofi-nccl <= 1.5), NCCL_BUFFSIZE and NCCL_MIN_NCHANNELS (the cheatsheet recommends
  the defaults), RDMAV_FORK_SAFE (the cheatsheet: "Do not use").
"""

from __future__ import annotations

import re

from node_bootstrap.config import NodeConfig
from node_bootstrap.errors import StepError
from node_bootstrap.host import Host
from node_bootstrap.plan import StepPlan
from node_bootstrap.runner import Runner

PTH_FILE_NAME = "cluster-bundle.pth"
NCCL_HEARTBEAT_TIMEOUT_S = 180  # torch's default is 480
_PURELIB = "import sysconfig; print(sysconfig.get_paths()['purelib'])"
_SAFE_VALUE = re.compile(r"^[A-Za-z0-9_./:,^=+@%-]*$")


def build_training_env(config: NodeConfig) -> dict[str, str]:
    """The variables jobs need, in a stable order."""
    return {
        "FI_PROVIDER": "efa",
        "FI_EFA_USE_DEVICE_RDMA": "1",
        "NCCL_SOCKET_IFNAME": "^lo,docker,veth",
        "NCCL_DEBUG": "INFO",  # the "Using network ..." line job status reads (see the module docstring)
        "NCCL_DEBUG_SUBSYS": "INIT",
        "TORCH_NCCL_ASYNC_ERROR_HANDLING": "3",  # tear a rank down on a collective error or timeout
        "TORCH_NCCL_ENABLE_MONITORING": "1",  # ... and when the NCCL watchdog thread itself is stuck
        "TORCH_NCCL_HEARTBEAT_TIMEOUT_SEC": str(NCCL_HEARTBEAT_TIMEOUT_S),
        "PYTHONPATH": config.training.bundle_dir,
        "CLUSTER_INSTANCE_TYPE": config.instance_type,  # training reads it for its MFU peak
        "CLUSTER_STACK_NAME": config.stack_name,
        "CLUSTER_PYTHON": config.training.python,
        "CHECKPOINT_ROOT": config.training.checkpoint_root,
        "DATA_ROOT": config.training.data_root,
        "SCRATCH_DIR": config.scratch.mount_point,
    }


def render_env_file(env: dict[str, str]) -> str:
    """KEY=value lines that both `set -a; . file` (bash) and systemd's EnvironmentFile= read the same way."""
    lines: list[str] = [
        "# Written by node_bootstrap (training step) on every run; edits are overwritten.",
        "# Jobs load it with: set -a; . /etc/cluster/training.env; set +a",
    ]
    for key, value in env.items():
        lines.append(f"{key}={value if _SAFE_VALUE.fullmatch(value) else _single_quote(value)}")
    return "\n".join(lines) + "\n"


def plan_training(config: NodeConfig, host: Host, runner: Runner) -> StepPlan:
    training = config.training
    plan = StepPlan("training")
    if not host.exists(training.bundle_dir + "/training/__init__.py"):
        raise StepError(f"the bundle at {training.bundle_dir} has no training package "
                        "(training/__init__.py); did user-data unpack the bundle?")
    if not host.exists(training.python):
        raise StepError(f"training.python={training.python} does not exist: "
                        "is this the Deep Learning AMI with PyTorch?")

    env_text = render_env_file(build_training_env(config))
    if host.read_text(training.env_file, default="") != env_text:
        plan.add(f"write {training.env_file} (EFA/NCCL settings, PYTHONPATH, data and checkpoint roots)",
                 apply=lambda: host.write_text(training.env_file, env_text))

    result = runner.run([host.path(training.python), "-c", _PURELIB], mutating=False, check=False)
    purelib = result.stdout.strip()
    if not result.ok or not purelib.startswith("/"):
        raise StepError(f"cannot find the site-packages of {training.python}: {result.describe_failure()}")
    # The interpreter runs on the node, so it prints a node path (the same as the host path when root is /).
    pth_node = purelib.rstrip("/") + "/" + PTH_FILE_NAME
    pth_text = training.bundle_dir + "\n"
    if host.read_text(pth_node, default="") != pth_text:
        plan.add(f"put the bundle on {training.python}'s sys.path with {pth_node}",
                 apply=lambda: host.write_text(pth_node, pth_text))
    plan.verify = lambda: _verify_import(host, runner, training.python)
    return plan


def _verify_import(host: Host, runner: Runner, python: str) -> None:
    result = runner.run([host.path(python), "-c", "import training"], mutating=False, check=False)
    if not result.ok:
        raise StepError(f"the training package does not import in {python}: {result.describe_failure()}")


def _single_quote(value: str) -> str:
    if "'" in value or "\n" in value:
        raise StepError(f"cannot write {value!r} to the env file: quotes and newlines are not allowed")
    return f"'{value}'"
