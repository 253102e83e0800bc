"""clusterctl export: a training job's checkpoint exported by a job of its own on one node, through submit's
path (the lock, the record, the jobs document); refused in one line before anything is sent for an unknown
job, a job that is not a training job or still runs, and a --step past the job's last step; status shows
what an export exports and where its model lands in S3. moto holds the stack, group, table and SSM."""

import json
import re

import pytest
from job_record_fakes import JOB, lock_holder, put_job

from cluster_aws.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from cluster_constructs.jobs import PARAMETERS
from cluster_jobs.request import JobRequest
from cluster_jobs.table import Attempt

BUCKET = "trainingclusterstack-checkpointbucket-1a2b3c"


@pytest.fixture()
def cluster(moto_aws, fakes):
    return fakes.deploy_fake_cluster(extra_outputs={"CheckpointBucketName": BUCKET})


def ended_training_job(fakes, cluster, state="succeeded", step_reached=140, **changes):
    return put_job(fakes, state, attempts=[Attempt(1, cluster.instance_ids[:2], cluster.private_ips[0],
                                                   "2026-11-20T23:15:02Z", step_reached=step_reached)], **changes)


def test_export_starts_one_process_on_one_node_and_prints_where_the_model_lands(at_now, sent, cluster, fakes):
    ended_training_job(fakes, cluster)
    result = at_now("export", JOB, "--step", "100")
    assert result.code == EXIT_OK, result.err
    export_id, started = result.lines
    assert re.fullmatch(rf"{JOB}-hf-[0-9a-f]{{4}}", export_id)
    assert started == (
        f"exporting job {JOB}'s step 100 to /fsx/checkpoints/{export_id}/hf on 1 x p5.48xlarge; the model lands "
        f"in s3://{BUCKET}/{export_id}/hf/ (complete once model.safetensors.index.json is there); follow it "
        f"with: clusterctl status {export_id} and clusterctl logs {export_id} --follow")
    (command,) = sent
    assert command["InstanceIds"] == cluster.instance_ids[:1]
    # no path is sent: the node makes both from the two job ids
    assert command["Parameters"] == {
        "action": ["start"], "jobId": [export_id], "config": [""], "nodes": ["1"], "gpusPerNode": ["8"],
        "rendezvousHost": [cluster.private_ips[0]], "maxRestarts": ["0"], "overrides": ["step=100"],
        "module": ["training.export"], "resumeFrom": [JOB]}
    for name, (value,) in command["Parameters"].items():  # what the deployed document accepts
        spec = PARAMETERS[name]
        assert value in spec["allowedValues"] if "allowedValues" in spec else re.fullmatch(
            spec["allowedPattern"], value), (name, value)
    record = fakes.job_table().get(export_id)
    assert (record.module, record.resume_from, record.overrides, record.nodes, record.max_restarts) == (
        "training.export", JOB, ["step=100"], 1, 0)
    assert record.checkpoint_dir == f"/fsx/checkpoints/{export_id}"
    assert lock_holder() == export_id  # the cluster's one job, like any submit


def test_without_a_step_the_export_takes_the_newest_complete_checkpoint(at_now, sent, cluster, fakes):
    ended_training_job(fakes, cluster, state="failed")  # a failed job's checkpoints are exported as well
    result = at_now("export", JOB, "--json")
    assert result.code == EXIT_OK, result.err
    report = json.loads(result.out)
    export_id = report["jobId"]
    assert (report["sourceJobId"], report["step"], report["nodes"]) == (JOB, None, cluster.instance_ids[:1])
    assert report["exportDir"] == f"/fsx/checkpoints/{export_id}/hf" and report["checkpointDir"] == (
        f"/fsx/checkpoints/{export_id}")
    assert report["s3Uri"] == f"s3://{BUCKET}/{export_id}/hf/"
    assert sent[0]["Parameters"]["overrides"] == [""]


@pytest.mark.parametrize(
    ("setup", "argv", "code", "message"),
    [
        (None, [JOB], EXIT_USAGE,
         f"not exported: no job {JOB} in the job table TrainingClusterStack-JobTable-Q1w2E3; the jobs there: "
         "clusterctl jobs"),
        ({"state": "running"}, [JOB], EXIT_FAILED,
         f"not exported: job {JOB} is still running; export it once it has ended (clusterctl cancel {JOB} "
         "stops it with a checkpoint)"),
        ({"module": "training.commcheck"}, [JOB], EXIT_USAGE,
         f"not exported: job {JOB} is a training.commcheck job; allowed: a training job (its checkpoints are "
         "what an export reads)"),
        ({}, [JOB, "--step", "150"], EXIT_USAGE,
         f"--step=150: job {JOB} reached step 140; allowed: a step it saved a checkpoint at, 140 or below"),
        ({}, ["j-20261120-231502-AB12"], EXIT_USAGE, "job id 'j-20261120-231502-AB12': allowed:"),
    ],
)
def test_a_bad_export_is_refused_in_one_line_before_anything_is_sent(cli, sent, cluster, fakes, setup, argv,
                                                                      code, message):
    if setup is not None:
        ended_training_job(fakes, cluster, **{"state": "succeeded", **setup})
    before = [r.job_id for r in fakes.job_table().jobs()]
    result = cli("export", *argv)
    assert (result.code, result.out) == (code, "")
    assert result.err.startswith(f"clusterctl: error: {message}") and result.err.count("\n") == 1
    assert sent == [] and [r.job_id for r in fakes.job_table().jobs()] == before


def test_a_negative_step_is_refused_by_the_parser(cli, sent, cluster, fakes, capsys):
    with pytest.raises(SystemExit) as exit_info:
        cli("export", JOB, "--step", "-1")
    assert exit_info.value.code == EXIT_USAGE and sent == []
    assert capsys.readouterr().err.endswith("clusterctl export: error: argument --step: -1: must be 0 or more\n")


def test_an_export_while_another_job_is_active_is_refused_like_a_second_submit(cli, sent, cluster, fakes):
    ended_training_job(fakes, cluster)
    other = "j-20261120-233000-cd34"
    put_job(fakes, "running", job_id=other)
    result = cli("export", JOB)
    assert result.code == EXIT_FAILED
    assert result.err.startswith(f"clusterctl: error: not submitted: job {other} (running) is active on this "
                                 "cluster, and a cluster runs one job at a time")
    assert sent == [] and lock_holder() == other


def test_status_shows_what_an_export_exports_and_where_its_model_lands(at_now, sent, cluster, fakes):
    ended_training_job(fakes, cluster)
    export_id = at_now("export", JOB, "--step", "100").lines[0]

    def node_answer(parsed, **_):  # moto answers with empty output; the node prints the job's status
        parsed["StandardOutputContent"] = json.dumps({
            "jobId": export_id, "state": "succeeded", "exitCode": 0, "startedAt": "2026-11-20T23:15:04Z",
            "endedAt": "2026-11-20T23:16:10Z", "lastStep": None, "lastLoss": None, "module": "training.export"})

    at_now.context.client("ssm").meta.events.register("after-call.ssm.GetCommandInvocation", node_answer)
    shown = at_now("status", export_id)
    assert shown.code == EXIT_OK, shown.err
    assert f"export: job {JOB}'s checkpoint, step 100 -> /fsx/checkpoints/{export_id}/hf" in shown.lines
    # the record still says starting (the keeper records the end at its next round); the node says succeeded
    assert (f"model: s3://{BUCKET}/{export_id}/hf/ (the data repository association copies it from "
            f"/fsx/checkpoints/{export_id}/hf; complete once model.safetensors.index.json and every file it "
            "names are there)") in shown.lines
    assert "checkpoints:" not in shown.out
    report = json.loads(at_now("status", export_id, "--json").out)
    assert (report["exportDir"], report["exportS3Uri"]) == (f"/fsx/checkpoints/{export_id}/hf",
                                                            f"s3://{BUCKET}/{export_id}/hf/")
    fakes.end_job(export_id, state="failed", reason="the trainer exited with code 2 on every node")
    at_now.context.client("ssm").meta.events.unregister("after-call.ssm.GetCommandInvocation", node_answer)
    failed = at_now("status", export_id)
    assert not any(line.startswith("model:") for line in failed.lines)  # a failed export names no model


def test_the_keeper_restarts_an_export_with_the_same_request():
    """What job_keeper.keeper sends for attempt 2 of an export record: the same source and step, which the
    node turns into the same paths (the export writes the same files again, the index last)."""
    request = JobRequest(config="", nodes=1, gpus_per_node=8, max_restarts=0, overrides=("step=100",),
                         module="training.export", resume_from=JOB, attempt=2)
    request.validate()
    assert request.parameters(f"{JOB}-hf-9f3c", "10.42.1.5") == {
        "action": ["start"], "jobId": [f"{JOB}-hf-9f3c"], "config": [""], "nodes": ["1"], "gpusPerNode": ["8"],
        "rendezvousHost": ["10.42.1.5"], "maxRestarts": ["0"], "overrides": ["step=100"],
        "module": ["training.export"], "resumeFrom": [JOB], "attempt": ["2"]}
