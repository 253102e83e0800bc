"""What a job is before it runs: its id and the request the nodes get (config, nodes, restarts, resume),
validated with the trainer's own config loader (training.config, which imports no torch) before any node is
touched."""

from __future__ import annotations

import datetime
import secrets
from dataclasses import dataclass
from pathlib import Path

from cluster_aws.errors import EXIT_USAGE, ClusterctlError
from node_bootstrap import jobs as node_jobs
from training import config as training_config
from training.errors import ConfigError as TrainingConfigError

MAX_ATTEMPT = 1000  # the jobs document's `attempt` parameter: a positive integer up to 1000


REPO_ROOT = Path(__file__).resolve().parents[1]
# What puts an FP8 backend on the nodes, for the line that refuses a job whose nodes lack it.
FP8_BACKEND_SOURCES = {
    "te": "add Transformer Engine (transformer-engine-torch and its core wheels) to the training lock "
          "training/node-requirements.txt and redeploy (README, 'FP8 on the nodes')",
    "torchao": "add torchao to the training lock training/node-requirements.txt and redeploy "
               "(README, 'FP8 on the nodes')",
}


def new_job_id(now: datetime.datetime) -> str:
    """Sortable (UTC time first), unique enough (16 random bits per second), and inside the SSM document's
    jobId pattern: j-20261120-231502-ab12."""
    return f"j-{now.astimezone(datetime.UTC):%Y%m%d-%H%M%S}-{secrets.token_hex(2)}"


def job_time(job_id: str) -> datetime.datetime | None:
    """The submit time a clusterctl job id carries, None for other ids."""
    try:
        return datetime.datetime.strptime(job_id[2:17], "%Y%m%d-%H%M%S").replace(tzinfo=datetime.UTC)
    except ValueError:
        return None


@dataclass(frozen=True)
class JobRequest:
    config: str  # training TOML as the nodes see it, relative to the bundle dir or absolute; "" for commcheck
    nodes: int
    gpus_per_node: int
    max_restarts: int
    overrides: tuple[str, ...] = ()  # training: --set items; commcheck: its options as key=value
    module: str = node_jobs.TRAINING_MODULE  # what torchrun runs (node_bootstrap.jobs.MODULES)
    resume_from: str = ""  # training: another job whose checkpoints this one starts from; "" = its own only
    # 1 for a submit; the job keeper's restarts on a new node set count up (the jobs document's `attempt`)
    attempt: int = 1

    def validate(self) -> None:
        if self.module not in node_jobs.MODULES:
            raise ClusterctlError(
                f"module={self.module!r}: allowed: {', '.join(node_jobs.MODULES)}", EXIT_USAGE
            )
        for item in self.overrides:  # what the jobs document's allowedPattern takes
            if not node_jobs.OVERRIDE_RE.fullmatch(item):
                raise ClusterctlError(
                    f"--set {item!r}: allowed: key=value, a dotted key and a value of letters, "
                    "digits and _ . : / + , @ % - (no spaces or quotes)",
                    EXIT_USAGE,
                )
        if self.module == node_jobs.TRAINING_MODULE:
            try:
                for item in self.overrides:
                    node_jobs.check_not_checkpoint_dir(item)
            except node_jobs.JobError as e:
                raise ClusterctlError(str(e).replace("overrides item", "--set"), EXIT_USAGE) from None
            if self.resume_from and not node_jobs.JOB_ID_RE.fullmatch(self.resume_from):
                raise ClusterctlError(
                    f"--resume-from={self.resume_from!r}: allowed: the id of an earlier job on this cluster "
                    "(j-YYYYMMDD-HHMMSS-xxxx)",
                    EXIT_USAGE,
                )
            self._validate_config()
        elif self.resume_from:
            raise ClusterctlError(f"{self.module} takes no --resume-from", EXIT_USAGE)
        elif self.config:
            raise ClusterctlError(f"{self.module} takes no --config (got {self.config!r})", EXIT_USAGE)
        if not 0 <= self.max_restarts <= 99:
            raise ClusterctlError(f"--max-restarts={self.max_restarts}: allowed: 0-99", EXIT_USAGE)
        if not 1 <= self.attempt <= MAX_ATTEMPT:  # the jobs document's allowedPattern for `attempt`
            raise ClusterctlError(f"attempt={self.attempt}: allowed: 1-{MAX_ATTEMPT}", EXIT_USAGE)

    def _validate_config(self) -> None:
        if not node_jobs.CONFIG_RE.fullmatch(self.config) or ".." in self.config.split("/"):
            raise ClusterctlError(
                f"--config={self.config!r}: allowed: a .toml path of letters, digits, _ . / -", EXIT_USAGE
            )
        local_configs = REPO_ROOT / "training" / "configs"
        if (
            not self.config.startswith("/")
            and local_configs.is_dir()
            and not (REPO_ROOT / self.config).is_file()
        ):
            known = ", ".join(f"training/configs/{p.name}" for p in sorted(local_configs.glob("*.toml")))
            raise ClusterctlError(
                f"--config={self.config!r}: not in the bundle; allowed: {known}, or an "
                "absolute path on the nodes (e.g. on /fsx)",
                EXIT_USAGE,
            )
        self._validate_training_settings()

    def _validate_training_settings(self) -> None:
        """The trainer's own loader and validation (training.config, which imports no torch) on the config
        and the --set items, before anything is sent: a bad key or value is refused here, not on the nodes
        after the job was "started". A config on the nodes (an absolute path) cannot be read here: then the
        --set items are checked on their own (known section and key, a value of the field's type)."""
        try:
            if self.config.startswith("/"):
                training_config.parse_overrides(self.overrides)
            else:
                training_config.load_config(REPO_ROOT / self.config, self.overrides)
        except TrainingConfigError as e:
            raise ClusterctlError(f"not submitted: {self.config} with the --set items: {e}", EXIT_USAGE) from None

    def fp8_backend(self) -> str | None:
        """The fp8.backend the trainer will run (the config with the --set items); None when it cannot be known
        here (a config on the nodes that no --set item overrides) or the job is no training run."""
        if self.module != node_jobs.TRAINING_MODULE:
            return None
        if self.config.startswith("/"):
            return training_config.parse_overrides(self.overrides).get("fp8", {}).get("backend")
        return training_config.load_config(REPO_ROOT / self.config, self.overrides).fp8.backend

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

    def parameters(self, job_id: str, rendezvous_host: str) -> dict[str, list[str]]:
        parameters = {
            "action": ["start"],
            "jobId": [job_id],
            "config": [self.config],
            "nodes": [str(self.nodes)],
            "gpusPerNode": [str(self.gpus_per_node)],
            "rendezvousHost": [rendezvous_host],
            "maxRestarts": [str(self.max_restarts)],
            "overrides": [" ".join(self.overrides)],
        }
        # The document's default is training; leaving it out keeps training submits working against a
        # stack deployed before the module parameter existed (SSM rejects unknown parameters).
        if self.module != node_jobs.TRAINING_MODULE:
            parameters["module"] = [self.module]
        if self.resume_from:  # likewise: only sent when asked for
            parameters["resumeFrom"] = [self.resume_from]
        if self.attempt > 1:  # likewise: a submit works against a document deployed before `attempt` existed
            parameters["attempt"] = [str(self.attempt)]
        return parameters


def validate_job_id(job_id: str) -> None:
    if not node_jobs.JOB_ID_RE.fullmatch(job_id):
        raise ClusterctlError(
            f"job id {job_id!r}: allowed: the id `clusterctl submit` printed (j-YYYYMMDD-HHMMSS-xxxx)",
            EXIT_USAGE,
        )
