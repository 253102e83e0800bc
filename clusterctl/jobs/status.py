"""`clusterctl jobs` and `clusterctl status`: the job table's records, newest first, and one job's record
above its nodes' own answers (which are copied into the record). A job not in the table is found in SSM's
command history (clusterctl.jobs.answers)."""

from __future__ import annotations

import argparse

from cluster_aws.errors import EXIT_FAILED, EXIT_OK
from cluster_jobs import records as job_records
from cluster_jobs.export import CHECKPOINT_BUCKET_OUTPUT, export_place
from cluster_jobs.node_states import NodeJobState, nodes_on_tcp, overall_state
from cluster_jobs.request import validate_job_id
from cluster_jobs.table import ACTIVE_STATES, UnreadableRecord
from clusterctl.jobs import view as job_view
from clusterctl.jobs.answers import ask, copy_answers, print_states, query_from_history
from clusterctl.render import format_table, format_usd, to_json
from clusterctl.runtime import Runtime, job_table, note, require_job_table, say, stack_outputs


def jobs_list(args: argparse.Namespace, runtime: Runtime) -> int:
    outputs = stack_outputs(args, runtime)
    table = require_job_table(outputs, runtime, "no jobs to list")
    now = runtime.now()
    every = list(table.jobs())
    records = every[: args.limit]
    try:
        holder = table.active()
    except UnreadableRecord:  # listed among the unreadable: the lock's holder is not shown as active
        holder = None
    active = holder if holder is not None and holder.state in ACTIVE_STATES else None
    if args.json:
        say(runtime, to_json({
            "jobTable": table.table_name,
            "activeJobId": active.job_id if active else None,
            "jobs": [job_view.record_json(r, now) for r in records],
            "unreadable": table.unreadable,  # items left out, one line each (cluster_jobs/record_schema.py)
        }))
        return EXIT_OK
    for line in table.unreadable:
        note(runtime, f"left out: {line}")
    if not records:
        say(runtime, f"no jobs in the job table {table.table_name} yet")
        return EXIT_OK
    rows = []
    for r in records:
        cost = job_records.cost_so_far_usd(r, now)
        rows.append((r.job_id, r.state, r.attempt, r.nodes, r.created_at, r.last_step,
                     None if cost is None else format_usd(cost)))
    say(runtime, format_table(("JOB", "STATE", "ATTEMPT", "NODES", "STARTED", "STEP", "COST SO FAR"), rows))
    if len(every) > len(records):
        say(runtime, f"the newest {len(records)} of {len(every)} jobs: --limit {len(every)} shows them all")
    if active is not None:
        say(runtime, f"active: {active.job_id} ({active.state}); a cluster runs one job at a time")
    else:
        say(runtime, "no active job: the cluster takes the next submit")
    return EXIT_OK


def status(args: argparse.Namespace, runtime: Runtime) -> int:
    validate_job_id(args.job_id)
    outputs = stack_outputs(args, runtime)
    table = job_table(outputs, runtime)
    record = table.get(args.job_id) if table else None
    if table is None or record is None:
        states = query_from_history(args, runtime, outputs, "status")
        print_states(args, runtime, states, f"job {args.job_id}")
        return _status_exit(args, runtime, states)

    current = record.current
    states = ask(runtime, outputs, args.job_id, current.nodes, "status") if current else []
    record = copy_answers(runtime, table, record, states)
    bucket = outputs.outputs.get(CHECKPOINT_BUCKET_OUTPUT)
    if args.json:
        report = job_view.states_json(args.job_id, states)
        report.update(state=record.state, nodesState=report["state"],
                      record=job_view.record_json(record, runtime.now()))
        place = export_place(record, bucket)
        if place is not None:  # an export job: where its Hugging Face directory is written, and lands in S3
            report.update(exportDir=place.fsx_dir, exportS3Uri=place.s3_uri)
        say(runtime, to_json(report))
    else:
        say(runtime, job_view.format_record(record, bucket, overall_state(states) if states else None,
                                            runtime.now()))
        if current is not None:
            say(runtime, "")
            print_states(args, runtime, states, f"attempt {current.number}'s nodes")
    return _status_exit(args, runtime, states)


def _status_exit(args: argparse.Namespace, runtime: Runtime, states: list[NodeJobState]) -> int:
    on_tcp = nodes_on_tcp(states)
    if on_tcp:
        running = overall_state(states) == "running"
        print(
            f"clusterctl: warning: NCCL is using TCP sockets, not EFA, on {', '.join(on_tcp)}: this job "
            f"{'runs' if running else 'ran'} at a fraction of the bandwidth; check `sudo "
            "PYTHONPATH=/opt/cluster/bundle python3 -m node_bootstrap check` on those nodes"
            + (f" and cancel the job (clusterctl cancel {args.job_id})" if running else ""),
            file=runtime.err,
            flush=True,
        )
        return EXIT_FAILED
    # A state nobody could read (no answer) is not an answer a script may take for success.
    return EXIT_FAILED if states and overall_state(states) == "unknown" else EXIT_OK
