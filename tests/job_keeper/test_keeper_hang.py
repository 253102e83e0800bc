"""A hung job in a keeper round (issue 45): the fault names the node its supervisor found the hang on
(node_bootstrap/jobs/hang_origin.py), and the next attempt leaves that node out where a spare is ready, or
keeps it where the job needs every node. moto; SSM answers from a fake client."""

from __future__ import annotations

import json
import logging

import pytest
from fake_aws import isolate_from_real_aws
from keeper_world import JOB, FakeSsm, deploy, keeper, running, submit, table
from moto import mock_aws

from cluster_aws.nodes import Node, select_job_nodes

EVIDENCE = "rank 13 (pid 4242) is stopped (state T: SIGSTOP, a debugger or a job-control stop)"


@pytest.fixture()
def world(monkeypatch, tmp_path):
    isolate_from_real_aws(monkeypatch, tmp_path, "us-east-1")
    with mock_aws():
        yield


def hung(origin: str, evidence: str) -> str:
    """node_bootstrap.jobs status's stdout for a job its supervisor stopped as hung."""
    return json.dumps({"jobId": JOB, "state": "hung", "exitCode": 137, "startedAt": "2026-11-20T23:15:05Z",
                       "endedAt": "2026-11-20T23:29:40Z", "lastStep": 120, "module": "training", "attempt": 1,
                       "error": "hung: no trainer step for 20 s", "hangOrigin": origin,
                       "hangEvidence": evidence}) + "\n"


def test_the_node_a_hang_is_on_is_named_and_a_spare_takes_its_place(world, caplog):
    a, b, spare = deploy(3)
    submit([a, b])
    ssm = FakeSsm()
    ssm.stdout = {a: hung("peer", "every rank here sleeps (rank 0 (pid 900)): blocked on a peer, as inside a "
                                  "collective"),
                  b: hung("here", EVIDENCE), spare: running(0)}
    with caplog.at_level(logging.WARNING, logger="job_keeper"):
        outcome = keeper(ssm).reconcile()
    assert outcome.action == "started"
    assert outcome.detail.endswith(f"; left out, the hang was on it: {b}; in its place: {spare}")
    record = table().get(JOB)
    fault = (f"node {b}: the trainer made no progress and was stopped (hung); the hang is on this node: "
             f"{EVIDENCE}")
    assert record.attempts[0].end_reason == fault
    assert record.current.nodes == [a, spare]
    assert {r.instance_id: r.hang_origin for r in record.attempts[0].node_reports} == {a: "peer", b: "here"}
    assert f"attempt 1 ended: {fault}; restarting" in caplog.text


def test_a_hang_no_node_could_place_names_the_first_and_says_why(world):
    a, b = deploy(2)
    submit([a, b])
    ssm = FakeSsm()
    waiting = "every rank here sleeps (rank 0 (pid 900)): blocked on a peer, as inside a collective"
    ssm.stdout = {a: hung("peer", waiting), b: hung("unknown", "rank 9 (pid 77) is running (state R): ...")}
    outcome = keeper(ssm).reconcile()
    assert outcome.action == "started"
    record = table().get(JOB)
    assert record.attempts[0].end_reason == (f"node {a}: the trainer made no progress and was stopped (hung); the "
                                             f"node at fault could not be told (peer: {waiting})")
    assert record.current.nodes == [a, b] and "left out" not in outcome.detail


def test_without_a_spare_the_job_keeps_the_node_the_hang_was_on(world):
    a, b = deploy(2)
    submit([a, b])
    ssm = FakeSsm()
    ssm.stdout = {a: hung("peer", "every rank here sleeps"), b: hung("here", EVIDENCE)}
    outcome = keeper(ssm).reconcile()
    assert outcome.action == "started" and "left out" not in outcome.detail
    assert table().get(JOB).current.nodes == [a, b]  # by private IP, as any attempt: the node is healthy so far


def node(instance_id: str, ip: str) -> Node:
    return Node(instance_id=instance_id, private_ip=ip, availability_zone="us-east-1a", lifecycle_state="InService",
                health_status="Healthy", bootstrap="ready", bootstrap_reason=None, launch_time=None)


def test_nodes_to_take_last_go_after_every_other_ready_node():
    nodes = [node("i-c", "10.0.1.3"), node("i-a", "10.0.1.1"), node("i-b", "10.0.1.2")]
    by_ip = sorted(nodes, key=lambda n: n.private_ip)
    assert [n.instance_id for n in select_job_nodes(by_ip, 2, last=["i-a"])] == ["i-b", "i-c"]
    assert [n.instance_id for n in select_job_nodes(by_ip, 3, last=["i-a"])] == ["i-b", "i-c", "i-a"]
    assert [n.instance_id for n in select_job_nodes(by_ip, 2)] == ["i-a", "i-b"]
