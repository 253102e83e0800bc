"""cluster_jobs/compaction.py: a job's record stays inside one DynamoDB item (400 KB) at 256 nodes and many
attempts. An attempt that is no longer the current one keeps the reports of the nodes that explain its end and
a summary of all of them; its goodput and restart timeline are the same before and after; the table's save
compacts (and drops more past the safe bound) before the put; a record written before the summary reads as
before. moto for the table, the keeper's round on tests/keeper_world.py."""

from __future__ import annotations

import dataclasses
import datetime

import botocore.exceptions
import pytest
from fake_aws import isolate_from_real_aws
from keeper_world import JOB, FakeSsm, deploy, keeper, put_raw, raw_item, running, submit, table
from moto import mock_aws

from cluster_jobs.compaction import (
    KEPT_REPORTS,
    MAX_ITEM_BYTES,
    SAFE_ITEM_BYTES,
    compact_record,
    fit_record,
    item_size_bytes,
    node_summary,
)
from cluster_jobs.goodput import job_goodput
from cluster_jobs.table import Attempt, JobRecord, NodeReport, _from_item, _to_item
from cluster_jobs.timeline import restart_seconds, timeline_lines
from clusterctl.jobs.view import format_record

T0 = datetime.datetime(2026, 11, 20, 23, 0, 0, tzinfo=datetime.UTC)
PHASES = {"compile": 81_234, "checkpoint_load": 42_345, "checkpoint_save": 123_456, "validation": 23_456,
          "export": 0, "data_wait": 3_456}


def at(seconds: float, ms: bool = False) -> str:
    when = T0 + datetime.timedelta(seconds=seconds)
    if ms:
        return when.strftime("%Y-%m-%dT%H:%M:%S") + f".{when.microsecond // 1000:03d}Z"
    return when.strftime("%Y-%m-%dT%H:%M:%SZ")


def node_ids(count: int, attempt: int) -> list[str]:
    return [f"i-{attempt:04x}{k:013x}" for k in range(count)]


def full_report(instance_id: str, state: str, k: int, ended: float | None = None) -> NodeReport:
    """A report as large as a P5 node's (about 400 bytes as JSON): phase seconds, last output, a detail."""
    return NodeReport(instance_id, state, exit_code=None if ended is None else 1, last_step=123_456 + k,
                      started_at=at(5), ended_at=None if ended is None else at(ended),
                      detail=None if ended is None else "the trainer exited with code 1", compile_cache="snapshot",
                      phase_ms={name: ms + k for name, ms in PHASES.items()}, last_output_at=at(3000 + k, ms=True),
                      dropped=["lossScale: a string of 3 characters, not a finite number: dropped"])


def big_record(nodes: int, attempts: int) -> JobRecord:
    """`attempts` attempts of `nodes` full reports each: every earlier one lost its first node."""
    made = []
    for number in range(1, attempts + 1):
        ids = node_ids(nodes, number)
        last = number == attempts
        reports = [full_report(i, "running" if k or last else "failed", k, None if k or last else 2990)
                   for k, i in enumerate(ids)]
        made.append(Attempt(number, ids, "10.42.1.4", at(1), ended_at=None if last else at(3100),
                            end_reason=None if last else f"node {ids[0]}: the trainer exited with code 1",
                            step_reached=123_456, resumed_from_step=120_000, node_reports=reports,
                            timeline={"first_step": at(60, ms=True), "fault_seen": at(3100, ms=True)}))
    return record_of(made, nodes=nodes, state="running")


def record_of(
    attempts: list[Attempt], *, nodes: int, state: str = "succeeded", ended: float | None = None
) -> JobRecord:
    return JobRecord(job_id=JOB, module="training", config="c.toml", config_text="", overrides=[], resume_from="",
                     nodes=nodes, gpus_per_node=8, max_restarts=0, max_job_restarts=100,
                     instance_type="p5.48xlarge", checkpoint_dir=f"/fsx/checkpoints/{JOB}", state=state,
                     created_at=at(0), updated_at=at(0), attempts=attempts,
                     ended_at=None if ended is None else at(ended))


def size(record: JobRecord) -> int:
    return item_size_bytes(_to_item(record))


def restarted_three_times() -> JobRecord:
    """12 nodes. Attempt 1: node 0 fails at 290 s, node 1 is gone, the rest run on (their last output up to
    289.5 s); the keeper sees it at 300 s. Attempt 2: 10 nodes hung (ending 590..599 s) and 2 still run, quiet
    since 560 s; the keeper sees it at 600 s. Attempt 3 (the current one) succeeds at 1000 s, warm from the
    compile cache on 9 nodes."""
    ids1, ids2, ids3 = node_ids(12, 1), node_ids(12, 2), node_ids(12, 3)
    first = [NodeReport(ids1[0], "failed", exit_code=1, ended_at=at(290), phase_ms={"checkpoint_save": 9_000}),
             NodeReport(ids1[1], "gone", detail="gone (replaced): instance terminated")]
    first += [NodeReport(i, "running", last_step=100, last_output_at=at(280 + k / 2, ms=True), compile_cache="cold",
                         phase_ms={"checkpoint_save": 12_000 + k, "validation": 3_000, "export": 1_000 * k})
              for k, i in enumerate(ids1[2:])]
    second = [NodeReport(i, "hung", exit_code=-9, ended_at=at(599 - k), compile_cache="snapshot",
                         phase_ms={"data_wait": 700 * k}) for k, i in enumerate(ids2[:10])]
    second += [NodeReport(i, "running", last_output_at=at(555 + k * 5, ms=True)) for k, i in enumerate(ids2[10:])]
    third = [NodeReport(i, "succeeded", ended_at=at(1000 - k), compile_cache="snapshot" if k < 9 else "cold")
             for k, i in enumerate(ids3)]
    return record_of([
        Attempt(1, ids1, "10.0.0.1", at(2), ended_at=at(300), step_reached=100, resumed_from_step=0,
                node_reports=first, timeline={"first_step": at(71, ms=True), "fault_seen": at(300, ms=True),
                                              "ended": at(300, ms=True), "survivors_stopped": at(304, ms=True)}),
        Attempt(2, ids2, "10.0.0.1", at(340), ended_at=at(600), step_reached=150, resumed_from_step=80,
                node_reports=second, timeline={"first_step": at(400, ms=True), "compiled": at(399, ms=True),
                                               "fault_seen": at(600, ms=True), "ended": at(600, ms=True)}),
        Attempt(3, ids3, "10.0.0.1", at(610), ended_at=at(1010), step_reached=200, resumed_from_step=150,
                node_reports=third, timeline={"first_step": at(650, ms=True), "compiled": at(649, ms=True)}),
    ], nodes=12, ended=1010)


# --- the measurement ---------------------------------------------------------------------------------------


def test_item_size_counts_names_and_values_as_dynamodb_does():
    # "pk" + "abc"; "n" + 3 significant digits (2 bytes) + 1; "l" + 3 + (1 + "x") + (1 + "yz"); "b" + 1
    item = {"pk": {"S": "abc"}, "n": {"N": "1200"}, "l": {"L": [{"S": "x"}, {"S": "yz"}]}, "b": {"BOOL": True}}
    assert item_size_bytes(item) == (2 + 3) + (1 + 2) + (1 + 3 + 2 + 3) + (1 + 1)
    assert item_size_bytes({"m": {"M": {"ab": {"N": "7"}}}}) == 1 + 3 + 2 + 1 + 2


@pytest.mark.parametrize(("nodes", "attempts"), [(128, 12), (256, 6), (256, 20)])
def test_full_reports_outgrow_the_item_and_compacted_ones_fit(nodes, attempts):
    record = big_record(nodes, attempts)
    assert size(record) > MAX_ITEM_BYTES  # the outage: every save of this record was refused
    compacted = compact_record(record)
    assert size(compacted) < SAFE_ITEM_BYTES
    # the current attempt keeps every node's report; each earlier one the node that ended it, and its summary
    assert compacted.attempts[-1] == record.attempts[-1]
    for attempt in compacted.attempts[:-1]:
        assert [r.state for r in attempt.node_reports] == ["failed"]
        assert attempt.node_summary.states == {"failed": 1, "running": nodes - 1}


def test_an_earlier_attempt_keeps_the_earliest_ended_reports_that_explain_its_end():
    compacted = compact_record(restarted_three_times())
    first, second, third = compacted.attempts
    assert [r.state for r in first.node_reports] == ["failed", "gone"]
    # 10 hung nodes: the 8 that ended first (599 - k: the last 8), in the attempt's order
    assert len(second.node_reports) == KEPT_REPORTS
    assert [r.ended_at for r in second.node_reports] == [at(599 - k) for k in range(2, 10)]
    assert len(third.node_reports) == 12 and third.node_summary is None
    assert second.node_summary.states == {"hung": 10, "running": 2} and second.node_summary.reports == 12


def test_goodput_and_the_restart_timeline_are_the_same_before_and_after_compaction():
    record = restarted_three_times()
    compacted = compact_record(record)
    stored = _from_item(_to_item(compacted))  # as the table reads it back
    assert stored == compacted
    end = T0 + datetime.timedelta(seconds=2000)
    before = job_goodput(record, end)
    assert before is not None and before.seconds["failure_detection"] > 0 and before.seconds["checkpoint_save"] > 0
    for after in (compacted, stored, fit_record(record, size, limit=0)):  # limit 0: every stage dropped its part
        assert job_goodput(after, end) == before
        assert [restart_seconds(after, n) for n in (1, 2)] == [restart_seconds(record, n) for n in (1, 2)]
        assert timeline_lines(after) == timeline_lines(record)
    assert restart_seconds(compacted, 1)["compile_cache"] == {"snapshot": 10, "nodes": 10}


def test_the_summary_of_a_current_attempt_is_computed_from_its_reports():
    record = restarted_three_times()
    assert node_summary(record.attempts[1]).quiet_since == at(560, ms=True)
    assert node_summary(record.attempts[1]).first_ended_at == at(590)
    assert node_summary(record.attempts[1]).last_ended_at is None  # two nodes still ran
    assert node_summary(record.attempts[2]).last_ended_at == at(1000)
    assert node_summary(record.attempts[0]).phase_ms == {"checkpoint_save": 12_009, "validation": 3_000,
                                                         "export": 9_000}


def test_past_the_safe_bound_the_warnings_then_the_old_reports_go():
    record = big_record(256, 8)
    compacted = compact_record(record)
    warnings_gone = fit_record(record, size, limit=size(compacted) - 1)
    assert all(r.dropped == [] and r.detail is None for a in warnings_gone.attempts[:-1] for r in a.node_reports)
    assert all(len(a.node_reports) == 1 for a in warnings_gone.attempts[:-1])
    assert warnings_gone.attempts[-1] == record.attempts[-1]
    reports_gone = fit_record(record, size, limit=size(warnings_gone) - 1)
    assert all(a.node_reports == [] and a.node_summary is not None for a in reports_gone.attempts[:-1])
    assert reports_gone.attempts[-1] == record.attempts[-1]


def test_status_counts_an_earlier_attempts_nodes_by_state():
    text = format_record(compact_record(restarted_three_times()))
    assert "(node states: hung 10, running 2; 8 report(s) kept)" in text
    assert f"attempt 3 nodes: {', '.join(node_ids(12, 3))}\n" in text


# --- on the table ------------------------------------------------------------------------------------------


@pytest.fixture()
def nodes(monkeypatch, tmp_path):
    isolate_from_real_aws(monkeypatch, tmp_path, "us-east-1")
    with mock_aws():
        yield deploy()


def test_a_256_node_record_of_8_attempts_saves_through_the_job_table(nodes):
    # 8 attempts: past 400 KB whole (256 x 6 already is), and cheaper on moto than the 20 measured above
    created = submit(nodes)
    record = dataclasses.replace(big_record(256, 8), version=created.version, created_at=created.created_at)
    with pytest.raises(botocore.exceptions.ClientError, match="size"):  # as it was: refused whole
        put_raw(_to_item(record))
    written = table().save(record, T0)
    read = table().get(JOB)
    assert read == written and item_size_bytes(raw_item()) < SAFE_ITEM_BYTES
    assert len(read.current.node_reports) == 256 and all(len(a.node_reports) == 1 for a in read.attempts[:-1])
    end = T0 + datetime.timedelta(hours=2)
    assert job_goodput(read, end) == job_goodput(record, end)


def test_a_record_written_before_the_summary_reads_and_is_compacted_by_its_next_save(nodes):
    submit(nodes)
    old = dataclasses.replace(restarted_three_times(), state="running", ended_at=None, version=1)
    put_raw(_to_item(old))  # every report of every attempt, no nodeSummary: as an older writer left it
    read = table().get(JOB)
    assert read == old and read.dropped_on_read == []
    saved = table().save(read, T0)
    again = table().get(JOB)
    assert again == saved and [len(a.node_reports) for a in again.attempts] == [2, 8, 12]
    end = T0 + datetime.timedelta(seconds=2000)
    assert job_goodput(again, end) == job_goodput(old, end)


def test_a_summary_that_does_not_fit_is_dropped_on_read(nodes):
    submit(nodes)
    put_raw({**_to_item(compact_record(restarted_three_times())), "version": {"N": "1"}})
    item = raw_item()
    item["attempts"]["L"][0]["M"]["nodeSummary"] = {"S": "not a map"}
    item["attempts"]["L"][1]["M"]["nodeSummary"]["M"]["reports"] = {"S": "12"}
    put_raw(item)
    read = table().get(JOB)
    assert read.attempts[0].node_summary is None and read.attempts[1].node_summary.reports == 0
    assert read.dropped_on_read == ["attempts[0].node_summary: a string of 9 characters, not a map: dropped",
                                    "attempts[1].node_summary.reports: a string of 2 characters, not int: dropped"]


def test_the_keepers_restart_compacts_the_attempt_that_ended(nodes):
    a, b = nodes
    submit(nodes)
    ssm = FakeSsm()
    ssm.stdout = {a: running(40, state="hung", exitCode=-9, endedAt="2026-11-20T23:29:00Z"), b: running(41)}
    outcome = keeper(ssm).reconcile()
    assert (outcome.action, outcome.state) == ("started", "starting")
    first, second = table().get(JOB).attempts
    assert [(r.instance_id, r.state) for r in first.node_reports] == [(a, "hung")]
    assert first.node_summary.states == {"hung": 1, "running": 1} and first.node_summary.reports == 2
    assert second.node_summary is None


def test_a_nodes_end_time_with_a_fraction_does_not_stop_a_save_or_goodput(nodes):
    # node_answer.TIME_RE lets a node's times carry a fraction; parse_time raised on one, and every later save
    # (the compaction reads the reports' ends) failed: the keeper's rounds would end in "error" for good
    created = submit(nodes)
    record = restarted_three_times()
    fractional = [dataclasses.replace(r, ended_at=at(290.25, ms=True)) if r.state == "failed" else r
                  for r in record.attempts[0].node_reports]
    attempts = [dataclasses.replace(record.attempts[0], node_reports=fractional), *record.attempts[1:]]
    record = dataclasses.replace(record, attempts=attempts, version=created.version, created_at=created.created_at)
    written = table().save(record, T0)
    assert table().get(JOB) == written
    assert written.attempts[0].node_reports[0].ended_at == at(290.25, ms=True)
    end = T0 + datetime.timedelta(seconds=2000)
    assert job_goodput(written, end) == job_goodput(record, end)
