"""Fakes for the tests of submit, jobs, status and cancel on the job table: jobs written into the table through
its own operations (as submit and the keeper leave them), the holder of the table's lock, and SSM answers
(Stubber responses) shaped like node_bootstrap.jobs' output."""

import dataclasses
import datetime
import json
from pathlib import Path

import boto3
from botocore.stub import ANY

from cluster_jobs.table import LOCK_KEY, JobRecord
from instance_catalog.instance_types import get_instance_type

REPO = Path(__file__).resolve().parents[1]
NOW = datetime.datetime(2026, 11, 20, 23, 15, 2, tzinfo=datetime.UTC)
JOB = "j-20261120-231502-ab12"
COMMAND_ID = "11111111-2222-3333-4444-555555555555"
TINY = "training/configs/tiny-cpu.toml"
P5_USD = get_instance_type("p5.48xlarge").on_demand_usd_per_hour


def lock_holder():
    item = boto3.client("dynamodb", region_name="us-east-1").get_item(
        TableName="TrainingClusterStack-JobTable-Q1w2E3", Key={"pk": {"S": LOCK_KEY}}).get("Item")
    return item["jobId"]["S"] if item else None


def answer(instance_id, payload, status="Success", code=0):
    return {"CommandId": COMMAND_ID, "InstanceId": instance_id, "Status": status, "ResponseCode": code,
            "StandardOutputContent": json.dumps(payload) + "\n", "StandardErrorContent": ""}


def running(job_id, step=None, loss=None, started="2026-11-20T23:15:05Z"):
    """What node_bootstrap.jobs status prints for a running job (start prints the same status)."""
    return {"jobId": job_id, "state": "running", "exitCode": None, "startedAt": started, "endedAt": None,
            "pid": 4242, "supervisorPid": 4241, "lastStep": step, "lastLoss": loss, "module": "training",
            "ncclNetwork": "Libfabric" if step else None, "ncclProvider": "efa" if step else None}


def expect(stub, fakes, action, job_id, answers, parameters=None):
    """One SendCommand of `action` to exactly the nodes of `answers` ({instance id: payload}), and their
    answers."""
    instance_ids = list(answers)
    stub.add_response(
        "send_command",
        {"Command": {"CommandId": COMMAND_ID}},
        {"DocumentName": fakes.DOCUMENT, "DocumentVersion": "$DEFAULT", "InstanceIds": instance_ids,
         "Parameters": parameters or {"action": [action], "jobId": [job_id]},
         "Comment": f"clusterctl {action} {job_id}", "TimeoutSeconds": ANY},
    )
    for instance_id, payload in answers.items():
        stub.add_response("get_command_invocation", answer(instance_id, payload),
                          {"CommandId": COMMAND_ID, "InstanceId": instance_id})


def put_job(fakes, state="running", job_id=JOB, attempts=None, **changes):
    """A job as the keeper leaves it, written through the job table's own operations."""
    table = fakes.job_table()
    record = JobRecord(
        job_id=job_id, module="training", config=TINY, config_text="", overrides=[], resume_from="", nodes=2,
        gpus_per_node=8, max_restarts=3, max_job_restarts=5, instance_type="p5.48xlarge",
        checkpoint_dir=f"/fsx/checkpoints/{job_id}", state="starting", created_at=job_id_time(job_id),
        updated_at=job_id_time(job_id), attempts=attempts or [],
    )
    created = table.create(record)
    return table.save(dataclasses.replace(created, state=state, **changes), NOW)


def job_id_time(job_id):
    return datetime.datetime.strptime(job_id[2:17], "%Y%m%d-%H%M%S").strftime("%Y-%m-%dT%H:%M:%SZ")
