"""cluster_jobs.table against moto's DynamoDB: the record, the one-job lock and the conditional writes."""

import dataclasses
import datetime

import boto3
import pytest

from cluster_jobs.table import LOCK_KEY, Attempt, JobAlreadyActive, JobRecord, JobTable, NodeReport, StaleRecord

NOW = datetime.datetime(2026, 11, 20, 23, 15, 2, tzinfo=datetime.UTC)
LATER = NOW + datetime.timedelta(minutes=5)


@pytest.fixture()
def table(moto_aws, fakes):
    return JobTable(boto3.client("dynamodb", region_name=fakes.REGION), fakes.create_job_table())


def record(job_id="j-20261120-231502-ab12", **changes):
    base = JobRecord(
        job_id=job_id,
        module="training",
        config="training/configs/tiny-cpu.toml",
        config_text='[run]\nsteps = 100\n',
        overrides=["optim.lr=3e-4"],
        resume_from="",
        nodes=2,
        gpus_per_node=8,
        max_restarts=3,
        max_job_restarts=5,
        instance_type="p5.48xlarge",
        checkpoint_dir=f"/fsx/checkpoints/{job_id}",
        state="starting",
        created_at="2026-11-20T23:15:02Z",
        updated_at="2026-11-20T23:15:02Z",
        attempts=[Attempt(1, ["i-a", "i-b"], "10.42.1.4", "2026-11-20T23:15:02Z")],
    )
    return dataclasses.replace(base, **changes)


def lock_holder(table):
    item = table.dynamodb.get_item(TableName=table.table_name, Key={"pk": {"S": LOCK_KEY}}).get("Item")
    return item["jobId"]["S"] if item else None


def test_create_writes_the_record_and_takes_the_lock(table):
    written = table.create(record())
    assert written.version == 1
    assert table.get(written.job_id) == written
    assert lock_holder(table) == written.job_id
    assert table.active_job_id() == written.job_id and table.active() == written
    assert table.get("j-20261120-000000-0000") is None


def test_a_second_job_is_refused_with_one_line_naming_the_active_one(table):
    first = table.create(record())
    with pytest.raises(JobAlreadyActive) as refused:
        table.create(record("j-20261120-231600-cd34"))
    assert str(refused.value) == (
        "not submitted: job j-20261120-231502-ab12 (starting) is active on this cluster, and a cluster runs one "
        "job at a time; stop it with: clusterctl cancel j-20261120-231502-ab12 (several jobs at once: deploy "
        "several stacks)"
    )
    assert (refused.value.active_job_id, refused.value.active_state) == (first.job_id, "starting")
    assert table.get("j-20261120-231600-cd34") is None  # neither the record nor the lock was written
    assert lock_holder(table) == first.job_id


def test_a_save_on_a_stale_read_is_refused(table):
    read = table.create(record())
    keeper = table.save(dataclasses.replace(read, state="running"), NOW)
    assert (keeper.version, keeper.updated_at) == (2, "2026-11-20T23:15:02Z")
    with pytest.raises(StaleRecord, match="changed while it was being updated; read it again"):
        table.save(dataclasses.replace(read, state="cancelled"), LATER)
    assert table.get(read.job_id) == keeper  # the later write did not undo the keeper's
    again = table.get(read.job_id)
    assert table.save(dataclasses.replace(again, state="restarting"), LATER).version == 3


def test_a_final_state_gives_the_lock_back_in_the_same_write(table):
    read = table.create(record())
    running = table.save(dataclasses.replace(read, state="running"), NOW)
    assert lock_holder(table) == read.job_id  # an active state keeps it
    done = table.save(dataclasses.replace(running, state="succeeded", ended_at="2026-11-20T23:20:02Z"), LATER)
    assert lock_holder(table) is None and table.active() is None
    assert table.get(read.job_id) == done
    table.create(record("j-20261120-232100-cd34"))  # the cluster takes the next job
    assert lock_holder(table) == "j-20261120-232100-cd34"


def test_a_stale_final_save_keeps_the_lock(table):
    read = table.create(record())
    table.save(dataclasses.replace(read, state="restarting"), NOW)
    with pytest.raises(StaleRecord):
        table.save(dataclasses.replace(read, state="cancelled"), LATER)
    assert lock_holder(table) == read.job_id


def test_a_finished_job_is_still_written_after_the_next_job_took_the_lock(table):
    """status copies the nodes' last answers into a finished job's record: that must neither fail nor touch
    the lock the next job holds."""
    first = table.create(record())
    done = table.save(dataclasses.replace(first, state="failed", reason="exit code 1"), NOW)
    table.create(record("j-20261120-232100-cd34"))
    copied = table.save(dataclasses.replace(done, attempts=[dataclasses.replace(
        done.attempts[0], node_reports=[NodeReport("i-a", "failed", exit_code=1, last_step=40)])]), LATER)
    assert table.get(first.job_id) == copied and copied.version == 3
    assert lock_holder(table) == "j-20261120-232100-cd34"


def test_release_lock_gives_back_only_the_named_jobs_lock(table):
    table.create(record())
    assert table.release_lock("j-20261120-231600-cd34") is False
    assert lock_holder(table) == "j-20261120-231502-ab12"
    assert table.release_lock("j-20261120-231502-ab12") is True
    assert lock_holder(table) is None
    assert table.release_lock("j-20261120-231502-ab12") is False  # already given back


def test_jobs_lists_every_job_newest_first_without_the_lock(table):
    ids = ["j-20261119-080000-aaaa", "j-20261121-090000-bbbb", "j-20261120-100000-cccc"]
    for job_id in ids:
        created = table.create(record(job_id))
        table.save(dataclasses.replace(created, state="succeeded"), NOW)
    table.create(record("j-20261121-120000-dddd"))  # active: the lock item exists
    assert [r.job_id for r in table.jobs()] == [
        "j-20261121-120000-dddd", "j-20261121-090000-bbbb", "j-20261120-100000-cccc", "j-20261119-080000-aaaa"
    ]


def test_every_field_survives_the_round_trip(table):
    full = record(
        module="training.commcheck",
        config="/fsx/configs/run.toml",
        config_text="",
        overrides=["min_busbw_gbps=350.0", "dtype=float32"],
        resume_from="j-20261119-080000-aaaa",
        nodes=3,
        gpus_per_node=4,
        max_restarts=0,
        max_job_restarts=7,
        instance_type="p4d.24xlarge",
        checkpoint_dir="/lustre/ckpt/j-20261120-231502-ab12",
        state="restarting",
        created_at="2026-11-20T23:15:02Z",
        updated_at="2026-11-20T23:40:00Z",
        attempts=[
            Attempt(1, ["i-a", "i-b", "i-c"], "10.42.1.4", "2026-11-20T23:15:02Z", ended_at="2026-11-20T23:30:00Z",
                    end_reason="node i-b terminated", step_reached=120, resumed_from_step=0,
                    node_reports=[NodeReport("i-a", "failed", exit_code=1, last_step=120,
                                             started_at="2026-11-20T23:15:05Z", ended_at="2026-11-20T23:30:00Z",
                                             detail="torchrun: worker exited"),
                                  NodeReport("i-b", "gone", detail="gone (replaced): instance terminated")]),
            Attempt(2, ["i-a", "i-c", "i-d"], "10.42.1.5", "2026-11-20T23:35:00Z", resumed_from_step=100),
        ],
        ended_at="2026-11-21T01:00:00Z",
        reason="node i-b terminated",
        cancel_requested_by="clusterctl cancel",
        fp8_backend="torchao",
    )
    assert all(getattr(full, f.name) != getattr(record(), f.name)
               for f in dataclasses.fields(JobRecord)
               if f.name not in ("job_id", "created_at", "version", "dropped_on_read"))  # the last: never stored
    written = table.create(full)
    assert table.get(full.job_id) == written == dataclasses.replace(full, version=1)
    raw = table.dynamodb.get_item(TableName=table.table_name, Key={"pk": {"S": full.job_id}})["Item"]
    # camelCase attribute names; None is left out, not stored as NULL
    assert raw["maxJobRestarts"] == {"N": "7"} and raw["configText"] == {"S": ""}
    assert "exitCode" not in raw["attempts"]["L"][0]["M"]["nodeReports"]["L"][1]["M"]
    assert written.attempt == 2 and written.restarts == 1 and written.last_step == 120
    assert written.steps_lost(1) == 20 and written.steps_lost(2) is None


def test_a_record_written_by_newer_code_still_loads(table):
    """An attempt field this code does not know (a newer clusterctl or keeper wrote it) is skipped, not fatal."""
    written = table.create(record(attempts=[Attempt(1, ["i-a", "i-b"], "10.42.1.4", "2026-11-20T23:15:02Z",
                                                    resumed_from_step=40, resumed_from_tier="local")]))
    item = table.dynamodb.get_item(TableName=table.table_name, Key={"pk": {"S": written.job_id}})["Item"]
    item["attempts"]["L"][0]["M"]["resumedFromShard"] = {"S": "a field from the future"}
    table.dynamodb.put_item(TableName=table.table_name, Item=item)
    loaded = table.get(written.job_id)
    assert (loaded.current.resumed_from_step, loaded.current.resumed_from_tier) == (40, "local")
