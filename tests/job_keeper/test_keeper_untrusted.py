"""A keeper round against what a job prints (issue 42): the nodes' answers pass cluster_jobs/node_answer.py before
the record is saved, a record already poisoned in the table is read through cluster_jobs/record_schema.py and
saved back clean, and a record the round still cannot save ends the round logged and failed (the function's
Errors metric, JobKeeperErrorsAlarm) instead of stopping the keeper. moto; SSM answers from a fake client."""

from __future__ import annotations

import json
import logging

import pytest
from aws_events import scheduled_event
from fake_aws import isolate_from_real_aws
from keeper_world import JOB, FakeSsm, deploy, keeper, put_raw, raw_item, running, submit, table
from moto import mock_aws

from job_keeper.handler import RoundFailed, handler


@pytest.fixture()
def nodes(monkeypatch, tmp_path):
    isolate_from_real_aws(monkeypatch, tmp_path, "us-east-1")
    with mock_aws():
        yield deploy()


def numbers_in(value: object) -> list[str]:
    """Every DynamoDB number (its text) anywhere in a raw item."""
    if isinstance(value, dict):
        return ([value["N"]] if set(value) == {"N"} else []) + [n for v in value.values() for n in numbers_in(v)]
    if isinstance(value, list):
        return [n for v in value for n in numbers_in(v)]
    return []


def test_a_float_step_and_a_string_resume_step_never_reach_the_save(nodes):
    a, b = nodes
    submit(nodes)
    ssm = FakeSsm()
    # the lines: {"event": "step", "step": 2.5} passed through as lastStep; a resume record's string step
    ssm.stdout = {a: running(2.5, resumedFromStep="40"), b: running(12, lastLoss=float("nan"))}
    outcome = keeper(ssm).reconcile()
    assert (outcome.action, outcome.state) == ("observed", "running")
    record = table().get(JOB)
    assert record.current.step_reached == 12 and record.current.resumed_from_step is None
    reports = {r.instance_id: r for r in record.current.node_reports}
    report_a, report_b = reports[a], reports[b]
    assert report_a.last_step is None and report_a.dropped == [
        "lastStep: a float, not an int in 0..999999999999",
        "resumedFromStep: a string of 2 characters, not an int in 0..999999999999",
    ]
    assert report_b.last_step == 12 and report_b.dropped == ["lastLoss: a float, not a finite number in 0..1e+06"]
    assert all("." not in n for n in numbers_in(raw_item()))  # no float was stored


def test_a_record_poisoned_before_the_parser_is_read_clean_and_saved_back(nodes):
    a, b = nodes
    submit(nodes)
    item = raw_item()
    attempt = item["attempts"]["L"][0]["M"]
    attempt["stepReached"] = {"N": "2.5"}  # what the old keeper stored from a float step
    attempt["resumedFromStep"] = {"S": "\x1b]0;pwned\x07"}
    attempt["nodeReports"] = {"L": [{"M": {"instanceId": {"S": a}, "state": {"S": "running"},
                                           "lastStep": {"S": "12"}}}]}
    put_raw(item)
    ssm = FakeSsm()
    ssm.stdout = {a: running(30), b: running(31)}
    assert keeper(ssm).reconcile().action == "observed"  # before: TypeError: Float types are not supported
    record = table().get(JOB)
    assert (record.current.step_reached, record.current.resumed_from_step) == (31, None)
    assert record.dropped_on_read == []  # written back clean
    assert "pwned" not in json.dumps(raw_item())


def test_a_record_the_round_cannot_save_is_logged_and_fails_the_invocation_once(nodes, caplog):
    a, b = nodes
    submit(nodes)
    item = raw_item()
    # within ~140 bytes of DynamoDB's 400 KB item limit (as moto counts it): the round's node reports push it over
    item["reason"] = {"S": "x" * 404_400}
    put_raw(item)
    ssm = FakeSsm()
    ssm.stdout = {a: running(30), b: running(31)}
    caplog.set_level(logging.ERROR, logger="job_keeper.keeper")
    with pytest.raises(RoundFailed, match=f"job keeper: job {JOB}: ClientError: .*ValidationException"):
        handler(scheduled_event(), keeper=keeper(ssm))
    assert [r.getMessage() for r in caplog.records] == [
        f"job {JOB}: this round cannot handle its record: ClientError: An error occurred (ValidationException) "
        "when calling the PutItem operation: Item size has exceeded the maximum allowed size"]
    # the record is as it was, and the next round (the record fixed) handles the job again
    item["reason"] = {"S": "fixed by hand"}
    put_raw(item)
    assert handler(scheduled_event(), keeper=keeper(ssm))["action"] == "observed"
    assert table().get(JOB).current.step_reached == 31


def test_a_record_missing_a_required_field_is_named_in_one_line(nodes, caplog):
    submit(nodes)
    item = raw_item()
    item["nodes"] = {"S": "two"}
    put_raw(item)
    outcome = keeper(FakeSsm()).reconcile()
    assert (outcome.job_id, outcome.action) == (JOB, "error")
    assert outcome.detail == (f"UnreadableRecord: job {JOB}: its record in the job table cannot be read: nodes: a "
                              "string of 3 characters, not int")
