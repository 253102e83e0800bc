"""The node config keys jobs need, read from the node config JSON with paths resolved under a root."""

import json
import os
from dataclasses import dataclass

from node_bootstrap.jobs.errors import EXIT_USAGE, JobError

DEFAULT_NODE_CONFIG = "/etc/cluster/node-config.json"


def under_root(root: str, path: str) -> str:
    """`path` (absolute, as on a real node) inside `root`; the identity for root "/"."""
    return os.path.join(root, path.lstrip("/")) if root != "/" else path


@dataclass(frozen=True)
class JobSettings:
    """The node config keys jobs need (docs/architecture.md section 2), with paths resolved under root."""

    root: str
    python: str  # training.python: the DLAMI interpreter that has torch
    bundle_dir: str  # training.bundleDir: on PYTHONPATH and the job's working directory
    env_file: str  # training.envFile: KEY=value lines sourced before torchrun (NCCL/EFA settings)
    jobs_dir: str  # training.jobsDir: <jobs_dir>/<job id>/status.json
    job_log_dir: str  # training.jobLogDir: <job_log_dir>/<job id>.log
    checkpoint_root: str  # training.checkpointRoot: checkpoints go to <checkpoint_root>/<job id>
    rendezvous_port: int  # training.rendezvousPort: c10d store port on the first node
    log_group_name: str  # logging.logGroupName: where the CloudWatch agent ships the job log


def load_settings(root: str = "/", node_config: str = DEFAULT_NODE_CONFIG) -> JobSettings:
    path = under_root(root, node_config)
    try:
        with open(path) as f:
            config = json.load(f)
    except OSError as e:
        raise JobError(f"cannot read node config {path}: {e.strerror}", EXIT_USAGE) from None
    except ValueError as e:
        raise JobError(f"node config {path} is not valid JSON: {e}", EXIT_USAGE) from None

    kind_names = {int: "an integer", str: "a string"}

    def get(section: str, key: str, kind: type) -> object:
        value = config.get(section, {}).get(key) if isinstance(config.get(section), dict) else None
        if not isinstance(value, kind) or isinstance(value, bool):
            raise JobError(
                f"node config {path}: {section}.{key}={value!r}: expected {kind_names[kind]}",
                EXIT_USAGE,
            )
        return value

    def node_path(section: str, key: str) -> str:
        value = str(get(section, key, str))
        if not value.startswith("/"):
            raise JobError(f"node config {path}: {section}.{key}={value!r}: expected an absolute path",
                           EXIT_USAGE)
        return under_root(root, value)

    port = int(get("training", "rendezvousPort", int))  # type: ignore[call-overload]
    if not 1 <= port <= 65535:
        raise JobError(f"node config {path}: training.rendezvousPort={port}: expected 1-65535", EXIT_USAGE)
    return JobSettings(
        root=root,
        python=node_path("training", "python"),
        bundle_dir=node_path("training", "bundleDir"),
        env_file=node_path("training", "envFile"),
        jobs_dir=node_path("training", "jobsDir"),
        job_log_dir=node_path("training", "jobLogDir"),
        checkpoint_root=node_path("training", "checkpointRoot"),
        rendezvous_port=port,
        log_group_name=str(get("logging", "logGroupName", str)),
    )
