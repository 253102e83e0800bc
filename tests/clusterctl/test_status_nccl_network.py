"""status on the network NCCL uses and on commcheck's result: a warning and exit 1 when a multi-node job's
nodes use TCP sockets (or libfabric over TCP) instead of EFA, none for a single node; the all_reduce busbw
that rank 0's node of a commcheck reports, and none for a training job. The stack and nodes in moto, SSM
through a Stubber fed with what node_bootstrap.jobs prints on fake node roots (see fake_job_node)."""

import json
import time

import pytest
from fake_job_node import JOB, FakeNode, expect_status

from cluster_aws.errors import EXIT_FAILED, EXIT_OK
from cluster_jobs.node_states import NodeJobState, nodes_on_tcp

pytestmark = pytest.mark.waits  # mostly sleeps on real timeouts: run beside the slow files (conftest.py)


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
