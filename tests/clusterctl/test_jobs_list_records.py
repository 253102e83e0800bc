"""jobs and cost --job on the job table: the recorded jobs listed newest first with their attempts, last step
and cost so far (every attempt's nodes counted), --limit and --json, an empty table, no active job. The stack,
group, instances and the table in moto."""

import json

from job_record_fakes import JOB, P5_USD, put_job

from cluster_aws.errors import EXIT_OK
from cluster_jobs.table import Attempt


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
