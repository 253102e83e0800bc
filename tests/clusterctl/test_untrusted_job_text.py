"""What a job prints is untrusted input (issue 42), on the operator's side: `status`, `jobs` and `top` work when
a node answers outside the schema or a poisoned record is already in the job table, and what a job wrote is
shown with its escape sequences as text (clusterctl.render.terminal_safe). moto; SSM through a Stubber."""

import dataclasses
import datetime
import json

import boto3
from job_record_fakes import JOB, expect, put_job, running
from rich.console import Console

from cluster_aws.errors import EXIT_OK
from cluster_jobs import records as job_records
from cluster_jobs.node_states import NodeJobState
from cluster_jobs.ssm_commands import Invocation
from cluster_jobs.table import Attempt, JobRecord
from clusterctl.jobs import view as job_view
from clusterctl.watch.collect import ClusterView, JobView
from clusterctl.watch.view import render

# the line, as the node's parser would have taken NCCL's network from it
ESCAPES = "\x1b]0;pwned\x07\x1b[2J"
NCCL_LINE = f"NCCL INFO Using network {ESCAPES}"


def poison(job_id: str = JOB) -> None:
    """What the keeper stored before the parser: a float step, a string resume step and tier with escapes."""
    dynamodb = boto3.client("dynamodb", region_name="us-east-1")
    table = "TrainingClusterStack-JobTable-Q1w2E3"
    item = dynamodb.get_item(TableName=table, Key={"pk": {"S": job_id}})["Item"]
    attempt = item["attempts"]["L"][0]["M"]
    attempt.update(stepReached={"N": "2.5"}, resumedFromStep={"S": "40"}, resumedFromTier={"S": ESCAPES})
    item["reason"] = {"S": f"attempt 1 did not start on i-1: {NCCL_LINE}"}
    dynamodb.put_item(TableName=table, Item=item)


def answer(instance_id: str, payload: dict) -> NodeJobState:
    return NodeJobState.from_invocation(Invocation(instance_id, "Success", 0, json.dumps(payload), ""))


def test_a_string_step_does_not_make_with_node_answers_raise(cluster):
    a = cluster.instance_ids[0]
    record = JobRecord(
        job_id=JOB, module="training", config="c.toml", config_text="", overrides=[], resume_from="", nodes=1,
        gpus_per_node=8, max_restarts=0, max_job_restarts=5, instance_type="p5.48xlarge", checkpoint_dir="",
        state="running", created_at="2026-11-20T23:15:02Z", updated_at="2026-11-20T23:15:02Z",
        attempts=[Attempt(1, [a], "10.42.1.4", "2026-11-20T23:15:02Z", step_reached=7)])
    state = answer(a, running(JOB, step="12"))
    copied = job_records.with_node_answers(record, [state])
    assert copied.current.step_reached == 7  # the string step dropped, the record's own step kept
    assert copied.current.node_reports[0].dropped == ["lastStep: a string of 2 characters, not an int in "
                                                      "0..999999999999"]


def test_status_and_jobs_read_a_record_poisoned_before_the_parser(cli, cluster, fakes, ssm_stub):
    a, b, _ = cluster.instance_ids
    put_job(fakes, "running", attempts=[Attempt(1, [a, b], cluster.private_ips[0], "2026-11-20T23:15:02Z")])
    poison()
    listed = cli("jobs", "--json")
    assert listed.code == EXIT_OK, listed.err
    (shown,) = json.loads(listed.out)["jobs"]
    assert shown["attempts"][0]["step_reached"] is None and shown["attempts"][0]["resumed_from_step"] is None
    assert shown["dropped_on_read"] == [
        "attempts[0].step_reached: a float, not int | None: dropped",
        "attempts[0].resumed_from_step: a string of 2 characters, not int | None: dropped"]
    assert "\x1b" not in listed.out  # JSON writes ESC as \u001b

    expect(ssm_stub, fakes, "status", JOB, {a: running(JOB, 140, 2.5), b: running(JOB, 2.5, 2.5)})
    result = cli("status", JOB)
    assert result.code == EXIT_OK, result.err
    assert "\x1b" not in result.out and "\x07" not in result.out
    assert "reason: attempt 1 did not start on i-1: NCCL INFO Using network \\x1b]0;pwned\\x07\\x1b[2J" in result.lines
    assert f"{b}: 1 value(s) of its answer dropped: lastStep: a float, not an int in 0..999999999999" in result.lines
    record = fakes.job_table().get(JOB)  # status saved it back: clean, the float gone
    assert record.current.step_reached == 140 and record.dropped_on_read == []
    # a tier with escapes next to a valid step: the RESUMED FROM cell shows them as text
    resumed = dataclasses.replace(record.current, resumed_from_step=40)
    attempt_row = job_view.format_record(dataclasses.replace(record, attempts=[resumed])).splitlines()[4]
    assert attempt_row.split()[6:8] == ["40", "\\x1b]0;pwned\\x07\\x1b[2J"]


def test_jobs_lists_the_others_when_one_item_cannot_be_read(cli, cluster, fakes):
    put_job(fakes, "succeeded", job_id="j-20261119-080000-aaaa")
    boto3.client("dynamodb", region_name="us-east-1").put_item(
        TableName="TrainingClusterStack-JobTable-Q1w2E3",
        Item={"pk": {"S": "j-20261118-080000-bbbb"}, "state": {"L": []}})
    result = cli("jobs", "--json")
    assert result.code == EXIT_OK, result.err
    report = json.loads(result.out)
    assert [j["job_id"] for j in report["jobs"]] == ["j-20261119-080000-aaaa"]
    (line,) = report["unreadable"]
    assert line.startswith("job j-20261118-080000-bbbb: its record in the job table cannot be read: ")


def test_the_nodes_table_shows_a_network_with_escapes_as_text():
    state = NodeJobState("i-0a", "running", None, 5, 2.5, "2026-11-20T23:15:05Z", None, f"cancel: {ESCAPES}",
                         nccl_network=NCCL_LINE)
    shown = job_view.format_states([state], "attempt 1's nodes")
    assert "\x1b" not in shown and "\x07" not in shown
    (row,) = [line for line in shown.splitlines() if line.startswith("i-0a")]
    assert "NCCL INFO Using network \\x1b]0;pwned\\x07\\x1b[2J" in row and row.endswith("\\x1b[2J")


def test_the_nodes_answer_with_escapes_is_dropped_not_kept():
    state = answer("i-0a", running(JOB, 5) | {"ncclNetwork": ESCAPES, "cancel": NCCL_LINE})
    assert (state.nccl_network, state.detail, state.last_step) == (None, None, 5)
    assert state.dropped == (
        f"cancel: a string of {len(NCCL_LINE)} characters, not at most 400 printable characters",
        f"ncclNetwork: a string of {len(ESCAPES)} characters, not a short printable name",
    )


def test_top_shows_a_records_reason_and_tier_as_text():
    at = datetime.datetime(2026, 11, 20, 23, 30, tzinfo=datetime.UTC)
    job = JobView(job_id="j-1", step=5, run_steps=10, loss=None, tokens_per_s=None, mfu_pct=None,
                  step_time_max_s=None, step_time_median_s=None, straggler_ratio=None, slowest_rank=None,
                  eta_s=None, updated_at=at, state="running", attempt=2, restarts=1, max_job_restarts=5,
                  reason=NCCL_LINE, nodes=2, attempt_started_at=at, resumed_from_step=40, resumed_from_tier=ESCAPES)
    view = ClusterView(stack_name="S", instance_type="p5.48xlarge", node_count=2, collected_at=at, nodes=[],
                       job=job, group_created_at=None, cost_usd=None, usd_per_node_hour=55.04)
    console = Console(width=200, color_system=None, force_terminal=False)
    with console.capture() as capture:
        console.print(render(view))
    text = capture.get()
    assert "\x1b" not in text and "\x07" not in text
    assert "reason: NCCL INFO Using network \\x1b]0;pwned\\x07\\x1b[2J" in text
    assert "resumed from the checkpoint at step 40 (\\x1b]0;pwned\\x07\\x1b[2J tier)" in text
