"""`clusterctl export JOB [--step N]`: a training job's checkpoint to a Hugging Face model directory, run on
the cluster as a job of its own (`python -m training.export`, one process on one node) through submit's path:
the one-job lock, a record, the jobs document.

Why a job and not a command on a node: the source job's checkpoint directory is sealed read-only to the job
user once the job has ended (docs/security.md), and a job owns only its own directory. So the export job,
<JOB>-hf-<4 hex>, reads /fsx/checkpoints/<JOB> and writes /fsx/checkpoints/<its id>/hf, which the data
repository association carries to the checkpoint bucket. The node's launcher makes both paths from the two
job ids: nothing the user types becomes a path (cluster_jobs/export.py, node_bootstrap.jobs.build_torchrun_argv).
"""

from __future__ import annotations

import argparse
from typing import TYPE_CHECKING

from cluster_aws.errors import EXIT_STACK, EXIT_USAGE, ClusterctlError
from cluster_jobs import records as job_records
from cluster_jobs.export import CHECKPOINT_BUCKET_OUTPUT, export_job_id, place_of, step_overrides
from cluster_jobs.request import validate_job_id
from cluster_jobs.table import ACTIVE_STATES
from clusterctl.arguments import JOB_ID_EXAMPLE, AddCommand, non_negative_int
from clusterctl.jobs.submit import _submit, checked_request
from clusterctl.runtime import require_job_table, stack_outputs
from node_bootstrap import jobs as node_jobs

if TYPE_CHECKING:
    from clusterctl.runtime import Runtime


def add_parser(add: AddCommand) -> None:
    parser = add(
        "export",
        "Export a training job's checkpoint as a Hugging Face model directory (config.json, bf16 safetensors "
        "shards with their index, the tokenizer files of its init.hf_dir) that transformers and vLLM load. "
        "It runs as a job of its own, JOB-hf-xxxx, on one node (python -m training.export, no GPU), and takes "
        "the cluster's one-job lock like a submit. Prints its job id, then where the model lands in S3.",
        example=f"clusterctl export {JOB_ID_EXAMPLE} --step 2000",
        epilog="The export job writes /fsx/checkpoints/JOB-hf-xxxx/hf; the data repository association copies "
        "it to s3://<CheckpointBucketName>/JOB-hf-xxxx/hf/ (model.safetensors.index.json is written last). "
        "Refused before anything is sent: a job not in the job table, a job that is not a training job, a job "
        "still active (starting, running, restarting), a --step above the last step the job reached, and "
        "any job while another one is active. A step without a complete checkpoint fails the export job "
        "(clusterctl status and logs say why). If its node is lost, the job keeper starts it again on another "
        "node: the export writes the same files again, the index last. Download and serve it: README, "
        "'Continue training a Llama checkpoint'.",
    )
    parser.add_argument("job_id", metavar="JOB", help="the training job whose checkpoint to export")
    parser.add_argument(
        "--step",
        type=non_negative_int,
        metavar="N",
        help="the checkpoint step to export (default: the newest complete checkpoint of the job)",
    )
    # one process on one node, and no torchrun whose restarts would count (submit's --nodes, --max-restarts)
    parser.set_defaults(handler=export, nodes=1, max_restarts=0)


def export(args: argparse.Namespace, runtime: Runtime) -> int:
    validate_job_id(args.job_id)
    request = checked_request(args, node_jobs.EXPORT_MODULE, "", step_overrides(args.step), args.job_id)
    outputs = stack_outputs(args, runtime)
    table = require_job_table(outputs, runtime, "not exported")
    source = table.get(args.job_id)
    if source is None:
        raise ClusterctlError(f"not exported: no job {args.job_id} in the job table {table.table_name}; the "
                              "jobs there: clusterctl jobs", EXIT_USAGE)
    if source.module != node_jobs.TRAINING_MODULE:
        raise ClusterctlError(f"not exported: job {args.job_id} is a {source.module} job; allowed: a training "
                              "job (its checkpoints are what an export reads)", EXIT_USAGE)
    if source.state in ACTIVE_STATES:
        raise ClusterctlError(f"not exported: job {args.job_id} is still {source.state}; export it once it has "
                              f"ended (clusterctl cancel {args.job_id} stops it with a checkpoint)")
    if args.step is not None and source.last_step is not None and args.step > source.last_step:
        raise ClusterctlError(f"--step={args.step}: job {args.job_id} reached step {source.last_step}; allowed: "
                              f"a step it saved a checkpoint at, {source.last_step} or below", EXIT_USAGE)
    bucket = outputs.outputs.get(CHECKPOINT_BUCKET_OUTPUT)
    if not outputs.checkpoint_root or not bucket:
        raise ClusterctlError(f"not exported: stack {outputs.stack_name} has no output CheckpointRoot or "
                              f"{CHECKPOINT_BUCKET_OUTPUT}: redeploy it with this version (cdk deploy)", EXIT_STACK)

    job_id = export_job_id(args.job_id)
    place = place_of(job_id, job_records.job_checkpoint_dir(outputs.checkpoint_root, job_id), bucket)
    out_dir, s3_uri = place.fsx_dir, place.s3_uri
    which = f"step {args.step}" if args.step is not None else "its newest complete checkpoint"
    started = (f"exporting job {args.job_id}'s {which} to {out_dir} on 1 x {outputs.instance_type}; the model "
               f"lands in {s3_uri} (complete once model.safetensors.index.json is there); follow it with: "
               f"clusterctl status {job_id} and clusterctl logs {job_id} --follow")
    return _submit(args, runtime, request, job_id=job_id, started=started,
                   extra_json={"sourceJobId": args.job_id, "step": args.step, "exportDir": out_dir,
                               "s3Uri": s3_uri})
