"""What a job is before it runs: its id and the request the nodes get (config, nodes, restarts, resume),
validated with the trainer's own config loader (training.config, which imports no torch) before any node is
touched. The request's fields and shape checks are cluster_jobs/job_parameters.py's (what the keeper's
restarts send, without the trainer); this module adds the trainer's checks a submit makes."""

from __future__ import annotations

import datetime
import secrets
from dataclasses import dataclass
from pathlib import Path

from cluster_aws.errors import EXIT_USAGE, ClusterctlError
from cluster_jobs.job_parameters import MAX_ATTEMPT, REPO_ROOT, JobParameters, job_time  # noqa: F401
from node_bootstrap import job_contract
from training import config as training_config
from training.config.schedule import run_length_warnings
from training.errors import ConfigError as TrainingConfigError
from training.parallel.layout import Layout, world_layout

# What puts an FP8 backend on the nodes, for the line that refuses a job whose nodes lack it.
FP8_BACKEND_SOURCES = {
    "te": "add Transformer Engine (transformer-engine-torch and its core wheels) to the training lock "
          "training/node-requirements.txt and redeploy (README, 'FP8 on the nodes')",
    "torchao": "add torchao to the training lock training/node-requirements.txt and redeploy "
               "(README, 'FP8 on the nodes')",
}


def bundle_config(config: str) -> str:
    """``--config`` as the nodes see it: a packaged config's name (``1b``, as ``python -m training --config``
    takes it) is its file in the bundle (training/configs/1b.toml); anything else is kept as given."""
    names = training_config.packaged_config_names()
    if config in names and not (REPO_ROOT / config).is_file():
        return f"training/configs/{config}.toml"
    if not config.endswith(".toml"):  # neither a name nor a file: most likely a mistyped name (1bb)
        raise ClusterctlError(f"--config={config!r}: allowed: a packaged config ({', '.join(names)}) or a .toml "
                              f"path{training_config.did_you_mean(config)}", EXIT_USAGE)
    return config


def new_job_id(now: datetime.datetime) -> str:
    """Sortable (UTC time first), unique enough (16 random bits per second), and inside the SSM document's
    jobId pattern: j-20261120-231502-ab12."""
    return f"j-{now.astimezone(datetime.UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


@dataclass(frozen=True)
class JobRequest(JobParameters):
    """A job as a submit asks for it: the parameters, and a training config the trainer's loader accepts."""

    def _validate_training_settings(self) -> None:
        """The trainer's own loader and validation (training.config, which imports no torch) on the config
        and the --set items, before anything is sent: a bad key or value is refused here, not on the nodes
        after the job was "started". A config on the nodes (an absolute path) is read where this machine has a
        file there; where it has none the --set items are checked on their own (known section and key, a value of
        the field's type)."""
        try:
            local = self.local_config_path()
            if local is None:
                training_config.parse_overrides(self.overrides)
            else:
                training_config.load_config(local, self.overrides)
        except TrainingConfigError as e:
            raise ClusterctlError(f"not submitted: {self.config} with the --set items: {e}", EXIT_USAGE) from None

    def local_config_path(self) -> Path | None:
        """The config's file on this machine: a bundle path in this checkout, an absolute path where this machine
        has that file too (an FSx mount, a copy); None where it has none (a path only the nodes have)."""
        if not self.config.startswith("/"):
            return REPO_ROOT / self.config
        return Path(self.config) if Path(self.config).is_file() else None

    def resolved_config(self) -> training_config.TrainConfig | None:
        """The config the trainer will run (the file with the --set items, validated); None when it cannot be
        read here (a path only the nodes have) or the job is no training run."""
        local = self.local_config_path()
        if self.module != job_contract.TRAINING_MODULE or local is None:
            return None
        return training_config.load_config(local, self.overrides)

    def run_length_warnings(self) -> list[str]:
        """The trainer's start-up warnings about this run's length (a warmup it never finishes, no checkpoint
        before its end: training.config.schedule), said before the job is sent; [] where the config is not
        readable here."""
        config = self.resolved_config()
        return [] if config is None else run_length_warnings(config, cluster_job=True)

    def check_layout(self) -> Layout | None:
        """The trainer's own layout check (training.parallel.layout, no torch) on this job's nodes and GPUs per
        node: a [parallel] layout the job cannot run (degrees whose product is not the world size, tp over a
        node's GPUs or not dividing the heads, replica groups across nodes, a batch the data-parallel ranks
        cannot split) is refused here in the trainer's words, not on the nodes. None when it cannot be known
        here (a config on the nodes, no training run, the nodes or their GPUs not known yet)."""
        config = self.resolved_config()
        if config is None or not self.nodes or not self.gpus_per_node:
            return None
        try:
            return world_layout(config.parallel, nodes=self.nodes, gpus_per_node=self.gpus_per_node,
                                model=config.model, run=config.run, fp8_backend=config.fp8.backend)
        except TrainingConfigError as e:
            raise ClusterctlError(f"not submitted: {self.config} with the --set items on {self.nodes} nodes of "
                                  f"{self.gpus_per_node} GPUs: {e}", EXIT_USAGE) from None

    def fp8_backend(self) -> str | None:
        """The fp8.backend the trainer will run (the config with the --set items); None when it cannot be known
        here (a config on the nodes that no --set item overrides) or the job is no training run."""
        if self.module != job_contract.TRAINING_MODULE:
            return None
        local = self.local_config_path()
        if local is None:
            return training_config.parse_overrides(self.overrides).get("fp8", {}).get("backend")
        return training_config.load_config(local, self.overrides).fp8.backend

    def require_fp8_backend(self, provided: tuple[str, ...] | None, stack_name: str) -> str | None:
        """The job's fp8.backend, refused (before any node is touched) when the nodes do not provide it.
        `provided`: the stack's Fp8Backends output; None for a stack deployed before it (nothing checked)."""
        backend = self.fp8_backend()
        if backend is None or provided is None or backend in provided:
            return backend
        raise ClusterctlError(
            f"not submitted: {self.config} runs fp8.backend={backend!r}, and the nodes of stack {stack_name} "
            f"provide {', '.join(provided)}: {FP8_BACKEND_SOURCES.get(backend, 'install it on the nodes')}, "
            "or --set fp8.backend=" + ("torchao" if "torchao" in provided else "none"),
            EXIT_USAGE,
        )


def validate_job_id(job_id: str) -> None:
    if not job_contract.JOB_ID_RE.fullmatch(job_id):
        raise ClusterctlError(
            f"job id {job_id!r}: allowed: the id `clusterctl submit` printed (j-YYYYMMDD-HHMMSS-xxxx)",
            EXIT_USAGE,
        )
