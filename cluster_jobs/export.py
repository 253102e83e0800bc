"""An export job (`clusterctl export`): its id, made from the training job it exports, and where its Hugging
Face directory lands, on FSx and in the checkpoint bucket.

The export runs as a job of its own (job_contract.EXPORT_MODULE: one process on one node), because the
source job's checkpoint directory is sealed read-only to the job user once that job has ended
(docs/security.md, "The job user's boundary"): it writes into its own checkpoint directory, next to the
source's. The data repository association links <checkpointRoot> (/fsx/checkpoints) to the root of the
checkpoint bucket (cluster_constructs/storage.py), so /fsx/checkpoints/<export id>/hf reaches
s3://<CheckpointBucketName>/<export id>/hf/.
"""

from __future__ import annotations

import secrets
from dataclasses import dataclass

from cluster_aws.errors import EXIT_USAGE, ClusterctlError
from cluster_jobs.table import JobRecord
from node_bootstrap import job_contract

EXPORT_ID_INFIX = "-hf-"  # <source job id>-hf-<4 hex>: next to its source in the bucket, and unique per export
CHECKPOINT_BUCKET_OUTPUT = "CheckpointBucketName"  # the stack output naming the checkpoint bucket
STEP_OPTION = "step"  # the export's only option (job_contract.EXPORT_OPTION_RE)


def export_job_id(source_job_id: str, suffix: str | None = None) -> str:
    """A new export's id: the source's id, -hf-, and 4 random hex digits, so a second export of the same
    job (another step, or a retry after a failure) is a new job with a directory of its own."""
    job_id = f"{source_job_id}{EXPORT_ID_INFIX}{suffix or secrets.token_hex(2)}"
    if not job_contract.JOB_ID_RE.fullmatch(job_id):  # a source id near the 63 characters leaves no room
        raise ClusterctlError(f"JOB={source_job_id!r}: allowed: a job id of at most "
                              f"{63 - len(job_id) + len(source_job_id)} characters, to name its export "
                              f"{job_id!r}", EXIT_USAGE)
    return job_id


def step_overrides(step: int | None) -> tuple[str, ...]:
    """The jobs document's overrides for an export: step=N, or nothing for the newest complete step."""
    return () if step is None else (f"{STEP_OPTION}={step}",)


def exported_step(record: JobRecord) -> int | None:
    """The step an export job's record asked for; None: the newest complete one."""
    for item in record.overrides:
        key, _, value = item.partition("=")
        if key == STEP_OPTION and value.isdigit():
            return int(value)
    return None


@dataclass(frozen=True)
class ExportPlace:
    """Where an export job writes its Hugging Face directory, and where the association puts it in S3."""

    fsx_dir: str  # <checkpointRoot>/<export id>/hf on the nodes
    s3_uri: str | None  # s3://<bucket>/<export id>/hf/; None when the stack does not name the bucket


def place_of(job_id: str, checkpoint_dir: str, checkpoint_bucket: str | None) -> ExportPlace:
    """Where export job `job_id`, whose checkpoint directory is `checkpoint_dir` (<checkpointRoot>/<job id>),
    writes its model, and where the association copies it."""
    fsx_dir = f"{checkpoint_dir.rstrip('/')}/{job_contract.EXPORT_OUT_DIR}"
    s3_uri = f"s3://{checkpoint_bucket}/{job_id}/{job_contract.EXPORT_OUT_DIR}/" if checkpoint_bucket else None
    return ExportPlace(fsx_dir, s3_uri)


def export_place(record: JobRecord, checkpoint_bucket: str | None) -> ExportPlace | None:
    """An export job's output (None for any other job, or one recorded without a checkpoint directory)."""
    if record.module != job_contract.EXPORT_MODULE or not record.checkpoint_dir:
        return None
    return place_of(record.job_id, record.checkpoint_dir, checkpoint_bucket)
