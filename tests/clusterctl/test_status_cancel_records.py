"""status and cancel of a job in the job table: status shows every attempt above the current attempt's nodes
and copies their answers into the record (unless the keeper wrote in between); cancel records the job
cancelled and gives the lock back before it stops the current attempt's nodes. The stack, group, instances
and the table in moto; SSM through a Stubber fed with answers shaped like node_bootstrap.jobs'."""

import dataclasses
import datetime
import json

import boto3
from job_record_fakes import JOB, NOW, TINY, expect, lock_holder, put_job, running

from cluster_aws.errors import EXIT_OK
from cluster_jobs.table import Attempt, NodeReport


def two_attempts(cluster):
    a, b, c = cluster.instance_ids
    return [
        Attempt(1, [a, b], cluster.private_ips[0], "2026-11-20T23:15:02Z", ended_at="2026-11-20T23:40:00Z",
                end_reason=f"node {b} terminated (Auto Scaling: EC2 Instance Terminate Successful)",
                step_reached=120, resumed_from_step=0),
        Attempt(2, [a, c], cluster.private_ips[0], "2026-11-20T23:48:00Z", resumed_from_step=100,
                resumed_from_tier="local"),
    ]


def test_status_shows_every_attempt_above_the_current_nodes_and_records_their_answers(cli, cluster, fakes,
                                                                                       ssm_stub):
    a, b, c = cluster.instance_ids
    put_job(fakes, "running", attempts=two_attempts(cluster), reason=f"restarted: node {b} terminated")
    expect(ssm_stub, fakes, "status", JOB, {a: running(JOB, 140, 2.5), c: running(JOB, 139, 2.5)})
    cli.now = datetime.datetime(2026, 11, 21, 0, 0, 0, tzinfo=datetime.UTC)  # 44:58 after the submit
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
    assert lines[5].split() == ["2", "2", cluster.private_ips[0], "2026-11-20T23:48:00Z", "-", "140", "100",
                                "local", "-", "-"]  # resumed from step 100 of the local checkpoint tier
    assert lines[6:8] == [f"attempt 1 nodes: {a}, {b}", f"attempt 2 nodes: {a}, {c}"]
    # cluster_jobs/goodput.py: 8 of the 44:58 (2,698 s) waited for new nodes between the attempts
    assert lines[8].startswith("goodput ") and " of 0:44:58 (" in lines[8]
    assert "waiting for nodes 17.8%" in lines[8]  # 480 / 2698
    assert lines[9] == ""
    assert lines[10].split()[0] == "INSTANCE"
    assert [line.split()[:6] for line in lines[11:13]] == [[a, "running", "-", "140", "2.5", "Libfabric/efa"],
                                                           [c, "running", "-", "139", "2.5", "Libfabric/efa"]]
    assert lines[13] == "attempt 2's nodes: running (2 nodes)"

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


def test_status_shows_the_held_out_loss_rank_0_s_node_logged(cli, cluster, fakes, ssm_stub):
    a, _, c = cluster.instance_ids
    put_job(fakes, "running", attempts=two_attempts(cluster))
    # rank 0's node logged the full step records, with [validation]'s held-out loss after step 100; the other
    # node's short step lines carry none (node_bootstrap.jobs status: lastValStep, lastValLoss)
    rank0 = {**running(JOB, 140, 2.5), "lastValStep": 100, "lastValLoss": 2.718281}
    expect(ssm_stub, fakes, "status", JOB, {a: rank0, c: running(JOB, 140, None)})
    lines = cli("status", JOB).lines
    header = next(i for i, line in enumerate(lines) if line.startswith("INSTANCE"))
    assert lines[header].split()[:7] == ["INSTANCE", "STATE", "EXIT", "STEP", "LOSS", "VAL", "LOSS"]
    assert lines[header + 1].split()[:7] == [a, "running", "-", "140", "2.5", "2.7183@100", "Libfabric/efa"]
    assert lines[header + 2].split()[:6] == [c, "running", "-", "140", "-", "-"]
    expect(ssm_stub, fakes, "status", JOB, {a: rank0, c: running(JOB, 140, None)})
    nodes = json.loads(cli("status", JOB, "--json").out)["nodes"]
    assert [(n["last_val_step"], n["last_val_loss"]) for n in nodes] == [(100, 2.718281), (None, None)]


def test_status_without_validation_has_no_val_loss_column(cli, cluster, fakes, ssm_stub):
    a, _, c = cluster.instance_ids
    put_job(fakes, "running", attempts=two_attempts(cluster))
    expect(ssm_stub, fakes, "status", JOB, {a: running(JOB, 140, 2.5), c: running(JOB, 140, None)})
    assert "VAL LOSS" not in cli("status", JOB).out


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
