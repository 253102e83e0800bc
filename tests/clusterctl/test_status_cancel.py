"""status and cancel: the stack, group and instances in moto; SSM through a Stubber (moto answers every
invocation with empty output), fed with what node_bootstrap.jobs really prints on a fake node root here (see
fake_job_node): each node's state, step and loss, cancel through SIGTERM, a node that does not answer, job ids
no node knows, cancel's timeout bounds, and a hung node. TCP instead of EFA and commcheck's busbw are in
test_status_nccl_network.py; nodes replaced under a job in test_status_replaced_nodes.py."""

import json

import pytest
from botocore.stub import ANY
from fake_job_node import COMMAND_ID, JOB, FakeNode, expect_job_lookup, invocation

from cluster_aws.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from cluster_jobs.node_states import NodeJobState


def test_status_reports_each_nodes_state_step_and_loss(cli, cluster, fakes, ssm_stub, tmp_path):
    ok = FakeNode(tmp_path / "a", "exit", 0, nccl_network="Libfabric")
    failed = FakeNode(tmp_path / "b", "exit", 3)  # failed before NCCL made a communicator
    for node in (ok, failed):
        node.start()
        node.wait_ended()
    ok_out, ok_code = ok.run("status", "--job-id", JOB)
    failed_out, failed_code = failed.run("status", "--job-id", JOB)
    missing_out, missing_code = FakeNode(tmp_path / "c", "exit").run("status", "--job-id", JOB)
    assert (ok_code, failed_code, missing_code) == (0, 0, 3)

    a, b, c = sorted(cluster.instance_ids)
    expect_job_lookup(ssm_stub, fakes, [a, b, c])
    ssm_stub.add_response(
        "send_command",
        {"Command": {"CommandId": COMMAND_ID}},
        {
            "DocumentName": fakes.DOCUMENT,
            "DocumentVersion": "$DEFAULT",
            "InstanceIds": [a, b, c],
            "Parameters": {"action": ["status"], "jobId": [JOB]},
            "Comment": f"clusterctl status {JOB}",
            "TimeoutSeconds": 120,
        },
    )
    # The first poll comes before SSM has the invocations; the second finds one still running.
    ssm_stub.add_client_error(
        "get_command_invocation",
        "InvocationDoesNotExist",
        expected_params={"CommandId": COMMAND_ID, "InstanceId": a},
    )
    ssm_stub.add_response(
        "get_command_invocation",
        invocation(b, "InProgress", "", -1),
        {"CommandId": COMMAND_ID, "InstanceId": b},
    )
    ssm_stub.add_response(
        "get_command_invocation",
        invocation(c, "Failed", missing_out, missing_code),
        {"CommandId": COMMAND_ID, "InstanceId": c},
    )
    ssm_stub.add_response(
        "get_command_invocation",
        invocation(a, "Success", ok_out, 0),
        {"CommandId": COMMAND_ID, "InstanceId": a},
    )
    ssm_stub.add_response(
        "get_command_invocation",
        invocation(b, "Success", failed_out, 0),
        {"CommandId": COMMAND_ID, "InstanceId": b},
    )

    result = cli("status", JOB)
    assert result.code == EXIT_OK, result.err
    assert cli.sleeps == [2.0]
    header, row_a, row_b, row_c, summary = result.lines
    assert header.split() == [
        "INSTANCE", "STATE", "EXIT", "STEP", "LOSS", "NETWORK", "STARTED", "ENDED", "DETAIL"
    ]
    assert row_a.split()[:6] == [a, "succeeded", "0", "20", "1.0", "Libfabric/efa"]
    assert row_b.split()[:6] == [b, "failed", "3", "20", "1.0", "-"]
    assert row_c.split()[:6] == [c, "not-found", "-", "-", "-", "-"]
    assert f"no job {JOB} on this node" in row_c
    assert summary == f"job {JOB}: failed (3 nodes)"
    assert result.err == ""  # EFA, or no network yet: nothing to warn about


def test_cancel_stops_a_running_job_through_sigterm(cli, cluster, fakes, ssm_stub, tmp_path):
    node = FakeNode(tmp_path / "a", "until-sigterm")
    node.start()
    cancel_out, code = node.run("cancel", "--job-id", JOB, "--timeout-seconds", "30")
    assert code == 0
    a = cluster.instance_ids[0]
    expect_job_lookup(ssm_stub, fakes, [a])
    ssm_stub.add_response(
        "send_command",
        {"Command": {"CommandId": COMMAND_ID}},
        {
            "DocumentName": fakes.DOCUMENT,
            "DocumentVersion": "$DEFAULT",
            "InstanceIds": [a],
            "Parameters": {"action": ["cancel"], "jobId": [JOB], "cancelTimeoutSeconds": ["30"]},
            "Comment": f"clusterctl cancel {JOB}",
            "TimeoutSeconds": ANY,
        },
    )
    ssm_stub.add_response(
        "get_command_invocation",
        invocation(a, "Success", cancel_out, 0),
        {"CommandId": COMMAND_ID, "InstanceId": a},
    )
    result = cli("cancel", JOB, "--timeout-seconds", "30", "--json")
    assert result.code == EXIT_OK, result.err
    report = json.loads(result.out)
    assert report["state"] == "cancelled"
    (state,) = report["nodes"]
    assert (
        state["state"] == "cancelled" and state["exit_code"] == 0 and state["detail"] == "stopped by SIGTERM"
    )


def test_status_of_a_node_that_does_not_answer(cli, cluster, fakes, ssm_stub):
    a = cluster.instance_ids[0]
    expect_job_lookup(ssm_stub, fakes, [a])
    ssm_stub.add_response(
        "send_command",
        {"Command": {"CommandId": COMMAND_ID}},
        {
            "DocumentName": fakes.DOCUMENT,
            "DocumentVersion": "$DEFAULT",
            "InstanceIds": [a],
            "Parameters": {"action": ["status"], "jobId": [JOB]},
            "Comment": ANY,
            "TimeoutSeconds": 120,
        },
    )
    for _ in range(61):  # polled every 2 s for the 120 s timeout
        ssm_stub.add_response("get_command_invocation", invocation(a, "Pending", "", -1))
    result = cli("status", JOB)
    assert result.code == EXIT_FAILED  # a state nobody could read is not success
    assert result.lines[1].split()[:2] == [a, "unknown"] and "no answer within 120 s" in result.lines[1]
    assert result.lines[-1] == f"job {JOB}: unknown (1 nodes)"


def test_status_rejects_a_malformed_job_id(cli, moto_aws):
    result = cli("status", "J;reboot")
    assert result.code == EXIT_USAGE and "job id 'J;reboot': allowed" in result.err


def test_cancel_of_an_unknown_job_asks_the_in_service_nodes(cli, cluster, sent):
    # moto's ListCommands has no start command for this job: every in-service node is asked.
    result = cli("cancel", "j-20261120-000000-0000")
    (command,) = sent
    assert command["InstanceIds"] == cluster.instance_ids
    assert command["Parameters"]["action"] == ["cancel"]
    # moto answers with empty output: the nodes' state is unknown, and cancel says so with exit 1.
    assert result.code == EXIT_FAILED and "unknown" in result.out


def test_status_of_a_job_no_node_knows_exits_1_with_one_line(cli, cluster, fakes, ssm_stub, tmp_path):
    unknown = "j-20261120-000000-0000"
    ssm_stub.add_response("list_commands", {"Commands": []})  # not in SSM's history
    missing = FakeNode(tmp_path / "x", "exit").run("status", "--job-id", unknown)
    ids = cluster.instance_ids  # every in-service node is asked
    ssm_stub.add_response("send_command", {"Command": {"CommandId": COMMAND_ID}})
    for instance_id in ids:
        ssm_stub.add_response("get_command_invocation", invocation(instance_id, "Failed", *missing),
                              {"CommandId": COMMAND_ID, "InstanceId": instance_id})
    result = cli("status", unknown)
    assert result.code == EXIT_FAILED and result.out == ""
    assert result.err == (
        f"clusterctl: error: job {unknown}: unknown: not in SSM's command history (kept 30 days), and none "
        "of the 3 in-service nodes has it\n"
    )


@pytest.mark.parametrize("seconds", ["681", "999", "-1"])
def test_cancel_timeout_beyond_what_the_command_allows_is_refused(cli, moto_aws, seconds):
    result = cli("cancel", JOB, "--timeout-seconds", seconds)
    assert result.code == EXIT_USAGE
    assert result.err == (
        f"clusterctl: error: --timeout-seconds={seconds}: allowed: 0-680 (the jobs document's 900 s command "
        "timeout, less what cancel needs after SIGKILL)\n"
    )


def test_a_hung_node_makes_the_job_hung_and_its_detail_says_why():
    from cluster_jobs.document import Invocation
    from cluster_jobs.node_states import overall_state

    def node(instance_id, state, detail=None):
        return NodeJobState(instance_id, state, None, 120, 1.0, None, None, detail)

    hung = node("i-a", "hung", "hung: no trainer step for 1800 s, waiting for a step (last step seen: 120 at ...)")
    from_invocation = NodeJobState.from_invocation(
        Invocation("i-a", "Success", 0, json.dumps({"jobId": JOB, "state": "hung", "exitCode": 1, "lastStep": 120,
                                                    "error": hung.detail}), ""))
    assert from_invocation.state == "hung" and from_invocation.detail == hung.detail
    assert overall_state([hung, node("i-b", "failed")]) == "hung"  # the peers fail at their NCCL timeout
    assert overall_state([hung, node("i-b", "running")]) == "running"
