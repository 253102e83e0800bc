"""The job keeper: brings the cluster's active job back after a lost node, without a person.

One `reconcile` reads the active job (cluster_jobs/table.py) and the cluster afresh and moves the job on
as far as the world allows (a fault found while running ends the attempt, and the same round stops the
survivors and starts the next attempt when enough nodes are ready):

- starting/running: ask the attempt's nodes for the job's state through the jobs document (the same
  `status` clusterctl runs) and copy their answers into the record. A fault is a node of the attempt that
  is gone (terminated, replaced), marked unhealthy (node health monitor tag or Auto Scaling health), whose
  supervisor stopped a hung trainer, that lost the job, or whose trainer exited non-zero while other nodes
  still run. A fault ends the attempt (`restarting`, with the fault as the reason), or the job (`failed`,
  and a message on the alarm topic) once `max_job_restarts` restarts were spent. Without a fault: every node
  succeeded -> `succeeded`; every node failed on its own (no node lost) -> `failed`: a job that fails by
  itself everywhere (a bad config, a NaN check) would fail again on new nodes.
- restarting: stop what is left of the old attempt (the jobs document's `cancel` in mode abort: torchrun and
  its workers SIGKILLed at once, bounded by ABORT_STOP_SECONDS, not the stop grace: the job restarts from its
  local or durable checkpoint tier, and a collective save could only block without the lost node), wait until
  the group again has the job's node count of ready nodes, and start the next attempt on the first of them by
  private IP (a new rendezvous host: the old one may be the node that was lost) with the same job id and
  checkpoint directory: the trainer's `--resume auto` loads the newest complete checkpoint. That write keeps of
  the ended attempt only the reports of the nodes that explain its end and their summary (JobTable.save,
  cluster_jobs/compaction.py: the record stays one DynamoDB item at 256 nodes). The attempt is
  written before any node is told to start, so a `cancel` written meanwhile makes the write fail (job_table's
  optimistic concurrency) and the keeper stops there; a cancel that lands after the write is seen right after
  the start, and the new attempt is cancelled.
- A Capacity Block that is about to end (its EventBridge expiration warning, or the reservation's end date
  within WARNING_BEFORE_END) stops the job with a checkpoint and records it `cancelled` by
  "capacity block end": never restarted.

Every state change is one conditional write; a write that loses a race (StaleRecord) ends the round, and
the next round (the one-minute schedule, or the next Auto Scaling event) decides again from what is there.
What the nodes answer reaches the record only through cluster_jobs/node_answer.py's schema, and a record is
read through cluster_jobs/record_schema.py's; a record the round still cannot read or save ends the round
with an "error" outcome, logged with its job (handler.py then fails the invocation, which alarms).
"""

from __future__ import annotations

import dataclasses
import datetime
import json
import logging
import time
from collections.abc import Callable, Mapping, Sequence

import botocore.exceptions

from cluster_aws.errors import ClusterctlError
from cluster_aws.nodes import Node, list_nodes, select_job_nodes
from cluster_jobs.document import ABORT_STOP_SECONDS, abort_job, query_job, submit_job
from cluster_jobs.job_parameters import JobParameters
from cluster_jobs.node_states import GONE, HANG_HERE, NodeJobState
from cluster_jobs.table import (
    ACTIVE_STATES,
    FINAL_STATES,
    Attempt,
    JobRecord,
    JobTable,
    StaleRecord,
    UnreadableRecord,
    utc_now_text,
)
from cluster_jobs.timeline import phase_text, with_node_phases
from job_keeper.settings import MANUAL, Clients, KeeperSettings, Outcome, Trigger

LOG = logging.getLogger("job_keeper.keeper")

# EC2 sends the expiration warning 40 minutes before a Capacity Block ends and starts terminating its
# instances 10 minutes later (EC2 User Guide, "Monitor Capacity Blocks using EventBridge").
WARNING_BEFORE_END = datetime.timedelta(minutes=40)
CAPACITY_BLOCK = "capacity-block"
CANCELLED_BY_BLOCK_END = "capacity block end"
NO_ANSWER = ("unknown",)  # an SSM hiccup is not a fault: the next round asks again


class Keeper:
    def __init__(
        self,
        settings: KeeperSettings,
        clients: Clients,
        *,
        now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC),
        sleep: Callable[[float], None] = time.sleep,
        clock: Callable[[], float] = time.monotonic,
    ) -> None:
        self.settings = settings
        self.clients = clients
        self.table = JobTable(clients.dynamodb, settings.table_name)
        self._now = now
        self._sleep = sleep
        self._clock = clock
        self._trigger = MANUAL  # this round's: what saw a fault it finds (the restart timeline)

    # --- the round ---------------------------------------------------------------------------------------

    def reconcile(self, trigger: Trigger = MANUAL) -> Outcome:
        self._trigger = trigger
        try:
            record = self.table.active()
        except UnreadableRecord as e:
            return self._cannot_handle(self.table.active_job_id(), e)
        if record is None:
            return Outcome(None, "idle", None, "no active job")
        if record.state in FINAL_STATES:  # a final write whose lock was left behind (older clusterctl)
            self.table.release_lock(record.job_id)
            return Outcome(record.job_id, "released", record.state)
        try:
            ending = self._block_ending(trigger)
            if ending:
                return self._stop_for_block_end(record, ending)
            if record.state == "restarting":
                return self._continue_restart(record)
            return self._watch(record)
        except StaleRecord as e:
            return Outcome(record.job_id, "raced", record.state, str(e))
        except (botocore.exceptions.ClientError, TypeError, ValueError) as e:  # DynamoDB refused this record
            return self._cannot_handle(record.job_id, e)

    def _cannot_handle(self, job_id: str | None, error: Exception) -> Outcome:
        """A record this round cannot read or save (issue 42): logged with its job, and an "error" outcome,
        which the handler turns into a failed invocation after the round's result line (the function's Errors
        metric, which JobKeeperErrorsAlarm watches). The next round reads the record afresh."""
        line = (f"{type(error).__name__}: {error}".splitlines() or [""])[0][:500]
        LOG.error("job %s: this round cannot handle its record: %s", job_id, line)
        return Outcome(job_id, "error", None, line)

    # --- starting / running ------------------------------------------------------------------------------

    def _watch(self, record: JobRecord) -> Outcome:
        attempt = record.current
        assert attempt is not None
        nodes = {n.instance_id: n for n in self._nodes()}
        states = self._query(record.job_id, attempt.nodes, "status")
        record = self._with_reports(record, states)
        fault = self._fault(record, states, nodes)
        if fault:
            return self._on_fault(record, fault, states)
        names = {s.state for s in states}
        if names == {"succeeded"}:
            return self._finish(record, "succeeded", f"attempt {attempt.number} succeeded on every node")
        if names and names <= {"failed", "succeeded", "cancelled"} and "running" not in names:
            if "failed" in names:
                codes = sorted({s.exit_code for s in states if s.state == "failed" and s.exit_code is not None})
                return self._finish(
                    record, "failed", f"the trainer exited with code {', '.join(map(str, codes)) or '?'} on every "
                    "node with no node lost: not restarted (a job that fails by itself fails again)")
            return self._finish(record, "cancelled", "stopped on every node outside clusterctl")
        if record.state == "starting" and "running" in names:
            record = dataclasses.replace(record, state="running", reason=None)
        record = self.table.save(record, self._now())
        return Outcome(record.job_id, "observed", record.state, _summary(states))

    def _fault(self, record: JobRecord, states: Sequence[NodeJobState],
               nodes: Mapping[str, Node]) -> str | None:
        """The attempt's fault, the one that explains the others first: a node lost or unhealthy; then a hang,
        the node the hang is on first (its supervisor's verdict, node_bootstrap/jobs/hang_origin.py: its peers
        were hung too, or failed when it was stopped); then a node without the job, or one failed by itself."""
        by_id = {s.instance_id: s for s in states}
        running = [s for s in states if s.state == "running"]
        hung: list[NodeJobState] = []
        later: list[str] = []
        for instance_id in record.current.nodes if record.current else []:
            state = by_id.get(instance_id)
            node = nodes.get(instance_id)
            if state is not None and state.state == GONE:
                return f"node {instance_id} lost: {state.detail or 'gone'}"
            if node is None:
                return f"node {instance_id} lost: no longer in the Auto Scaling group"
            if node.health_monitor == "unhealthy" or node.health_status != "Healthy":
                return f"node {instance_id} unhealthy: {node.not_ready_reason}"
            if state is None or state.state in NO_ANSWER:
                continue
            if state.state == "hung":
                hung.append(state)
            elif state.state == "not-found":
                later.append(f"node {instance_id} no longer has the job (rebooted or replaced disk?)")
            elif state.state == "failed" and running:
                later.append(f"node {instance_id}: the trainer exited with code {state.exit_code} while "
                             f"{len(running)} other node(s) still ran")
        if hung:
            return _hang_fault(hung)
        return later[0] if later else None

    def _on_fault(self, record: JobRecord, fault: str, states: Sequence[NodeJobState]) -> Outcome:
        now = self._now()
        by = self._trigger.kind + (f" ({self._trigger.detail})" if self._trigger.detail else "")
        timeline = {**record.current.timeline, "fault_seen": phase_text(now), "ended": phase_text(now)}
        attempt = dataclasses.replace(record.current, ended_at=utc_now_text(now), end_reason=fault,
                                      timeline=timeline, fault_seen_by=record.current.fault_seen_by or by)
        record = dataclasses.replace(record, attempts=[*record.attempts[:-1], attempt])
        if record.restarts >= record.max_job_restarts:
            reason = (f"gave up after {record.restarts} restart(s) (maxJobRestarts {record.max_job_restarts}): "
                      f"{fault}")
            outcome = self._finish(record, "failed", reason)
            self._stop_survivors(record.job_id, states)
            self._alarm(record, reason)
            return outcome
        record = self.table.save(dataclasses.replace(record, state="restarting", reason=fault), now)
        LOG.warning("job %s: attempt %d ended: %s; restarting", record.job_id, attempt.number, fault)
        self._stop_survivors(record.job_id, states)
        ended = record.current
        stopped = dataclasses.replace(ended, timeline={**ended.timeline, "survivors_stopped": phase_text(self._now())})
        record = self.table.save(dataclasses.replace(record, attempts=[*record.attempts[:-1], stopped]), self._now())
        return self._continue_restart(record, stopped=True)

    # --- restarting --------------------------------------------------------------------------------------

    def _continue_restart(self, record: JobRecord, *, stopped: bool = False) -> Outcome:
        old = record.current
        assert old is not None
        if not stopped:  # a round after the one that saw the fault: the old attempt may still be stopping
            states = self._query(record.job_id, old.nodes, "status")
            if any(s.state == "running" for s in states):
                self._stop_survivors(record.job_id, states)
                return Outcome(record.job_id, "waiting", record.state, "the old attempt is still stopping")
        # the nodes a hang was on (their supervisors' verdict): last in line, so a spare takes their place
        hang_here = [r.instance_id for r in old.node_reports if r.hang_origin == HANG_HERE]
        try:
            selected = select_job_nodes(self._nodes(), record.nodes, last=hang_here)
        except ClusterctlError as e:
            return Outcome(record.job_id, "waiting", record.state, f"waiting for ready nodes: {e}")
        now = self._now()
        number = record.attempt + 1
        attempt = Attempt(number=number, nodes=[n.instance_id for n in selected],
                          rendezvous_host=str(selected[0].private_ip), started_at=utc_now_text(now))
        record = self.table.save(
            dataclasses.replace(record, state="starting", attempts=[*record.attempts, attempt]), now)
        request = JobParameters(
            config=record.config, nodes=record.nodes, gpus_per_node=record.gpus_per_node,
            max_restarts=record.max_restarts, overrides=tuple(record.overrides), module=record.module,
            resume_from=record.resume_from, attempt=number)
        try:
            result = submit_job(self.clients.ssm, self.settings.document_name, selected, request,
                                     record.job_id, self._sleep, self._clock)
        except (botocore.exceptions.ClientError, ClusterctlError) as e:  # refused before any node ran it
            return self._on_fault(record, f"attempt {number} could not be sent: {e}", [])
        latest = self.table.get(record.job_id)
        if latest is not None and latest.state == "cancelled":  # cancelled while the start was on its way
            self._query(record.job_id, attempt.nodes, "cancel")
            return Outcome(record.job_id, "cancelled", "cancelled", "cancelled while attempt "
                           f"{number} started: stopped it")
        if result.failed:
            fault = "attempt {} did not start on {}".format(
                number, "; ".join(f"{i.instance_id}: {i.error}" for i in result.failed))
            states = self._query(record.job_id, attempt.nodes, "status")
            return self._on_fault(latest or record, fault, states)
        # Nodes that were ready and idle when the attempt needed them: hot spares (spareNodes), or replacements
        # that had booted already. The lost nodes' replacements boot meanwhile and become the next spares.
        newcomers = [n for n in attempt.nodes if n not in old.nodes]
        left_out = [n for n in hang_here if n not in attempt.nodes]
        joined = f"; in for the lost: {', '.join(newcomers)}" if newcomers else ""
        if left_out:
            joined = f"; left out, the hang was on it: {', '.join(left_out)}; in its place: {', '.join(newcomers)}"
        LOG.warning("job %s: attempt %d started on %s (rendezvous %s)%s", record.job_id, number,
                    ", ".join(attempt.nodes), attempt.rendezvous_host, joined)
        return Outcome(record.job_id, "started", "starting",
                       f"attempt {number} on {', '.join(attempt.nodes)}, rendezvous {attempt.rendezvous_host}{joined}")

    # --- Capacity Block end ------------------------------------------------------------------------------

    def _block_ending(self, trigger: Trigger) -> str:
        """Why the job must stop for the Capacity Block's end, or ""."""
        settings = self.settings
        if settings.capacity_mode != CAPACITY_BLOCK:
            return ""
        ours = settings.capacity_reservation_id
        if trigger.kind == "capacity-block-expiring" and (not ours or trigger.detail in ("", ours)):
            return (f"Capacity Block {trigger.detail or settings.capacity_reservation_id} ends at "
                    f"{trigger.block_end or 'its end date'} (EC2's expiration warning)")
        if not settings.capacity_reservation_id:
            return ""
        reservations = self.clients.ec2.describe_capacity_reservations(
            CapacityReservationIds=[settings.capacity_reservation_id])["CapacityReservations"]
        end = reservations[0].get("EndDate") if reservations else None
        if end is not None and end - self._now() <= WARNING_BEFORE_END:
            return f"Capacity Block {settings.capacity_reservation_id} ends at {utc_now_text(end)}"
        return ""

    def _stop_for_block_end(self, record: JobRecord, why: str) -> Outcome:
        now = self._now()
        attempt = record.current
        if attempt is not None and attempt.ended_at is None:
            attempt = dataclasses.replace(attempt, ended_at=utc_now_text(now), end_reason=why)
            record = dataclasses.replace(record, attempts=[*record.attempts[:-1], attempt])
        record = self._finish(record, "cancelled", f"{why}: stopped with a checkpoint, not restarted",
                              by=CANCELLED_BY_BLOCK_END)
        if attempt is not None:
            self._query(record.job_id, attempt.nodes, "cancel")
        return Outcome(record.job_id, "cancelled", "cancelled", why)

    # --- helpers -----------------------------------------------------------------------------------------

    def _finish(self, record: JobRecord, state: str, reason: str, by: str | None = None) -> Outcome:
        now = self._now()
        attempt = record.current
        attempts = record.attempts
        if attempt is not None and attempt.ended_at is None:
            attempts = [*attempts[:-1], dataclasses.replace(attempt, ended_at=utc_now_text(now), end_reason=reason)]
        record = self.table.save(dataclasses.replace(
            record, state=state, reason=reason, ended_at=utc_now_text(now), attempts=attempts,
            cancel_requested_by=by or record.cancel_requested_by), now)
        LOG.warning("job %s: %s: %s", record.job_id, state, reason)
        return Outcome(record.job_id, state, state, reason)

    def _nodes(self) -> list[Node]:
        return list_nodes(self.clients.autoscaling, self.clients.ec2, self.settings.group_name)

    def _query(self, job_id: str, instance_ids: Sequence[str], action: str) -> list[NodeJobState]:
        if not instance_ids:
            return []
        return query_job(self.clients.ssm, self.clients.ec2, self.settings.document_name, job_id,
                              instance_ids, action, sleep=self._sleep, clock=self._clock)

    def _stop_survivors(self, job_id: str, states: Sequence[NodeJobState]) -> None:
        """An ended attempt's nodes that still run: aborted (no collective save: its checkpoint tiers already
        cover the job, and without the lost node the save would block until the stop grace)."""
        running = [s.instance_id for s in states if s.state == "running"]
        if running:
            LOG.warning("job %s: aborting what is left on %s (within %d s, no checkpoint)", job_id,
                        ", ".join(running), ABORT_STOP_SECONDS)
            abort_job(self.clients.ssm, self.clients.ec2, self.settings.document_name, job_id, running,
                      sleep=self._sleep, clock=self._clock)

    def _with_reports(self, record: JobRecord, states: Sequence[NodeJobState]) -> JobRecord:
        attempt = record.current
        assert attempt is not None
        reports = [s.report() for s in states]  # parsed answers (cluster_jobs/node_answer.py) only
        steps = [s.last_step for s in states if isinstance(s.last_step, int)]
        reached = max([*steps, attempt.step_reached or 0]) if steps or attempt.step_reached else None
        resumed = next((s for s in states if s.resumed_from_step is not None), None)
        attempt = dataclasses.replace(
            with_node_phases(attempt, states), node_reports=reports, step_reached=reached,
            resumed_from_step=resumed.resumed_from_step if resumed else attempt.resumed_from_step,
            resumed_from_tier=resumed.resumed_from_tier if resumed else attempt.resumed_from_tier,
        )
        return dataclasses.replace(record, attempts=[*record.attempts[:-1], attempt])

    def _alarm(self, record: JobRecord, reason: str) -> None:
        subject = f"{self.settings.stack_name}: job {record.job_id} failed"
        message = {
            "stack": self.settings.stack_name,
            "jobId": record.job_id,
            "state": "failed",
            "attempts": record.attempt,
            "reason": reason,
            "lastStep": record.last_step,
            "see": f"clusterctl status {record.job_id}",
        }
        self.clients.sns.publish(TopicArn=self.settings.alarm_topic_arn, Subject=subject[:100],
                                 Message=json.dumps(message, indent=2))


def _hang_fault(hung: Sequence[NodeJobState]) -> str:
    """A hang's fault line: the node the hang is on where a supervisor found it there, else the first hung node
    and what its supervisor saw (every rank waiting: the node at fault could not be told)."""
    here = [s for s in hung if s.hang_origin == HANG_HERE]
    first = here[0] if here else hung[0]
    line = f"node {first.instance_id}: the trainer made no progress and was stopped (hung)"
    if here:
        line += f"; the hang is on this node: {first.hang_evidence or 'its supervisor said so'}"
        if len(here) > 1:
            line += f" (and on {', '.join(s.instance_id for s in here[1:])})"
    elif first.hang_evidence:
        line += f"; the node at fault could not be told ({first.hang_origin}: {first.hang_evidence})"
    return line


def _summary(states: Sequence[NodeJobState]) -> str:
    return ", ".join(f"{s.instance_id} {s.state}" + (f" step {s.last_step}" if s.last_step is not None else "")
                     for s in states)


__all__ = ["ACTIVE_STATES", "Clients", "Keeper", "KeeperSettings", "Outcome", "Trigger"]
