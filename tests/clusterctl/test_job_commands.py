"""submit, jobs, status and cancel on the job table: the stack, group, instances and the table in moto; SSM in
moto (submit) or through a Stubber fed with answers shaped like node_bootstrap.jobs' (status, cancel)."""

import dataclasses
import datetime
import json
from pathlib import Path

import boto3
import pytest
from botocore.stub import ANY

from cluster_constructs.instance_types import get_instance_type
from clusterctl.aws import EXIT_FAILED, EXIT_OK, EXIT_STACK, EXIT_USAGE, ClusterctlError
from clusterctl.job_table import LOCK_KEY, Attempt, JobRecord, NodeReport
from clusterctl.jobs import JobRequest

REPO = Path(__file__).resolve().parents[2]
NOW = datetime.datetime(2026, 11, 20, 23, 15, 2, tzinfo=datetime.UTC)
JOB = "j-20261120-231502-ab12"
COMMAND_ID = "11111111-2222-3333-4444-555555555555"
TINY = "training/configs/tiny-cpu.toml"
P5_USD = get_instance_type("p5.48xlarge").on_demand_usd_per_hour


@pytest.fixture()
def at_now(cli):
    cli.now = NOW
    return cli


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


# --- submit ------------------------------------------------------------------------------------------------


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
    result = cli("submit", "--config", TINY, "--nodes", "2")
    assert result.code == EXIT_FAILED
    ((record, holder),) = seen
    assert result.lines == [record.job_id]
    reason = (f"attempt 1 did not start on 1 of 2 nodes ({b}: the job's checkpoint directory /fsx/checkpoints/x "
              "exists and is not a directory)")
    assert result.err == (
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


# --- jobs --------------------------------------------------------------------------------------------------


def test_jobs_lists_the_newest_first_with_attempts_steps_and_cost(at_now, cluster, fakes):
    a, b, c = cluster.instance_ids
    put_job(fakes, "succeeded", job_id="j-20261119-080000-aaaa", ended_at="2026-11-19T10:00:00Z",
            attempts=[Attempt(1, [a, b], "10.42.1.4", "2026-11-19T08:00:00Z", step_reached=500)])
    put_job(fakes, "running", attempts=[
        Attempt(1, [a, b], "10.42.1.4", "2026-11-20T21:15:02Z", ended_at="2026-11-20T22:15:02Z",
                end_reason=f"node {b} terminated", step_reached=120),
        Attempt(2, [a, c], "10.42.1.4", "2026-11-20T22:45:02Z", resumed_from_step=100, step_reached=140),
    ])
    result = at_now("jobs")
    assert result.code == EXIT_OK, result.err
    header, newest, oldest, footer = result.lines
    assert header.split() == ["JOB", "STATE", "ATTEMPT", "NODES", "STARTED", "STEP", "COST", "SO", "FAR"]
    # 2 nodes for 1 h, then 2 nodes for the 30 min until now; the ended job: 2 nodes for 2 h
    assert newest.split() == [JOB, "running", "2", "2", "2026-11-20T23:15:02Z", "140", f"${3 * P5_USD:,.2f}"]
    assert oldest.split() == ["j-20261119-080000-aaaa", "succeeded", "1", "2", "2026-11-19T08:00:00Z", "500",
                              f"${4 * P5_USD:,.2f}"]
    assert footer == f"active: {JOB} (running); a cluster runs one job at a time"

    assert at_now("jobs", "--limit", "1").lines[2:] == [
        "the newest 1 of 2 jobs: --limit 2 shows them all",
        f"active: {JOB} (running); a cluster runs one job at a time",
    ]
    limited = at_now("jobs", "--limit", "1", "--json")
    report = json.loads(limited.out)
    assert report["activeJobId"] == JOB and [j["job_id"] for j in report["jobs"]] == [JOB]
    (job,) = report["jobs"]
    assert (job["attempt"], job["last_step"], job["cost_so_far_usd"]) == (2, 140, round(3 * P5_USD, 2))
    assert [x["steps_lost"] for x in job["attempts"]] == [20, None]
    assert job["attempts"][0]["end_reason"] == f"node {b} terminated"


def test_cost_of_a_recorded_job_counts_every_attempts_nodes(at_now, cluster, fakes):
    a, b, c = cluster.instance_ids
    put_job(fakes, "running", attempts=[
        Attempt(1, [a, b], "10.42.1.4", "2026-11-20T21:15:02Z", ended_at="2026-11-20T22:15:02Z"),
        Attempt(2, [a, c], "10.42.1.4", "2026-11-20T22:45:02Z"),
    ])
    result = at_now("cost", "--job", JOB)  # no SSM call: the record has every attempt's nodes
    assert result.code == EXIT_OK, result.err
    assert result.lines[0] == (f"job {JOB} so far (2 attempts in the job table, 3.00 node-hours): 2 x p5.48xlarge "
                               f"for 1.50 h = ${3 * P5_USD:,.2f} (${2 * P5_USD:,.2f}/h, 24 GPU-hours)")


def test_jobs_of_an_empty_table_and_no_active_job(cli, cluster, fakes):
    assert cli("jobs").lines == [f"no jobs in the job table {fakes.JOB_TABLE} yet"]
    put_job(fakes, "cancelled")
    assert cli("jobs").lines[-1] == "no active job: the cluster takes the next submit"


# --- status ------------------------------------------------------------------------------------------------


def two_attempts(cluster):
    a, b, c = cluster.instance_ids
    return [
        Attempt(1, [a, b], cluster.private_ips[0], "2026-11-20T23:15:02Z", ended_at="2026-11-20T23:40:00Z",
                end_reason=f"node {b} terminated (Auto Scaling: EC2 Instance Terminate Successful)",
                step_reached=120, resumed_from_step=0),
        Attempt(2, [a, c], cluster.private_ips[0], "2026-11-20T23:48:00Z", resumed_from_step=100),
    ]


def test_status_shows_every_attempt_above_the_current_nodes_and_records_their_answers(cli, cluster, fakes,
                                                                                       ssm_stub):
    a, b, c = cluster.instance_ids
    put_job(fakes, "running", attempts=two_attempts(cluster), reason=f"restarted: node {b} terminated")
    expect(ssm_stub, fakes, "status", JOB, {a: running(JOB, 140, 2.5), c: running(JOB, 139, 2.5)})
    result = cli("status", JOB)
    assert result.code == EXIT_OK, result.err
    lines = result.lines
    assert lines[0] == (f"job {JOB}: running, attempt 2 (restarts: 1 of at most 5); training {TINY} on 2 x "
                        "p5.48xlarge")
    assert lines[1] == f"reason: restarted: node {b} terminated"
    assert lines[2] == f"checkpoints: /fsx/checkpoints/{JOB}"
    assert lines[3].split() == ["ATTEMPT", "NODES", "RENDEZVOUS", "STARTED", "ENDED", "STEP", "RESUMED", "FROM",
                                "STEPS", "LOST", "REASON"]
    assert lines[4].split()[:8] == ["1", "2", cluster.private_ips[0], "2026-11-20T23:15:02Z",
                                    "2026-11-20T23:40:00Z", "120", "0", "20"]
    assert lines[4].endswith(f"node {b} terminated (Auto Scaling: EC2 Instance Terminate Successful)")
    assert lines[5].split() == ["2", "2", cluster.private_ips[0], "2026-11-20T23:48:00Z", "-", "140", "100", "-",
                                "-"]
    assert lines[6:8] == [f"attempt 1 nodes: {a}, {b}", f"attempt 2 nodes: {a}, {c}"]
    assert lines[8] == ""
    assert lines[9].split()[0] == "INSTANCE"
    assert [line.split()[:6] for line in lines[10:12]] == [[a, "running", "-", "140", "2.5", "Libfabric/efa"],
                                                           [c, "running", "-", "139", "2.5", "Libfabric/efa"]]
    assert lines[12] == "attempt 2's nodes: running (2 nodes)"

    record = fakes.job_table().get(JOB)
    assert record.current.step_reached == 140 and record.attempts[0].node_reports == []
    assert record.current.node_reports == [
        NodeReport(a, "running", last_step=140, started_at="2026-11-20T23:15:05Z"),
        NodeReport(c, "running", last_step=139, started_at="2026-11-20T23:15:05Z"),
    ]


def test_status_json_has_the_record_and_the_nodes(cli, cluster, fakes, ssm_stub):
    a, _, c = cluster.instance_ids
    put_job(fakes, "restarting", attempts=two_attempts(cluster))
    expect(ssm_stub, fakes, "status", JOB, {a: running(JOB, 130, 2.6), c: running(JOB, 131, 2.6)})
    report = json.loads(cli("status", JOB, "--json").out)
    assert (report["state"], report["nodesState"]) == ("restarting", "running")
    assert [n["instance_id"] for n in report["nodes"]] == [a, c]
    assert report["record"]["attempts"][1]["step_reached"] == 131
    assert [x["steps_lost"] for x in report["record"]["attempts"]] == [20, None]


def test_status_leaves_the_record_to_the_keeper_when_it_wrote_in_between(cli, cluster, fakes, ssm_stub):
    a, _, c = cluster.instance_ids
    put_job(fakes, "running", attempts=two_attempts(cluster))

    def keeper_writes(**_):
        table = fakes.job_table()
        table.save(dataclasses.replace(table.get(JOB), state="restarting", reason="node lost"), NOW)

    ssm_stub.client.meta.events.register("provide-client-params.ssm.SendCommand", keeper_writes)
    expect(ssm_stub, fakes, "status", JOB, {a: running(JOB, 150), c: running(JOB, 150)})
    result = cli("status", JOB)
    assert result.code == EXIT_OK, result.err
    assert result.lines[0].startswith(f"job {JOB}: running, attempt 2")  # as read; the copy was skipped
    record = fakes.job_table().get(JOB)
    assert (record.state, record.reason, record.current.node_reports) == ("restarting", "node lost", [])


def test_status_of_a_job_whose_current_nodes_are_gone_shows_the_record(cli, cluster, fakes, ssm_stub):
    a, _, c = cluster.instance_ids
    put_job(fakes, "restarting", attempts=two_attempts(cluster))
    boto3.client("ec2", region_name="us-east-1").terminate_instances(InstanceIds=[a, c])
    result = cli("status", JOB)  # no SendCommand: nothing is left to ask
    assert result.code == EXIT_OK, result.err
    assert result.lines[-1] == "attempt 2's nodes: gone (2 nodes, 2 gone (replaced))"
    assert [r.state for r in fakes.job_table().get(JOB).current.node_reports] == ["gone", "gone"]


# --- cancel ------------------------------------------------------------------------------------------------


def cancelled_answer(job_id):
    return {**running(job_id, 150), "state": "cancelled", "exitCode": 0, "endedAt": "2026-11-20T23:59:00Z",
            "cancel": "stopped by SIGTERM"}


def test_cancel_marks_the_record_first_then_stops_the_current_attempts_nodes(cli, cluster, fakes, ssm_stub):
    cli.now = NOW + datetime.timedelta(hours=1)
    a, _, c = cluster.instance_ids
    put_job(fakes, "running", attempts=two_attempts(cluster))
    seen = []
    ssm_stub.client.meta.events.register("provide-client-params.ssm.SendCommand",
                                         lambda **_: seen.append((fakes.job_table().get(JOB).state, lock_holder())))
    # the current attempt's nodes, not b (attempt 1's, replaced) nor SSM's history
    expect(ssm_stub, fakes, "cancel", JOB, {a: cancelled_answer(JOB), c: cancelled_answer(JOB)},
           {"action": ["cancel"], "jobId": [JOB], "cancelTimeoutSeconds": ["30"]})
    result = cli("cancel", JOB, "--timeout-seconds", "30")
    assert result.code == EXIT_OK, result.err
    assert seen == [("cancelled", None)]  # recorded, and the lock given back, before anything was sent
    assert result.lines[0] == (f"job {JOB}: recorded as cancelled (it will not be restarted); stopping attempt 2 "
                               "on its 2 nodes")
    assert result.lines[-1] == "attempt 2's nodes: cancelled (2 nodes)"
    record = fakes.job_table().get(JOB)
    assert (record.state, record.cancel_requested_by, record.reason, record.ended_at) == (
        "cancelled", "clusterctl cancel", "cancelled with clusterctl cancel", "2026-11-21T00:15:02Z")
    assert (record.current.ended_at, record.current.end_reason) == ("2026-11-21T00:15:02Z",
                                                                    "cancelled with clusterctl cancel")
    assert record.attempts[0].end_reason.startswith(f"node {cluster.instance_ids[1]} terminated")  # kept
    # the nodes' last answers are copied in after the stop
    assert [(r.instance_id, r.state, r.exit_code, r.last_step) for r in record.current.node_reports] == [
        (a, "cancelled", 0, 150), (c, "cancelled", 0, 150)]
    assert record.last_step == 150 and lock_holder() is None


def test_cancel_during_a_restart_retries_on_the_keepers_write_and_stops_its_new_attempt(cli, cluster, fakes,
                                                                                         ssm_stub):
    a, b, c = cluster.instance_ids
    put_job(fakes, "restarting", attempts=two_attempts(cluster)[:1])
    writes = []

    def keeper_starts_attempt_2(**_):  # between cancel's read and its write, once
        if not writes:
            table = fakes.job_table()
            read = table.get(JOB)
            writes.append(table.save(dataclasses.replace(read, state="running", attempts=two_attempts(cluster)),
                                     NOW))

    dynamodb = cli.context.client("dynamodb")
    dynamodb.meta.events.register("provide-client-params.dynamodb.TransactWriteItems", keeper_starts_attempt_2)
    dynamodb.meta.events.register("provide-client-params.dynamodb.PutItem", keeper_starts_attempt_2)
    expect(ssm_stub, fakes, "cancel", JOB, {a: cancelled_answer(JOB), c: cancelled_answer(JOB)},
           {"action": ["cancel"], "jobId": [JOB], "cancelTimeoutSeconds": ["120"]})
    result = cli("cancel", JOB, "--json")
    assert result.code == EXIT_OK, result.err
    assert len(writes) == 1
    report = json.loads(result.out)
    assert (report["state"], report["sent"], report["record"]["attempt"]) == ("cancelled", True, 2)
    assert fakes.job_table().get(JOB).state == "cancelled" and lock_holder() is None


def test_cancel_of_an_ended_job_says_so_and_sends_nothing(cli, cluster, fakes, ssm_stub):
    put_job(fakes, "failed", attempts=two_attempts(cluster)[:1], reason="restart limit reached (5)")
    result = cli("cancel", JOB)  # the Stubber has no answer queued: any SSM call would fail the test
    assert (result.code, result.err) == (EXIT_OK, "")
    assert result.lines == [f"job {JOB} already ended (failed: restart limit reached (5)); nothing sent"]
    assert fakes.job_table().get(JOB).state == "failed"
