"""`clusterctl cancel`: mark the job cancelled in its record first (so the job keeper never restarts it and the
one-job lock is free for the next submit: there is no queue), then stop it on every node of its current attempt
that is left."""

from __future__ import annotations

import argparse

from cluster_aws.errors import EXIT_FAILED, EXIT_OK, EXIT_USAGE, ClusterctlError
from cluster_jobs import records as job_records
from cluster_jobs.node_states import NodeJobState
from cluster_jobs.request import validate_job_id
from clusterctl.jobs import view as job_view
from clusterctl.jobs.answers import ask, copy_answers, print_states, query_from_history
from clusterctl.render import to_json
from clusterctl.runtime import Runtime, job_table, say, stack_outputs
from node_bootstrap import jobs as node_jobs


def cancel(args: argparse.Namespace, runtime: Runtime) -> int:
    longest = node_jobs.MAX_CANCEL_TIMEOUT_SECONDS
    if not 0 <= args.timeout_seconds <= longest:
        raise ClusterctlError(
            f"--timeout-seconds={args.timeout_seconds}: allowed: 0-{longest} (the jobs document's "
            f"{node_jobs.COMMAND_TIMEOUT_SECONDS} s command timeout, less what cancel needs after SIGKILL)",
            EXIT_USAGE,
        )
    validate_job_id(args.job_id)
    outputs = stack_outputs(args, runtime)
    table = job_table(outputs, runtime)
    if table is None or table.get(args.job_id) is None:
        states = query_from_history(args, runtime, outputs, "cancel")
        print_states(args, runtime, states, f"job {args.job_id}")
        return _cancel_exit(states)

    # The record first: once it says cancelled, the keeper leaves the job alone, whatever the nodes do next.
    now = runtime.now()
    update = job_records.update_record(table, args.job_id, lambda r: job_records.cancelled(r, now), now)
    record = update.record
    if not update.written:
        why = f": {record.reason}" if record.reason else ""
        if args.json:
            say(runtime, to_json({"jobId": args.job_id, "state": record.state, "sent": False,
                                     "record": job_view.record_json(record, now)}))
        else:
            say(runtime, f"job {args.job_id} already ended ({record.state}{why}); nothing sent")
        return EXIT_OK
    current = record.current
    nodes = current.nodes if current else []
    states = ask(runtime, outputs, args.job_id, nodes, "cancel", args.timeout_seconds) if nodes else []
    record = copy_answers(runtime, table, record, states)  # their exit codes and last steps
    if args.json:
        report = job_view.states_json(args.job_id, states)
        report.update(state=record.state, nodesState=report["state"], sent=bool(nodes),
                      record=job_view.record_json(record, now))
        say(runtime, to_json(report))
    else:
        number = current.number if current else 0
        say(runtime, f"job {args.job_id}: recorded as cancelled (it will not be restarted); stopping attempt "
                        f"{number} on its {len(nodes)} nodes")
        if states:
            print_states(args, runtime, states, f"attempt {number}'s nodes")
    return _cancel_exit(states)


def _cancel_exit(states: list[NodeJobState]) -> int:
    return EXIT_FAILED if any(s.state in ("running", "unknown") for s in states) else EXIT_OK
