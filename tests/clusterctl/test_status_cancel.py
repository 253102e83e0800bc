"""status and cancel: the stack, group and instances in moto; SSM through a Stubber (moto answers every
invocation with empty output), fed with what node_bootstrap.jobs really prints on a fake node root here."""

import datetime
import json
import os
import subprocess
import sys
import time
from pathlib import Path

import boto3
import pytest
from botocore.stub import ANY

from clusterctl.aws import EXIT_FAILED, EXIT_OK, EXIT_USAGE
from clusterctl.jobs import NodeJobState, nodes_on_tcp

REPO = Path(__file__).resolve().parents[2]
GOLDEN_NODE_CONFIG = REPO / "tests" / "cluster_constructs" / "golden" / "node-config.json"
JOB = "j-20261120-231502-ab12"
COMMAND_ID = "11111111-2222-3333-4444-555555555555"
START_ID = "99999999-2222-3333-4444-555555555555"

# NCCL's lines as it prints them at NCCL_DEBUG=INFO (format strings from NVIDIA/nccl src/debug.cc and
# src/init.cc, and aws/aws-ofi-nccl src/nccl_ofi_net.cpp; see tests/node_bootstrap/test_jobs.py).
STAND_IN = """\
#!{python}
import json, os, signal, sys, time
network = os.environ.get("FAKE_NCCL_NETWORK")
prefix = "ip-10-42-1-4:%d:%d [0] NCCL INFO " % (os.getpid(), os.getpid() + 116)
if network == "Libfabric":
    print(prefix + "NET/OFI Selected provider is efa, fabric is efa-direct (found 32 nics)", flush=True)
if network:
    print(prefix + "Using network " + network, flush=True)
if "training.commcheck" in sys.argv and os.environ.get("FAKE_RANK0") == "1":  # rank 0's lines, as
    # training/commcheck.py prints them
    print(json.dumps({{"event": "allreduce", "size_bytes": 1073741824, "dtype": "bfloat16", "ranks": 16,
                      "backend": "nccl", "time_ms": 4.5, "algbw_gbps": 238.6, "busbw_gbps": 447.4}}), flush=True)
    print(json.dumps({{"event": "allreduce_summary", "backend": "nccl", "dtype": "bfloat16", "ranks": 16,
                      "nodes": 2, "sizes_bytes": [1073741824], "largest_size_bytes": 1073741824,
                      "busbw_gbps": 447.4, "peak_busbw_gbps": 447.4, "min_busbw_gbps": None,
                      "passed": None}}), flush=True)
elif "training.commcheck" not in sys.argv:
    for step in (10, 20):
        print(json.dumps({{"event": "step", "step": step, "loss": 3.0 - step / 10}}), flush=True)
if os.environ["FAKE_MODE"] == "exit":
    sys.exit(int(os.environ["FAKE_EXIT_CODE"]))
signal.signal(signal.SIGTERM, lambda signum, frame: sys.exit(0))
while True:
    time.sleep(0.05)
"""


class FakeNode:
    """A node root with the node config and a stand-in for torchrun's python, driven through the real CLI."""

    def __init__(self, root: Path, mode: str, exit_code: int = 0, nccl_network: str = "", rank0: bool = False):
        self.root = root
        (root / "etc/cluster").mkdir(parents=True)
        # the node config the stack renders (its golden file): the launcher reads the real contract
        (root / "etc/cluster/node-config.json").write_text(GOLDEN_NODE_CONFIG.read_text())
        (root / "etc/cluster/training.env").write_text(
            f"FAKE_MODE={mode}\nFAKE_EXIT_CODE={exit_code}\nFAKE_NCCL_NETWORK={nccl_network}\n"
            f"FAKE_RANK0={int(rank0)}\n"
        )
        (root / "opt/cluster/bundle").mkdir(parents=True)
        # the jobuser boot step's user database; the job user is whoever runs the tests
        (root / "etc/passwd").write_text(
            f"cluster-job:x:{os.getuid()}:{os.getgid()}::/var/lib/cluster-job:/bin/false\n")
        (root / "etc/group").write_text(f"cluster-job:x:{os.getgid()}:\n")
        python = root / "opt/pytorch/bin/python"
        python.parent.mkdir(parents=True)
        python.write_text(STAND_IN.format(python=sys.executable))
        python.chmod(0o755)

    def run(self, *args):
        result = subprocess.run(
            [sys.executable, "-m", "node_bootstrap.jobs", "--root", str(self.root), *args],
            cwd=REPO,
            capture_output=True,
            text=True,
            timeout=60,
        )
        return result.stdout, result.returncode

    def start(self, *module_args):
        self.run(
            "start",
            "--job-id",
            JOB,
            *(module_args or ("--config", "training/configs/tiny-cpu.toml")),
            "--nodes",
            "2",
            "--gpus-per-node",
            "8",
            "--rendezvous-host",
            "10.42.1.4",
            "--launcher",
            "direct",
        )

    def wait_ended(self):
        status_path = self.root / "var/lib/cluster/jobs" / JOB / "status.json"
        deadline = time.monotonic() + 20
        while json.loads(status_path.read_text())["state"] == "running":
            assert time.monotonic() < deadline, "stand-in job did not end"
            time.sleep(0.05)


def invocation(instance_id, status, stdout, code):
    return {
        "CommandId": COMMAND_ID,
        "InstanceId": instance_id,
        "Status": status,
        "ResponseCode": code,
        "StandardOutputContent": stdout,
        "StandardErrorContent": "",
    }


def expect_job_lookup(stub, fakes, instance_ids):
    stub.add_response(
        "list_commands",
        {
            "Commands": [
                {
                    "CommandId": START_ID,
                    "DocumentName": fakes.DOCUMENT,
                    "InstanceIds": instance_ids,
                    "Parameters": {"action": ["start"], "jobId": [JOB]},
                    "RequestedDateTime": datetime.datetime(2026, 11, 20, 23, 15, 3, tzinfo=datetime.UTC),
                },
                {
                    "CommandId": COMMAND_ID,
                    "DocumentName": fakes.DOCUMENT,
                    "InstanceIds": instance_ids,
                    "Parameters": {"action": ["start"], "jobId": ["j-20261120-231502-ffff"]},
                    "RequestedDateTime": datetime.datetime(2026, 11, 20, 23, 15, 3, tzinfo=datetime.UTC),
                },
            ]
        },
        {
            "Filters": [
                {"key": "DocumentName", "value": fakes.DOCUMENT},
                {"key": "InvokedAfter", "value": "2026-11-20T22:15:02Z"},
            ]
        },
    )


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


def expect_status(stub, fakes, answers):
    """The job's start command, the status command, and each node's answer (stdout, exit code)."""
    instance_ids = sorted(answers)
    expect_job_lookup(stub, fakes, instance_ids)
    expect_command(stub, fakes, "status", instance_ids, answers, timeout=120)


def test_status_warns_and_exits_1_when_a_node_of_a_running_job_uses_tcp(
    cli, cluster, fakes, ssm_stub, tmp_path
):
    efa = FakeNode(tmp_path / "a", "until-sigterm", nccl_network="Libfabric")
    tcp = FakeNode(tmp_path / "b", "until-sigterm", nccl_network="Socket")
    a, b = cluster.instance_ids[:2]
    try:
        for node in (efa, tcp):
            node.start()
        answers = {}
        for instance_id, node in ((a, efa), (b, tcp)):
            deadline = time.monotonic() + 20
            while json.loads(node.run("status", "--job-id", JOB)[0])["ncclNetwork"] is None:
                assert time.monotonic() < deadline, "the stand-in did not log its NCCL network"
                time.sleep(0.05)
            answers[instance_id] = node.run("status", "--job-id", JOB)
    finally:
        for node in (efa, tcp):
            node.run("cancel", "--job-id", JOB, "--timeout-seconds", "10")
    expect_status(ssm_stub, fakes, answers)

    result = cli("status", JOB, "--json")
    assert result.code == EXIT_FAILED
    report = json.loads(result.out)
    assert report["state"] == "running"
    assert sorted((n["instance_id"], n["nccl_network"], n["nccl_provider"]) for n in report["nodes"]) == sorted(
        [(a, "Libfabric", "efa"), (b, "Socket", None)]
    )
    assert result.err == (
        f"clusterctl: warning: NCCL is using TCP sockets, not EFA, on {b}: this job runs at a fraction of "
        "the bandwidth; check `sudo PYTHONPATH=/opt/cluster/bundle python3 -m node_bootstrap check` on "
        f"those nodes and cancel the job (clusterctl cancel {JOB})\n"
    )


def test_status_names_every_tcp_node_of_an_ended_job(cli, cluster, fakes, ssm_stub, tmp_path):
    nodes = [FakeNode(tmp_path / name, "exit", 0, nccl_network="Socket") for name in ("a", "b")]
    for node in nodes:
        node.start()
        node.wait_ended()
    a, b = sorted(cluster.instance_ids[:2])
    expect_status(ssm_stub, fakes, {a: nodes[0].run("status", "--job-id", JOB),
                                    b: nodes[1].run("status", "--job-id", JOB)})
    result = cli("status", JOB)
    assert result.code == EXIT_FAILED
    assert [line.split()[5] for line in result.lines[1:3]] == ["Socket", "Socket"]
    assert result.err.startswith(f"clusterctl: warning: NCCL is using TCP sockets, not EFA, on {a}, {b}: ")
    assert "this job ran at a fraction of the bandwidth" in result.err and "cancel" not in result.err


def test_a_single_node_job_on_sockets_is_not_a_warning(cli, cluster, fakes, ssm_stub, tmp_path):
    # On one node NCCL goes over NVLink; the network it names is never used.
    node = FakeNode(tmp_path / "a", "exit", 0, nccl_network="Socket")
    node.start()
    node.wait_ended()
    a = cluster.instance_ids[0]
    expect_status(ssm_stub, fakes, {a: node.run("status", "--job-id", JOB)})
    result = cli("status", JOB)
    assert result.code == EXIT_OK and result.err == ""
    assert result.lines[1].split()[5] == "Socket"


def test_which_nodes_count_as_nccl_over_tcp():
    def node(instance_id, network, provider=None, state="running"):
        return NodeJobState(instance_id, state, None, 20, 1.0, None, None, None, network, provider)

    efa, sock = node("i-a", "Libfabric", "efa"), node("i-b", "Socket")
    libfabric_tcp = node("i-c", "Libfabric", "tcp;ofi_rxm")  # aws-ofi-nccl, but libfabric over TCP
    assert (efa.network, sock.network, node("i-d", None).network) == ("Libfabric/efa", "Socket", None)
    assert nodes_on_tcp([efa, sock, libfabric_tcp, node("i-d", None), node("i-e", "IB")]) == ["i-b", "i-c"]
    assert nodes_on_tcp([sock]) == []  # one node: NVLink, the network is idle
    assert nodes_on_tcp([sock, node("i-f", None, state="not-found")]) == []  # that node never ran the job


def test_status_of_a_commcheck_shows_busbw_from_rank_0s_node(cli, cluster, fakes, ssm_stub, tmp_path):
    rank0 = FakeNode(tmp_path / "a", "exit", 0, nccl_network="Libfabric", rank0=True)
    other = FakeNode(tmp_path / "b", "exit", 0, nccl_network="Libfabric")
    for node in (rank0, other):
        node.start("--module", "training.commcheck", "--overrides", "sizes_mib=1024")
        node.wait_ended()
    a, b = sorted(cluster.instance_ids[:2])
    answers = {a: rank0.run("status", "--job-id", JOB), b: other.run("status", "--job-id", JOB)}
    expect_status(ssm_stub, fakes, answers)
    result = cli("status", JOB)
    assert result.code == EXIT_OK, result.err
    header, row_a, row_b, summary = result.lines
    assert header.split() == [
        "INSTANCE", "STATE", "EXIT", "BUSBW", "GB/S", "SIZE", "NETWORK", "STARTED", "ENDED", "DETAIL"
    ]
    assert row_a.split()[:7] == [a, "succeeded", "0", "447.4", "1024", "MiB", "Libfabric/efa"]
    assert row_b.split()[:6] == [b, "succeeded", "0", "-", "-", "Libfabric/efa"]
    assert summary == f"job {JOB}: succeeded (2 nodes); all_reduce busbw 447.4 GB/s at 1024 MiB"

    expect_status(ssm_stub, fakes, answers)
    report = json.loads(cli("status", JOB, "--json").out)
    assert (report["busbwGbps"], report["busbwSizeBytes"]) == (447.4, 1073741824)
    assert [n["module"] for n in report["nodes"]] == ["training.commcheck"] * 2


def test_status_of_a_training_job_has_no_busbw(cli, cluster, fakes, ssm_stub, tmp_path):
    node = FakeNode(tmp_path / "a", "exit", 0)
    node.start()
    node.wait_ended()
    a = cluster.instance_ids[0]
    expect_status(ssm_stub, fakes, {a: node.run("status", "--job-id", JOB)})
    report = json.loads(cli("status", JOB, "--json").out)
    assert "busbwGbps" not in report
    (state,) = report["nodes"]
    assert (state["module"], state["last_step"], state["busbw_gbps"]) == ("training", 20, None)


# --- a job whose nodes were replaced ---------------------------------------------------------------------


def terminate(instance_id):
    """What the Auto Scaling group does to an unhealthy node (moto keeps it visible as terminated)."""
    boto3.client("ec2", region_name="us-east-1").terminate_instances(InstanceIds=[instance_id])


def expect_command(stub, fakes, action, instance_ids, answers, parameters=None, timeout=ANY):
    stub.add_response(
        "send_command",
        {"Command": {"CommandId": COMMAND_ID}},
        {
            "DocumentName": fakes.DOCUMENT,
            "DocumentVersion": "$DEFAULT",
            "InstanceIds": instance_ids,
            "Parameters": parameters or {"action": [action], "jobId": [JOB]},
            "Comment": f"clusterctl {action} {JOB}",
            "TimeoutSeconds": timeout,
        },
    )
    for instance_id in instance_ids:
        stdout, code = answers[instance_id]
        stub.add_response(
            "get_command_invocation",
            invocation(instance_id, "Success", stdout, code),
            {"CommandId": COMMAND_ID, "InstanceId": instance_id},
        )


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
    from clusterctl.jobs import Invocation, overall_state

    def node(instance_id, state, detail=None):
        return NodeJobState(instance_id, state, None, 120, 1.0, None, None, detail)

    hung = node("i-a", "hung", "hung: no trainer step for 1800 s, waiting for a step (last step seen: 120 at ...)")
    from_invocation = NodeJobState.from_invocation(
        Invocation("i-a", "Success", 0, json.dumps({"jobId": JOB, "state": "hung", "exitCode": 1, "lastStep": 120,
                                                    "error": hung.detail}), ""))
    assert from_invocation.state == "hung" and from_invocation.detail == hung.detail
    assert overall_state([hung, node("i-b", "failed")]) == "hung"  # the peers fail at their NCCL timeout
    assert overall_state([hung, node("i-b", "running")]) == "running"
