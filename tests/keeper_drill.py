"""The job keeper's failure drills, shared by tests/drills/: a LocalCluster (moto for AWS, local processes
as nodes), the keeper called through its Lambda handler with events shaped as AWS documents them, and the real
clusterctl CLI in-process (its SSM client is the one the nodes are attached to and the one the keeper uses).
The fixtures that make a drill are in tests/drills/conftest.py."""

from __future__ import annotations

import dataclasses
import io
import json
import time
from pathlib import Path

import boto3
from aws_events import scheduled_event
from local_cluster import CHECKPOINT_ROOT, DOCUMENT, GROUP, REGION, STACK, TABLE, LocalCluster
from torchrun_support import SMALL

from cluster_aws.errors import EXIT_OK
from cluster_aws.session import AwsContext
from cluster_jobs.table import JobRecord, JobTable
from clusterctl import cli
from job_keeper.handler import handler
from job_keeper.keeper import Clients, Keeper, KeeperSettings
from node_bootstrap.jobs.attempt_log import attempt_part

DRILL_TIMEOUT_S = 300.0
CHECKPOINT_INTERVAL = 5
STEPS = 60
CONFIG = "training/configs/tiny-cpu.toml"
# The tiny CPU trainer, checkpoints every CHECKPOINT_INTERVAL steps, all of them kept (the straight run
# resumes from the one the restart resumed from), a loss line every step.
JOB_OVERRIDES = [*SMALL, f"run.steps={STEPS}", f"checkpoint.interval_steps={CHECKPOINT_INTERVAL}",
                 "checkpoint.keep_last=100", "checkpoint.async_save=false"]


@dataclasses.dataclass(frozen=True)
class CliResult:
    code: int
    out: str
    err: str


def _no_prompt(prompt: str) -> str:
    raise AssertionError(f"clusterctl asked, and a drill cannot answer: {prompt}")


@dataclasses.dataclass
class Drill:
    cluster: LocalCluster
    keeper: Keeper
    table: JobTable
    context: AwsContext  # clusterctl's clients: its SSM client is attached to the cluster, and is the keeper's

    def event(self, event: dict) -> dict:
        return handler(event, None, keeper=self.keeper)

    def clusterctl(self, *argv: str) -> CliResult:
        """clusterctl ARGV against the drill's stack, in-process, as an operator would type it."""
        out, err = io.StringIO(), io.StringIO()
        runtime = cli.Runtime(out=out, err=err, confirm=_no_prompt, context=self.context)
        code = cli.main(["--stack", STACK, *argv], runtime)
        return CliResult(code, out.getvalue(), err.getvalue())

    def clusterctl_json(self, *argv: str) -> dict:
        result = self.clusterctl(*argv, "--json")
        assert result.code == EXIT_OK, result
        return json.loads(result.out)

    def record(self, job_id: str) -> JobRecord:
        record = self.table.get(job_id)
        assert record is not None
        return record

    def submit(self, overrides: list[str]) -> JobRecord:
        """`clusterctl submit` on every node of the stack (NodeCount), with torchrun's --max-restarts 0: the
        keeper, not torchrun, restarts a job that lost a node."""
        submitted = self.clusterctl_json(*submit_argv(overrides))
        assert not submitted["failed"], submitted
        record = self.record(submitted["jobId"])
        assert record.current is not None and record.current.nodes == submitted["nodes"]
        assert record.checkpoint_dir == submitted["checkpointDir"] == f"{CHECKPOINT_ROOT}/{record.job_id}"
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


def attempt_2_started(drill: Drill, job_id: str, nodes: list[str]) -> tuple[dict, int] | None:
    """(attempt 2's resume line, its first step) once it logged both, from attempt 2's part of the logs."""
    resumed = steps = None
    for node in nodes:
        _, part = attempt_part("", drill.cluster.nodes[node].job_log(job_id), 2)
        for line in part.splitlines():
            if RESUME_LINE in line and resumed is None:
                try:
                    resumed = json.loads(line[line.index(RESUME_LINE):])
                except ValueError:
                    pass  # still being written
        steps = steps or [r["step"] for r in step_records(part)]
    return (resumed, min(steps)) if resumed is not None and steps else None


def wait_for_attempt_2(drill: Drill, job_id: str, nodes: list[str]) -> tuple[dict, int]:
    """attempt_2_started, polled until attempt 2 logged its resume line and a step (what a drill times)."""
    deadline = time.monotonic() + DRILL_TIMEOUT_S
    while (started := attempt_2_started(drill, job_id, nodes)) is None:
        assert time.monotonic() < deadline, "attempt 2 logged no step"
        time.sleep(0.05)
    return started


def submit_argv(overrides: list[str]) -> list[str]:
    return ["submit", "--config", CONFIG, "--max-restarts", "0", *(f"--set={o}" for o in overrides)]


def make_drill(tmp_path: Path, *, capacity_mode: str = "on-demand", reservation_id: str = "",
               max_job_restarts: int = 5, spare_nodes: int = 0, node_count: int = 2,
               machine_tmp: Path | None = None) -> Drill:
    cluster = LocalCluster(tmp_path / "cluster", node_count=node_count, capacity_mode=capacity_mode,
                           max_job_restarts=max_job_restarts, spare_nodes=spare_nodes, machine_tmp=machine_tmp)
    context = AwsContext(boto3.Session(region_name=REGION))
    cluster.attach(context.client("ssm"))  # before clusterctl or the keeper sends anything
    settings = KeeperSettings(table_name=TABLE, document_name=DOCUMENT, group_name=GROUP,
                              alarm_topic_arn=cluster.topic_arn, stack_name=STACK, instance_type=cluster.instance_type,
                              capacity_mode=capacity_mode, capacity_reservation_id=reservation_id)
    clients = Clients(dynamodb=context.client("dynamodb"), ssm=context.client("ssm"), ec2=context.client("ec2"),
                      autoscaling=context.client("autoscaling"), sns=context.client("sns"))
    return Drill(cluster, Keeper(settings, clients), JobTable(context.client("dynamodb"), TABLE), context)
