"""Failure drills for the job keeper (clusterctl/keeper.py through its Lambda handler), on this machine.

moto stands in for Auto Scaling, EC2, SSM, DynamoDB and SNS; two "nodes" run the jobs document's script, the
real node launcher (direct) and, in the main drill, the real training package on the CPU (tests/drills/
local_cluster.py). The keeper is called with events shaped as AWS documents them (EventBridge "Scheduled
Event"; EC2 Auto Scaling "EC2 Instance Terminate Successful" / "EC2 Instance Launch Successful"; EC2 "Capacity
Block Expiration Warning"), never with moto's own shapes.
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import time
from pathlib import Path

import boto3
import pytest
from aws_events import autoscaling_event, expiration_warning, scheduled_event
from fake_aws import isolate_from_real_aws
from local_cluster import DOCUMENT, GROUP, REGION, STACK, TABLE, LocalCluster
from moto import mock_aws
from torchrun_support import SMALL, torchrun

from clusterctl import jobs
from clusterctl.job_table import Attempt, JobAlreadyActive, JobRecord, JobTable, utc_now_text
from clusterctl.keeper import Clients, Keeper, KeeperSettings
from clusterctl.keeper_lambda import handler
from clusterctl.nodes import list_nodes

pytestmark = pytest.mark.slow
DRILL_TIMEOUT_S = 300.0
CHECKPOINT_INTERVAL = 5
STEPS = 60
# The tiny CPU trainer, checkpoints every CHECKPOINT_INTERVAL steps, all of them kept (the straight run
# resumes from the one the restart resumed from), a loss line every step.
JOB_OVERRIDES = [*SMALL, f"run.steps={STEPS}", f"checkpoint.interval_steps={CHECKPOINT_INTERVAL}",
                 "checkpoint.keep_last=100", "checkpoint.async_save=false"]


# --- the cluster ----------------------------------------------------------------------------------------


@pytest.fixture()
def aws(monkeypatch, tmp_path):
    isolate_from_real_aws(monkeypatch, tmp_path, REGION)
    with mock_aws():
        yield


@dataclasses.dataclass
class Drill:
    cluster: LocalCluster
    keeper: Keeper
    table: JobTable
    ssm: object

    def event(self, event: dict) -> dict:
        return handler(event, None, keeper=self.keeper)

    def record(self, job_id: str) -> JobRecord:
        record = self.table.get(job_id)
        assert record is not None
        return record

    def submit(self, overrides: list[str], *, max_job_restarts: int = 5, nodes: int = 2) -> JobRecord:
        """What `clusterctl submit` does: the record and the lock first, then the start on the first ready
        nodes by private IP."""
        autoscaling, ec2 = boto3.client("autoscaling"), boto3.client("ec2")
        selected = [n for n in list_nodes(autoscaling, ec2, GROUP) if n.ready][:nodes]
        now = datetime.datetime.now(datetime.UTC)
        job_id = jobs.new_job_id(now)
        config = "training/configs/tiny-cpu.toml"
        record = self.table.create(JobRecord(
            job_id=job_id, module="training", config=config,
            config_text=(Path(__file__).parents[2] / config).read_text(), overrides=list(overrides),
            resume_from="", nodes=nodes, gpus_per_node=8, max_restarts=0, max_job_restarts=max_job_restarts,
            instance_type="p5.48xlarge", checkpoint_dir=f"/fsx/checkpoints/{job_id}", state="starting",
            created_at=utc_now_text(now), updated_at=utc_now_text(now),
            attempts=[Attempt(1, [n.instance_id for n in selected], str(selected[0].private_ip),
                              utc_now_text(now))]))
        request = jobs.JobRequest(config=config, nodes=nodes, gpus_per_node=8, max_restarts=0,
                                  overrides=tuple(overrides))
        result = jobs.submit_job(self.ssm, DOCUMENT, selected, request, job_id)
        assert not result.failed, [i.error for i in result.failed]
        return record

    def until(self, job_id: str, predicate, what: str, timeout_s: float = DRILL_TIMEOUT_S) -> JobRecord:
        """Scheduled rounds (the one-minute schedule, compressed) until the record satisfies `predicate`."""
        deadline = time.monotonic() + timeout_s
        while True:
            self.event(scheduled_event())
            record = self.record(job_id)
            if predicate(record):
                return record
            assert time.monotonic() < deadline, f"{what}: not reached; the record: {record}"
            time.sleep(1.0)

    def wait_for_step(self, job_id: str, step: int, timeout_s: float = DRILL_TIMEOUT_S) -> None:
        deadline = time.monotonic() + timeout_s
        while max((last_logged_step(n.job_log(job_id)) for n in self.cluster.nodes.values()), default=0) < step:
            assert time.monotonic() < deadline, f"step {step} not reached"
            time.sleep(0.05)


RESUME_LINE = '{"event": "resume"'


STEP_LINE = '{"event": "step"'


def step_records(log: str) -> list[dict]:
    """The trainer's step lines, wherever a launcher prefix puts them in the line."""
    records = []
    for line in log.splitlines():
        if STEP_LINE in line:
            try:
                records.append(json.loads(line[line.index(STEP_LINE):]))
            except ValueError:
                pass  # a line still being written
    return records


def last_logged_step(log: str) -> int:
    return max((r["step"] for r in step_records(log)), default=0)


def losses(log: str) -> dict[int, float]:
    return {r["step"]: r["loss"] for r in step_records(log) if "loss" in r}


def make_drill(tmp_path: Path, *, capacity_mode: str = "on-demand", reservation_id: str = "") -> Drill:
    cluster = LocalCluster(tmp_path / "cluster", node_count=2)
    ssm = cluster.attach(boto3.client("ssm", region_name=REGION))
    settings = KeeperSettings(table_name=TABLE, document_name=DOCUMENT, group_name=GROUP,
                              alarm_topic_arn=cluster.topic_arn, stack_name=STACK, instance_type="p5.48xlarge",
                              capacity_mode=capacity_mode, capacity_reservation_id=reservation_id)
    dynamodb = boto3.client("dynamodb", region_name=REGION)
    clients = Clients(dynamodb=dynamodb, ssm=ssm, ec2=boto3.client("ec2", region_name=REGION),
                      autoscaling=boto3.client("autoscaling", region_name=REGION),
                      sns=boto3.client("sns", region_name=REGION))
    return Drill(cluster, Keeper(settings, clients), JobTable(dynamodb, TABLE), ssm)


@pytest.fixture()
def drill(aws, tmp_path):
    made = make_drill(tmp_path)
    yield made
    made.cluster.cleanup()


# --- the drills -----------------------------------------------------------------------------------------


def test_a_lost_rendezvous_node_is_replaced_and_the_job_resumes_bit_exact(drill, tmp_path):
    record = drill.submit(JOB_OVERRIDES)
    job_id = record.job_id
    first_nodes = record.attempts[0].nodes
    lost = first_nodes[0]  # the rendezvous host itself
    assert drill.cluster.private_ip(lost) == record.attempts[0].rendezvous_host

    drill.wait_for_step(job_id, 12)
    assert drill.event(scheduled_event())["state"] == "running"
    replacement = drill.cluster.lose(lost)
    drill.cluster.boot(replacement)
    outcome = drill.event(autoscaling_event("EC2 Instance Terminate Successful", lost))
    assert outcome["action"] == "started", outcome
    drill.event(autoscaling_event("EC2 Instance Launch Successful", replacement))

    done = drill.until(job_id, lambda r: r.state not in ("starting", "running", "restarting"), "a final state")
    assert done.state == "succeeded", done
    first, second = done.attempts
    assert first.end_reason.startswith(f"node {lost} lost")
    assert (first.number, second.number) == (1, 2)
    assert lost not in second.nodes and replacement in second.nodes
    assert second.rendezvous_host == drill.cluster.private_ip(second.nodes[0]) != first.rendezvous_host
    # the node launcher on each node was told that new host (the shim records it before mapping it to loopback)
    hosts = [h for n in second.nodes for h in drill.cluster.nodes[n].rendezvous_hosts() if h["attempt"] == 2]
    assert [h["host"] for h in hosts] == [second.rendezvous_host] * 2
    assert second.step_reached == STEPS
    resumed = second.resumed_from_step
    assert resumed and resumed % CHECKPOINT_INTERVAL == 0
    steps_lost = done.steps_lost(1)
    assert steps_lost is not None and 0 <= steps_lost <= CHECKPOINT_INTERVAL

    # The restarted attempt's losses are those of a straight run resumed from the same checkpoint, bit for bit.
    # what follows a node's last resume line is attempt 2's; rank 0's node has the losses
    attempt2_logs = [drill.cluster.nodes[n].job_log(job_id).rsplit(RESUME_LINE, 1)[-1] for n in second.nodes]
    (rank0_log,) = [log for log in attempt2_logs if losses(log)]
    after_restart = {step: loss for step, loss in losses(rank0_log).items() if step > resumed}
    checkpoint = drill.cluster.fsx / "checkpoints" / job_id / f"step-{resumed}"
    assert checkpoint.is_dir(), sorted(p.name for p in checkpoint.parent.iterdir())
    extra = [o for o in JOB_OVERRIDES if o not in SMALL] + [f"checkpoint.dir={tmp_path / 'straight'}"]
    straight = torchrun(extra, resume=str(checkpoint))
    assert straight.returncode == 0, straight.output[-3000:]
    assert after_restart == {s: v for s, v in straight.losses.items() if s > resumed}
    assert sorted(after_restart) == list(range(resumed + 1, STEPS + 1))
    assert drill.table.active_job_id() is None  # the lock was given back with the final state


def test_a_second_job_is_refused_while_one_is_active(drill):
    record = drill.submit(JOB_OVERRIDES)
    with pytest.raises(JobAlreadyActive, match=f"job {record.job_id} .* is active on this cluster"):
        drill.submit(JOB_OVERRIDES)
    assert drill.table.active_job_id() == record.job_id
    starts = [r for r in drill.cluster.sent if r["Parameters"]["action"] == ["start"]]
    assert len(starts) == 1


# Long enough that the job is still running whenever these drills act on it; they stop it themselves.
LONG_JOB = [*SMALL, "run.steps=100000", "checkpoint.interval_steps=1000"]


def test_a_cancel_while_restarting_is_not_undone(drill):
    record = drill.submit(LONG_JOB)
    job_id, lost = record.job_id, record.attempts[0].nodes[0]
    drill.wait_for_step(job_id, 2)
    replacement = drill.cluster.lose(lost)  # the replacement is launched but has not booted yet
    outcome = drill.event(autoscaling_event("EC2 Instance Terminate Successful", lost))
    assert (outcome["action"], outcome["state"]) == ("waiting", "restarting"), outcome
    assert "1 of 2 ready" in outcome["detail"] or "2 nodes asked" in outcome["detail"], outcome

    # what `clusterctl cancel` writes first, before it stops anything
    restarting = drill.record(job_id)
    drill.table.save(dataclasses.replace(restarting, state="cancelled", cancel_requested_by="clusterctl cancel",
                                         reason="cancelled by clusterctl cancel",
                                         ended_at=restarting.updated_at), datetime.datetime.now(datetime.UTC))
    drill.cluster.boot(replacement)  # now the group is whole again
    assert drill.event(autoscaling_event("EC2 Instance Launch Successful", replacement))["action"] == "idle"
    assert drill.event(scheduled_event())["action"] == "idle"
    final = drill.record(job_id)
    assert (final.state, final.attempt) == ("cancelled", 1)
    starts = [r for r in drill.cluster.sent if r["Parameters"]["action"] == ["start"]]
    assert len(starts) == 1  # the submit's; no second attempt was sent


def test_the_restart_limit_fails_the_job_and_publishes_an_alarm(drill):
    record = drill.submit(LONG_JOB, max_job_restarts=1)
    job_id = record.job_id
    for attempt in (1, 2):
        current = drill.record(job_id).attempts[-1]
        assert current.number == attempt
        drill.wait_for_step(job_id, 2 if attempt == 1 else 1)
        lost = current.nodes[-1]
        replacement = drill.cluster.lose(lost)
        drill.cluster.boot(replacement)
        outcome = drill.event(autoscaling_event("EC2 Instance Terminate Successful", lost))
        if attempt == 1:
            assert outcome["action"] == "started", outcome
            drill.until(job_id, lambda r: all(n.last_step for n in r.attempts[-1].node_reports), "attempt 2 steps")
    assert (outcome["action"], outcome["state"]) == ("failed", "failed"), outcome
    final = drill.record(job_id)
    assert final.attempt == 2 and final.reason.startswith("gave up after 1 restart(s) (maxJobRestarts 1): node ")
    assert drill.table.active_job_id() is None
    (alarm,) = drill.cluster.alarms()
    assert alarm["Subject"] == f"{STACK}: job {job_id} failed"
    message = json.loads(alarm["Message"])
    assert (message["jobId"], message["state"], message["attempts"]) == (job_id, "failed", 2)
    assert message["reason"] == final.reason
    # nothing of the job is left running on the surviving node
    survivor = next(n for n in final.attempts[-1].nodes if n in drill.cluster.nodes)
    assert drill.cluster.nodes[survivor].job_status(job_id)["state"] != "running"


def test_a_capacity_block_end_stops_the_job_and_it_is_never_restarted(aws, tmp_path):
    drill = make_drill(tmp_path, capacity_mode="capacity-block")
    try:
        record = drill.submit(LONG_JOB)
        job_id = record.job_id
        drill.wait_for_step(job_id, 2)
        outcome = drill.event(expiration_warning("cr-0123456789abcdef0", "2026-11-23T12:00:00Z"))
        assert (outcome["action"], outcome["state"]) == ("cancelled", "cancelled"), outcome
        final = drill.record(job_id)
        assert final.cancel_requested_by == "capacity block end"
        assert final.reason.startswith("Capacity Block cr-0123456789abcdef0 ends at 2026-11-23T12:00:00Z")
        for node in record.attempts[0].nodes:
            assert drill.cluster.nodes[node].job_status(job_id)["state"] in ("cancelled", "succeeded")
        # EC2 then terminates the instances: the keeper does not bring the job back
        lost = record.attempts[0].nodes[0]
        drill.cluster.boot(drill.cluster.lose(lost))
        assert drill.event(autoscaling_event("EC2 Instance Terminate Successful", lost))["action"] == "idle"
        assert drill.record(job_id).attempt == 1
    finally:
        drill.cluster.cleanup()
