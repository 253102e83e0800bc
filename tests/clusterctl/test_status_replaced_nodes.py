"""status and cancel of a job whose nodes were replaced by the Auto Scaling group: only the nodes that still
exist are asked, one SSM refuses at the send does not stop the others, and a job whose nodes are all gone is
one line. The stack and nodes in moto, SSM through a Stubber fed with what node_bootstrap.jobs prints on fake
node roots (see fake_job_node)."""

import json

import pytest
from fake_job_node import COMMAND_ID, JOB, FakeNode, expect_command, expect_job_lookup, invocation, terminate

from cluster_aws.errors import EXIT_FAILED, EXIT_OK

pytestmark = pytest.mark.waits  # mostly sleeps on real timeouts: run beside the slow files (conftest.py)


def test_status_after_a_node_was_replaced_asks_only_the_nodes_that_exist(cli, cluster, fakes, ssm_stub, tmp_path):
    survivor = FakeNode(tmp_path / "a", "until-sigterm")
    try:
        survivor.start()
        answer = survivor.run("status", "--job-id", JOB)
    finally:
        survivor.run("cancel", "--job-id", JOB, "--timeout-seconds", "10")
    a, b, c = sorted(cluster.instance_ids)
    terminate(b)
    expect_job_lookup(ssm_stub, fakes, [a, b, c])
    # the SendCommand names only a and c: with b in it SSM would refuse the whole call (InvalidInstanceId)
    missing = FakeNode(tmp_path / "c", "exit").run("status", "--job-id", JOB)
    expect_command(ssm_stub, fakes, "status", [a, c], {a: answer, c: missing}, timeout=120)
    result = cli("status", JOB)
    assert result.code == EXIT_OK, result.err
    _, row_a, row_b, row_c, summary = result.lines
    assert row_a.split()[:2] == [a, "running"]
    assert row_b.split()[:2] == [b, "gone"] and "gone (replaced): instance terminated" in row_b
    assert row_c.split()[:2] == [c, "not-found"]
    assert summary == f"job {JOB}: running (3 nodes, 1 gone (replaced))"


def test_cancel_after_a_node_was_replaced_stops_what_is_left(cli, cluster, fakes, ssm_stub, tmp_path):
    node = FakeNode(tmp_path / "a", "until-sigterm")
    node.start()
    cancel_out, code = node.run("cancel", "--job-id", JOB, "--timeout-seconds", "30")
    assert code == 0
    a, b = sorted(cluster.instance_ids[:2])
    terminate(b)
    expect_job_lookup(ssm_stub, fakes, [a, b])
    expect_command(ssm_stub, fakes, "cancel", [a], {a: (cancel_out, 0)},
                   {"action": ["cancel"], "jobId": [JOB], "cancelTimeoutSeconds": ["30"]})
    result = cli("cancel", JOB, "--timeout-seconds", "30", "--json")
    assert result.code == EXIT_OK, result.err
    report = json.loads(result.out)
    assert report["state"] == "cancelled"
    assert [(n["instance_id"], n["state"]) for n in report["nodes"]] == [(a, "cancelled"), (b, "gone")]


@pytest.mark.parametrize("terminated", [True, False], ids=["terminated", "agent-not-registered"])
def test_a_node_ssm_refuses_at_the_send_does_not_stop_the_others(cli, cluster, fakes, ssm_stub, tmp_path,
                                                                  terminated):
    node = FakeNode(tmp_path / "a", "exit", 0)
    node.start()
    node.wait_ended()
    answer = node.run("status", "--job-id", JOB)
    a, b = sorted(cluster.instance_ids[:2])
    expect_job_lookup(ssm_stub, fakes, [a, b])
    if terminated:  # the group terminates b after clusterctl looked at the instances, before it sends
        cli.context.client("ssm").meta.events.register_first(
            "provide-client-params.ssm.SendCommand", lambda **_: terminate(b), unique_id="terminate-b")
    request = {"DocumentName": fakes.DOCUMENT, "DocumentVersion": "$DEFAULT", "Parameters":
               {"action": ["status"], "jobId": [JOB]}, "Comment": f"clusterctl status {JOB}",
               "TimeoutSeconds": 120}
    refused = f"Instances [[{b}]] not in a valid state for account 111122223333"
    ssm_stub.add_client_error("send_command", "InvalidInstanceId", refused,
                              expected_params={**request, "InstanceIds": [a, b]})
    # one refused instance fails the whole call: each is sent alone, so a is still reached
    ssm_stub.add_response("send_command", {"Command": {"CommandId": COMMAND_ID}},
                          {**request, "InstanceIds": [a]})
    ssm_stub.add_client_error("send_command", "InvalidInstanceId", refused,
                              expected_params={**request, "InstanceIds": [b]})
    ssm_stub.add_response("get_command_invocation", invocation(a, "Success", *answer),
                          {"CommandId": COMMAND_ID, "InstanceId": a})
    result = cli("status", JOB)
    assert result.lines[1].split()[:2] == [a, "succeeded"]
    if terminated:
        assert result.code == EXIT_OK, result.err
        assert result.lines[2].split()[:2] == [b, "gone"] and "instance terminated" in result.lines[2]
    else:  # b runs but SSM cannot reach it: its state is unknown, and status says so with exit 1
        assert result.code == EXIT_FAILED
        assert result.lines[2].split()[:2] == [b, "unknown"] and "InvalidInstanceId" in result.lines[2]


def test_status_of_a_job_whose_nodes_are_all_gone_is_one_line(cli, cluster, fakes, ssm_stub):
    a, b = sorted(cluster.instance_ids[:2])
    for instance_id in (a, b):
        terminate(instance_id)
    expect_job_lookup(ssm_stub, fakes, [a, b, "i-0123456789abcdef0"])  # and one EC2 no longer knows at all
    result = cli("status", JOB)
    assert result.code == EXIT_FAILED and result.out == ""
    assert result.err == (
        f"clusterctl: error: job {JOB}: all 3 of its nodes are gone (replaced), so no node can report its "
        f"state; its log stays in CloudWatch Logs: clusterctl logs {JOB}\n"
    )
