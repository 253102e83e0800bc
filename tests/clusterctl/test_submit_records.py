"""submit on the job table: the record (and the table's lock) written before any node is touched, then the
nodes' answers; one active job at a time, locks left behind, stacks deployed before the job table or the
checkpoint root, commcheck recorded like a job, and a start that fails or errors. The stack, group, instances
and the table in moto; SSM in moto, or through a Stubber where a start fails."""

import dataclasses
import json

import boto3
import pytest
from botocore.stub import ANY
from job_record_fakes import COMMAND_ID, JOB, NOW, REPO, TINY, answer, lock_holder, put_job, running

from cluster_aws.errors import EXIT_FAILED, EXIT_OK, EXIT_STACK, EXIT_USAGE, ClusterctlError
from cluster_jobs.request import JobRequest
from cluster_jobs.table import LOCK_KEY, Attempt, JobRecord, NodeReport


def test_submit_writes_the_record_before_any_node_is_touched(at_now, sent, cluster, fakes):
    cli = at_now
    seen_at_send = []
    cli.context.client("ssm").meta.events.register(
        "provide-client-params.ssm.SendCommand",
        lambda params, **_: seen_at_send.append((fakes.job_table().get(params["Parameters"]["jobId"][0]),
                                                 lock_holder())))
    result = cli("submit", "--config", TINY, "--set", "optim.lr=3e-4", "--set", "run.steps=100",
                 "--max-restarts", "2")
    assert result.code == EXIT_OK, result.err
    job_id = result.lines[0]
    assert job_id.startswith("j-20261120-231502-")
    ((record, holder),) = seen_at_send  # read from the table when the start command was sent
    assert holder == job_id
    assert record == JobRecord(
        job_id=job_id,
        module="training",
        config=TINY,
        config_text=(REPO / TINY).read_text(),
        overrides=["optim.lr=3e-4", "run.steps=100"],
        resume_from="",
        nodes=3,
        gpus_per_node=8,
        max_restarts=2,
        max_job_restarts=fakes.MAX_JOB_RESTARTS,
        instance_type="p5.48xlarge",
        checkpoint_dir=f"/fsx/checkpoints/{job_id}",  # the stack's CheckpointRoot + the job id, as the nodes
        state="starting",
        created_at="2026-11-20T23:15:02Z",
        updated_at="2026-11-20T23:15:02Z",
        attempts=[Attempt(1, cluster.instance_ids, cluster.private_ips[0], "2026-11-20T23:15:02Z")],
        fp8_backend="none",  # what tiny-cpu.toml runs; `clusterctl status` shows it
        version=1,
    )
    (command,) = sent
    assert "attempt" not in command["Parameters"]  # the first attempt is the document's default


def test_a_started_job_is_recorded_running_with_the_nodes_answers(at_now, sent, cluster, fakes):
    cli = at_now

    def start_answer(parsed, **_):  # moto answers every invocation with empty output; a node prints its status
        job_id = sent[-1]["Parameters"]["jobId"][0]
        parsed["StandardOutputContent"] = json.dumps(running(job_id, started="2026-11-20T23:15:04Z"))

    cli.context.client("ssm").meta.events.register("after-call.ssm.GetCommandInvocation", start_answer)
    result = cli("submit", "--config", TINY, "--nodes", "2", "--json")
    assert result.code == EXIT_OK, result.err
    report = json.loads(result.out)
    assert report["failed"] == {} and report["jobTable"] == fakes.JOB_TABLE
    assert report["checkpointDir"] == f"/fsx/checkpoints/{report['jobId']}"
    record = fakes.job_table().get(report["jobId"])
    assert (record.state, record.version) == ("running", 2)
    assert record.current.node_reports == [
        NodeReport(i, "running", started_at="2026-11-20T23:15:04Z") for i in cluster.instance_ids[:2]
    ]


def test_a_second_submit_is_refused_while_a_job_is_active(cli, sent, cluster, fakes):
    first = cli("submit", "--config", TINY)
    assert first.code == EXIT_OK, first.err
    job_id = first.lines[0]
    for argv in (("submit", "--config", TINY), ("commcheck",)):
        refused = cli(*argv)
        assert refused.code == EXIT_FAILED and refused.out == ""
        assert refused.err == (
            f"clusterctl: error: not submitted: job {job_id} (running) is active on this cluster, and a cluster "
            f"runs one job at a time; stop it with: clusterctl cancel {job_id} (several jobs at once: deploy "
            "several stacks)\n"
        )
    assert len(sent) == 1  # nothing reached a node
    assert [r.job_id for r in fakes.job_table().jobs()] == [job_id] and lock_holder() == job_id

    fakes.end_job(job_id)
    after = cli("submit", "--config", TINY)
    assert after.code == EXIT_OK and lock_holder() == after.lines[0] != job_id


def test_a_restarting_job_refuses_a_submit_before_the_nodes_are_looked_at(cli, sent, cluster, fakes):
    put_job(fakes, "restarting", attempts=[Attempt(1, cluster.instance_ids[:2], cluster.private_ips[0],
                                                   "2026-11-20T23:15:02Z")])
    cluster.tag(0, **{"cluster:bootstrap": "running"})  # its replacement is still booting
    refused = cli("submit", "--config", TINY)
    assert refused.code == EXIT_FAILED
    assert refused.err.startswith(f"clusterctl: error: not submitted: job {JOB} (restarting) is active")
    assert sent == []


@pytest.mark.parametrize("record", ["ended", "deleted"])
def test_a_lock_left_behind_by_an_ended_job_is_given_back_at_the_next_submit(cli, sent, cluster, fakes, record):
    dead = "j-20261119-000000-dead"
    if record == "ended":
        put_job(fakes, "failed", job_id=dead)  # its final save gave the lock back
    # ... and then the lock came back (written by hand), or the record was deleted by hand: a lock no job holds
    boto3.client("dynamodb", region_name="us-east-1").put_item(
        TableName=fakes.JOB_TABLE, Item={"pk": {"S": LOCK_KEY}, "jobId": {"S": dead}})
    result = cli("submit", "--config", TINY)
    assert result.code == EXIT_OK, result.err
    assert lock_holder() == result.lines[0]


def test_a_stack_without_the_job_table_is_refused_and_told_to_redeploy(cli, sent, moto_aws, fakes):
    fakes.deploy_fake_cluster(job_table=False)
    line = ("stack TrainingClusterStack predates the job table (no output JobTableName): redeploy it with this "
            "version (cdk deploy), then every job is recorded, one runs at a time, and a job that loses a node "
            "is restarted")
    for argv, refused in ((("submit", "--config", TINY), "not submitted"), (("commcheck",), "not submitted"),
                          (("jobs",), "no jobs to list")):
        result = cli(*argv)
        assert (result.code, result.out) == (EXIT_STACK, "")
        assert result.err == f"clusterctl: error: {refused}: {line}\n"
    assert sent == []


def test_a_config_on_the_nodes_is_recorded_by_its_path_and_the_submit_says_so(at_now, sent, cluster, fakes):
    result = at_now("submit", "--config", "/fsx/configs/run.toml", "--set", "run.steps=10")
    assert result.code == EXIT_OK, result.err
    record = fakes.job_table().get(result.lines[0])
    assert (record.config, record.config_text, record.overrides) == ("/fsx/configs/run.toml", "", ["run.steps=10"])
    assert result.err == (
        f"clusterctl: note: /fsx/configs/run.toml is a path on the nodes: job {record.job_id}'s record keeps the "
        "path, not the content\n"
    )


def test_a_commcheck_is_recorded_like_a_job(at_now, sent, cluster, fakes):
    result = at_now("commcheck", "--nodes", "2", "--min-busbw-gbps", "400")
    assert result.code == EXIT_OK, result.err
    record = fakes.job_table().get(result.lines[0])
    assert (record.module, record.config, record.config_text, record.overrides, record.checkpoint_dir,
            record.max_restarts, record.nodes) == ("training.commcheck", "", "", ["min_busbw_gbps=400.0"], "", 0, 2)
    assert record.attempts[0].nodes == cluster.instance_ids[:2]


def test_the_checkpoint_dir_is_the_nodes_rule_when_the_stack_outputs_the_root(at_now, sent, moto_aws, fakes):
    fakes.deploy_fake_cluster(checkpoint_root="/lustre/checkpoints/")
    result = at_now("submit", "--config", TINY, "--resume-from", "j-20261119-101500-0a0b")
    assert result.code == EXIT_OK, result.err
    record = fakes.job_table().get(result.lines[0])
    assert record.checkpoint_dir == f"/lustre/checkpoints/{record.job_id}"  # node_bootstrap.jobs.checkpoint_dir
    assert record.resume_from == "j-20261119-101500-0a0b"


def test_a_stack_deployed_before_the_checkpoint_root_output_records_no_checkpoint_dir(at_now, sent, moto_aws,
                                                                                     fakes):
    fakes.deploy_fake_cluster(checkpoint_root=None)
    result = at_now("submit", "--config", TINY)
    assert result.code == EXIT_OK, result.err
    assert fakes.job_table().get(result.lines[0]).checkpoint_dir == ""


def test_a_start_that_fails_on_a_node_is_recorded_failed_and_stopped_where_it_started(cli, cluster, fakes,
                                                                                        ssm_stub):
    cli.now = NOW
    a, b = cluster.instance_ids[:2]
    ssm_stub.add_response("send_command", {"Command": {"CommandId": COMMAND_ID}},
                          {"DocumentName": fakes.DOCUMENT, "DocumentVersion": "$DEFAULT", "InstanceIds": [a, b],
                           "Parameters": ANY, "Comment": ANY, "TimeoutSeconds": ANY})
    ssm_stub.add_response("get_command_invocation", answer(a, running("x")))
    ssm_stub.add_response("get_command_invocation", answer(
        b, {"error": "the job's checkpoint directory /fsx/checkpoints/x exists and is not a directory"},
        "Failed", 1))
    seen = []

    def at_send(params, **_):  # the record and the lock when the stop is sent
        if params["Parameters"]["action"] == ["cancel"]:
            seen.append((next(fakes.job_table().jobs()), lock_holder()))

    ssm_stub.client.meta.events.register("provide-client-params.ssm.SendCommand", at_send)
    ssm_stub.add_response("send_command", {"Command": {"CommandId": COMMAND_ID}},
                          {"DocumentName": fakes.DOCUMENT, "DocumentVersion": "$DEFAULT", "InstanceIds": [a],
                           "Parameters": {"action": ["cancel"], "jobId": ANY, "cancelTimeoutSeconds": ["120"]},
                           "Comment": ANY, "TimeoutSeconds": ANY})
    ssm_stub.add_response("get_command_invocation", answer(a, {**running("x"), "state": "cancelled",
                                                               "exitCode": 0, "cancel": "stopped by SIGTERM"}))
    result = cli("submit", "--config", TINY, "--nodes", "2", "--set", "checkpoint.interval_steps=50")
    assert result.code == EXIT_FAILED
    ((record, holder),) = seen
    assert result.lines == [record.job_id]
    reason = (f"attempt 1 did not start on 1 of 2 nodes ({b}: the job's checkpoint directory /fsx/checkpoints/x "
              "exists and is not a directory)")
    assert result.err == (  # (an interval below run.steps: no warning about saves before the line)
        f"clusterctl: error: job {record.job_id}: {reason}; recorded as failed; stopped where it started ({a})\n"
    )
    assert holder is None  # the lock was given back before the stop
    assert (record.state, record.reason, record.ended_at) == ("failed", reason, "2026-11-20T23:15:02Z")
    assert (record.current.ended_at, record.current.end_reason) == ("2026-11-20T23:15:02Z", reason)


def test_a_start_that_errors_gives_the_lock_back(cli, cluster, fakes, ssm_stub):
    ssm_stub.add_client_error("send_command", "AccessDeniedException", "not allowed: ssm:SendCommand")
    result = cli("submit", "--config", TINY)
    assert result.code == 5  # access denied
    (record,) = fakes.job_table().jobs()
    assert record.state == "failed" and record.reason.startswith(
        "attempt 1 did not start: An error occurred (AccessDeniedException) when calling the SendCommand")
    assert lock_holder() is None


def test_the_attempt_is_sent_only_after_the_first():
    request = JobRequest(config=TINY, nodes=2, gpus_per_node=8, max_restarts=3)
    assert "attempt" not in request.parameters(JOB, "10.42.1.4")
    again = dataclasses.replace(request, attempt=2)
    again.validate()
    assert again.parameters(JOB, "10.42.1.5")["attempt"] == ["2"]
    for bad in (0, 1001):
        with pytest.raises(ClusterctlError) as refused:
            dataclasses.replace(request, attempt=bad).validate()
        assert (str(refused.value), refused.value.exit_code) == (f"attempt={bad}: allowed: 1-1000", EXIT_USAGE)
