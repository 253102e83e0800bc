"""What the nodes are asked to run, as the jobs document (cluster_constructs/jobs.py) takes it: the request's
fields, their checks against the job contract (node_bootstrap/job_contract.py: modules, patterns, the
checkpoint-directory rule) and the document's parameters. The job keeper's restarts send it as it is; a
submit checks the training config on top (cluster_jobs/request.py, with the trainer's own loader), so this
module imports nothing of the trainer and the keeper's Lambda asset carries none of it."""

from __future__ import annotations

import datetime
from dataclasses import dataclass
from pathlib import Path

from cluster_aws.errors import EXIT_USAGE, ClusterctlError
from node_bootstrap import job_contract

MAX_ATTEMPT = 1000  # the jobs document's `attempt` parameter: a positive integer up to 1000
REPO_ROOT = Path(__file__).resolve().parents[1]


def job_time(job_id: str) -> datetime.datetime | None:
    """The submit time a clusterctl job id carries, None for other ids."""
    try:
        return datetime.datetime.strptime(job_id[2:17], "%Y%m%d-%H%M%S").replace(tzinfo=datetime.UTC)
    except ValueError:
        return None


@dataclass(frozen=True)
class JobParameters:
    """A job as the jobs document takes it (the keeper restarts a recorded job with it)."""

    config: str  # training TOML as the nodes see it, relative to the bundle dir or absolute; "" for others
    nodes: int
    gpus_per_node: int
    max_restarts: int
    overrides: tuple[str, ...] = ()  # training: --set items; commcheck: its options as key=value; export: step=N
    module: str = job_contract.TRAINING_MODULE  # what the job runs (node_bootstrap.jobs.MODULES)
    # training: another job whose checkpoints this one starts from ("" = its own only); export: the job whose
    # checkpoint it exports
    resume_from: str = ""
    # 1 for a submit; the job keeper's restarts on a new node set count up (the jobs document's `attempt`)
    attempt: int = 1

    def validate(self) -> None:
        if self.module not in job_contract.MODULES:
            raise ClusterctlError(
                f"module={self.module!r}: allowed: {', '.join(job_contract.MODULES)}", EXIT_USAGE
            )
        for item in self.overrides:  # what the jobs document's allowedPattern takes
            if not job_contract.OVERRIDE_RE.fullmatch(item):
                raise ClusterctlError(
                    f"--set {item!r}: allowed: key=value, a dotted key and a value of letters, "
                    "digits and _ . : / + , @ % - (no spaces or quotes)",
                    EXIT_USAGE,
                )
        if self.module == job_contract.TRAINING_MODULE:
            try:
                for item in self.overrides:
                    job_contract.check_not_checkpoint_dir(item)
            except job_contract.JobError as e:
                raise ClusterctlError(str(e).replace("overrides item", "--set"), EXIT_USAGE) from None
            if self.resume_from and not job_contract.JOB_ID_RE.fullmatch(self.resume_from):
                raise ClusterctlError(
                    f"--resume-from={self.resume_from!r}: allowed: the id of an earlier job on this cluster "
                    "(j-YYYYMMDD-HHMMSS-xxxx)",
                    EXIT_USAGE,
                )
            self._validate_config()
        elif self.module == job_contract.EXPORT_MODULE:
            self._validate_export()
        elif self.resume_from:
            raise ClusterctlError(f"{self.module} takes no --resume-from", EXIT_USAGE)
        elif self.config:
            raise ClusterctlError(f"{self.module} takes no --config (got {self.config!r})", EXIT_USAGE)
        if not 0 <= self.max_restarts <= 99:
            raise ClusterctlError(f"--max-restarts={self.max_restarts}: allowed: 0-99", EXIT_USAGE)
        if not 1 <= self.attempt <= MAX_ATTEMPT:  # the jobs document's allowedPattern for `attempt`
            raise ClusterctlError(f"attempt={self.attempt}: allowed: 1-{MAX_ATTEMPT}", EXIT_USAGE)

    def _validate_export(self) -> None:
        """What the node checks too (node_bootstrap.jobs.JobSpec), in clusterctl export's words."""
        if not job_contract.JOB_ID_RE.fullmatch(self.resume_from):
            raise ClusterctlError(f"JOB={self.resume_from!r}: allowed: the id of a training job on this cluster "
                                  "(j-YYYYMMDD-HHMMSS-xxxx)", EXIT_USAGE)
        if self.config:
            raise ClusterctlError(f"{self.module} takes no --config (got {self.config!r})", EXIT_USAGE)
        bad = [item for item in self.overrides if not job_contract.EXPORT_OPTION_RE.fullmatch(item)]
        if bad or len(self.overrides) > 1:
            raise ClusterctlError(f"{' '.join(self.overrides)!r}: allowed for {self.module}: one step=N",
                                  EXIT_USAGE)

    def _validate_config(self) -> None:
        if not job_contract.CONFIG_RE.fullmatch(self.config) or ".." in self.config.split("/"):
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
        """Nothing here: the trainer's loader checks a training config at submit (request.JobRequest); a
        restart re-sends what was checked then, and the trainer checks it again on the nodes."""

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
        if self.module != job_contract.TRAINING_MODULE:
            parameters["module"] = [self.module]
        if self.resume_from:  # likewise: only sent when asked for
            parameters["resumeFrom"] = [self.resume_from]
        if self.attempt > 1:  # likewise: a submit works against a document deployed before `attempt` existed
            parameters["attempt"] = [str(self.attempt)]
        return parameters
