"""Failure drills for the job keeper (job_keeper/keeper.py through its Lambda handler), on this machine.

moto stands in for CloudFormation (the stack's outputs), Auto Scaling, EC2, SSM, DynamoDB and SNS; two "nodes"
run the jobs document's script, the real node launcher (direct) and, in the main drill, the real training
package on the CPU (tests/local_cluster.py). Jobs are submitted, cancelled and read with the real clusterctl
CLI, in-process (`clusterctl.cli.main`), whose SSM client is the one the nodes are attached to and the one the
keeper uses. The keeper is called with events shaped as AWS documents them (EventBridge "Scheduled Event"; EC2
Auto Scaling "EC2 Instance Terminate Successful" / "EC2 Instance Launch Successful"; EC2 "Capacity Block
Expiration Warning"), never with moto's own shapes.
"""

from __future__ import annotations

import json
import time

import pytest
from aws_events import autoscaling_event, expiration_warning, scheduled_event
from keeper_drill import (
    CHECKPOINT_INTERVAL,
    JOB_OVERRIDES,
    RESUME_LINE,
    STEPS,
    losses,
    submit_argv,
    wait_for_attempt_2,
)
from local_cluster import STACK
from torchrun_support import SMALL, run_as_nodes

from cluster_aws.errors import EXIT_FAILED, EXIT_OK

pytestmark = pytest.mark.slow


# --- the drills -----------------------------------------------------------------------------------------


def test_a_lost_rendezvous_node_is_replaced_and_the_job_resumes_bit_exact(drill, tmp_path):
    record = drill.submit(JOB_OVERRIDES)
    job_id = record.job_id
    first_nodes = record.attempts[0].nodes
    lost = first_nodes[0]  # the rendezvous host itself
    assert drill.cluster.private_ip(lost) == record.attempts[0].rendezvous_host

    drill.wait_for_step(job_id, 12)
    assert drill.event(scheduled_event())["state"] == "running"
    lost_at = time.monotonic()
    replacement = drill.cluster.lose(lost)
    drill.cluster.boot(replacement)  # at once: on a P5 its launch and boot take minutes (docs/operations.md)
    outcome = drill.event(autoscaling_event("EC2 Instance Terminate Successful", lost))
    assert outcome["action"] == "started", outcome
    drill.event(autoscaling_event("EC2 Instance Launch Successful", replacement))
    _, first_step = wait_for_attempt_2(drill, job_id, drill.record(job_id).attempts[1].nodes)
    seconds = time.monotonic() - lost_at

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
    assert second.resumed_from_tier == "durable"  # no local tier in this job: the FSx checkpoint, as before
    steps_lost = done.steps_lost(1)
    assert steps_lost is not None and 0 <= steps_lost <= CHECKPOINT_INTERVAL

    # The restarted attempt's losses are those of a straight run resumed from the same checkpoint, bit for bit.
    # what follows a node's last resume line is attempt 2's; rank 0's node has the losses
    attempt2_logs = [drill.cluster.nodes[n].job_log(job_id).rsplit(RESUME_LINE, 1)[-1] for n in second.nodes]
    (rank0_log,) = [log for log in attempt2_logs if losses(log)]
    after_restart = {step: loss for step, loss in losses(rank0_log).items() if step > resumed}
    # the record's checkpoint directory (clusterctl's, from the stack's CheckpointRoot) is where the nodes wrote
    checkpoint = drill.cluster.local_path(done.checkpoint_dir) / f"step-{resumed}"
    assert checkpoint.is_dir(), sorted(p.name for p in checkpoint.parent.iterdir())
    extra = [o for o in JOB_OVERRIDES if o not in SMALL] + [f"checkpoint.dir={tmp_path / 'straight'}"]
    # a reference run: its two ranks start without torchrun's agent (the drill's nodes ran torchrun)
    straight = run_as_nodes([extra, extra], resume=str(checkpoint))
    assert straight.returncode == 0, straight.output[-3000:]
    assert after_restart == {s: v for s, v in straight.losses.items() if s > resumed}
    assert sorted(after_restart) == list(range(resumed + 1, STEPS + 1))
    assert drill.table.active_job_id() is None  # the lock was given back with the final state
    print(f"keeper drill (no spare, durable tier): {seconds:.1f} s from the node's loss to step {first_step}, the "
          f"first resumed step, the replacement's boot not included (resumed from step {resumed}; {steps_lost} "
          "steps lost)")

    # what the operator reads: `clusterctl status` asks attempt 2's nodes, `clusterctl jobs` the table
    status = drill.clusterctl_json("status", job_id)
    assert (status["state"], status["nodesState"]) == ("succeeded", "succeeded"), status
    assert sorted(n["instance_id"] for n in status["nodes"]) == sorted(second.nodes)
    assert [a["steps_lost"] for a in status["record"]["attempts"]] == [steps_lost, None]
    # goodput (cluster_jobs/goodput.py): every second since the submit in one category, from this record
    goodput = status["record"]["goodput"]
    seconds = goodput["seconds"]
    assert sum(seconds.values()) == pytest.approx(goodput["wall_s"], rel=0.01), goodput
    assert min(seconds.values()) >= 0 and seconds["productive"] > 0 and seconds["restart"] > 0, goodput
    assert (seconds["lost_progress"] > 0) == (steps_lost > 0), goodput
    # no spare: the restart waited for the replacement (booted at once here: minutes on a P5) and the survivor's
    # stop; the durable saves every 5 steps (blocking: async_save=false) are checkpoint_save, from the phase records
    assert seconds["waiting_for_nodes"] > 0 and seconds["checkpoint_save"] > 0 and goodput["folded"] == {}, goodput
    print("keeper drill goodput: " + json.dumps(goodput))
    listed = drill.clusterctl_json("jobs")
    assert listed["activeJobId"] is None
    assert [(j["job_id"], j["state"], j["attempt"]) for j in listed["jobs"]] == [(job_id, "succeeded", 2)]


def test_a_second_job_is_refused_while_one_is_active(drill):
    record = drill.submit(JOB_OVERRIDES)
    refused = drill.clusterctl(*submit_argv(JOB_OVERRIDES))
    assert refused.code == EXIT_FAILED and refused.out == "", refused
    assert refused.err == (
        f"clusterctl: error: not submitted: job {record.job_id} (running) is active on this cluster, and a cluster "
        f"runs one job at a time; stop it with: clusterctl cancel {record.job_id} (several jobs at once: deploy "
        "several stacks)\n")
    assert drill.table.active_job_id() == record.job_id
    listed = drill.clusterctl_json("jobs")
    assert listed["activeJobId"] == record.job_id
    assert [j["job_id"] for j in listed["jobs"]] == [record.job_id]  # the refused submit wrote no record
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

    # the operator cancels while the keeper waits for a replacement; the keeper had stopped the survivor already
    cancelled = drill.clusterctl("cancel", job_id)
    assert cancelled.code == EXIT_OK, cancelled
    lines = cancelled.out.splitlines()
    assert lines[0] == (f"job {job_id}: recorded as cancelled (it will not be restarted); stopping attempt 1 on "
                        "its 2 nodes"), cancelled.out
    assert any(line.startswith(lost) and "gone (replaced)" in line for line in lines), cancelled.out
    # the survivor: aborted by the keeper, or failed on its own when its collective lost the killed peer first
    # (which comes first depends on the machine's load): stopped either way
    assert lines[-1] in ("attempt 1's nodes: cancelled (2 nodes, 1 gone (replaced))",
                         "attempt 1's nodes: failed (2 nodes, 1 gone (replaced))"), cancelled.out
    marked = drill.record(job_id)
    assert (marked.state, marked.cancel_requested_by) == ("cancelled", "clusterctl cancel"), marked
    drill.cluster.boot(replacement)  # now the group is whole again
    assert drill.event(autoscaling_event("EC2 Instance Launch Successful", replacement))["action"] == "idle"
    assert drill.event(scheduled_event())["action"] == "idle"
    final = drill.record(job_id)
    assert (final.state, final.attempt) == ("cancelled", 1)
    starts = [r for r in drill.cluster.sent if r["Parameters"]["action"] == ["start"]]
    assert len(starts) == 1  # the submit's; no second attempt was sent


def test_the_restart_limit_fails_the_job_and_publishes_an_alarm(drills):
    drill = drills(max_job_restarts=1)  # the stack's MaxJobRestarts output, which submit records
    record = drill.submit(LONG_JOB)
    assert record.max_job_restarts == 1
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


def test_a_capacity_block_end_stops_the_job_and_it_is_never_restarted(drills):
    drill = drills(capacity_mode="capacity-block")
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
    # the block's end stops with the trainer's checkpoint: the document's default mode (save), never an abort
    (cancel,) = [r["Parameters"] for r in drill.cluster.sent if r["Parameters"]["action"] == ["cancel"]]
    assert "cancelMode" not in cancel and cancel["cancelTimeoutSeconds"] == ["120"], cancel
    # its goodput: the wall time runs to the nodes' end, the stop's save is checkpoint_save, and no failure cost
    goodput = drill.clusterctl_json("status", job_id)["record"]["goodput"]
    seconds = goodput["seconds"]
    assert sum(seconds.values()) == pytest.approx(goodput["wall_s"], rel=0.01), goodput
    assert seconds["checkpoint_save"] > 0 and seconds["productive"] > 0, goodput
    assert seconds["failure_detection"] == seconds["lost_progress"] == seconds["restart"] == 0, goodput
    print("capacity-block drill goodput: " + json.dumps(goodput))
    # EC2 then terminates the instances: the keeper does not bring the job back
    lost = record.attempts[0].nodes[0]
    drill.cluster.boot(drill.cluster.lose(lost))
    assert drill.event(autoscaling_event("EC2 Instance Terminate Successful", lost))["action"] == "idle"
    assert drill.record(job_id).attempt == 1
