"""What a job is before it runs: its id and the request the nodes get (config, nodes, restarts, resume),
validated with the trainer's own config loader (training.config, which imports no torch) before any node is
touched. The request's fields and shape checks are cluster_jobs/job_parameters.py's (what the keeper's
restarts send, without the trainer); this module adds the trainer's checks a submit makes."""

from __future__ import annotations

import datetime
import secrets
from dataclasses import dataclass

from cluster_aws.errors import EXIT_USAGE, ClusterctlError
from cluster_jobs.job_parameters import MAX_ATTEMPT, REPO_ROOT, JobParameters, job_time  # noqa: F401
from node_bootstrap import job_contract
from training import config as training_config
from training.errors import ConfigError as TrainingConfigError

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


@dataclass(frozen=True)
class JobRequest(JobParameters):
    """A job as a submit asks for it: the parameters, and a training config the trainer's loader accepts."""

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

    def resolved_config(self) -> training_config.TrainConfig | None:
        """The config the trainer will run (the file with the --set items, validated); None when it cannot be
        read here (a config on the nodes, an absolute path) or the job is no training run."""
        if self.module != job_contract.TRAINING_MODULE or self.config.startswith("/"):
            return None
        return training_config.load_config(REPO_ROOT / self.config, self.overrides)

    def fp8_backend(self) -> str | None:
        """The fp8.backend the trainer will run (the config with the --set items); None when it cannot be known
        here (a config on the nodes that no --set item overrides) or the job is no training run."""
        if self.module != job_contract.TRAINING_MODULE:
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


def validate_job_id(job_id: str) -> None:
    if not job_contract.JOB_ID_RE.fullmatch(job_id):
        raise ClusterctlError(
            f"job id {job_id!r}: allowed: the id `clusterctl submit` printed (j-YYYYMMDD-HHMMSS-xxxx)",
            EXIT_USAGE,
        )
