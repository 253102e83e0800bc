"""The job commands' parsers: submit, commcheck, jobs, status, logs and cancel. The handlers live in a module
each (submit, status, cancel, logs); how they show a job is clusterctl.jobs.view."""

from __future__ import annotations

from clusterctl.arguments import (
    JOB_ID_EXAMPLE,
    AddCommand,
    instance_type,
    non_negative_int,
    positive_float,
    positive_int,
    sizes_mib,
)
from clusterctl.jobs import cancel, export, logs, status, submit
from node_bootstrap.jobs import MAX_CANCEL_TIMEOUT_SECONDS, STOP_GRACE_SECONDS


def add_parsers(add: AddCommand) -> None:
    """`submit`, `commcheck`, `jobs`, `status`, `logs`, `cancel` and `export` (its parser is export.py's)."""
    submit_parser = add(
        "submit",
        "Start a training job on the ready nodes (torchrun, c10d rendezvous on the first "
        "node by private IP) and print its job id. Refuses when nodes are missing or not ready, and while "
        "another job is active: a cluster runs one job at a time.",
        epilog="Before any node is touched the job's record is written to the stack's job table (stack output "
        "JobTableName): the config file's content (for a path in the bundle; an absolute path on the nodes is "
        "recorded as a path), the --set items, the nodes, the rendezvous host, state starting; the same write "
        "takes the cluster's one-job lock. If some nodes fail to start the job, it is recorded as failed (the "
        "lock is given back) and stopped where it started. A stack deployed before the job table is refused: "
        "redeploy it. Several jobs at once: deploy several stacks (--stack). The config and the --set items are "
        "checked first, offline (the trainer's own loader), before the stack is looked up.",
        example="clusterctl submit --config training/configs/llama3-8b.toml --nodes 2 --set run.steps=1000 "
        "--dry-run",
    )
    submit_parser.add_argument(
        "--config", required=True,
        help="training TOML in the bundle (e.g. training/configs/llama3-8b.toml), a packaged config's name (e.g. "
        "1b), or an absolute path on the nodes (e.g. on /fsx; see --remote-path)",
    )
    submit_parser.add_argument(
        "--remote-path", action="store_true",
        help="the absolute --config path is on the nodes only: --dry-run checks the --set items alone (without "
        "it, a dry run that cannot read the path here says 'not checked' and fails)",
    )
    submit_parser.add_argument("--nodes", type=positive_int, help="nodes to use (default: the stack's NodeCount)")
    submit_parser.add_argument(
        "--set",
        dest="overrides",
        action="append",
        default=[],
        metavar="KEY=VALUE",
        help="training config override, repeatable (e.g. --set optim.lr=3e-4; default: none)",
    )
    submit_parser.add_argument(
        "--max-restarts",
        type=int,
        default=3,
        help="torchrun --max-restarts: whole-job restarts after a failure (default 3)",
    )
    submit_parser.add_argument(
        "--resume-from",
        metavar="JOB",
        default="",
        help="start from the newest complete checkpoint of an earlier job (its /fsx/checkpoints/JOB); the new "
        "job saves only to its own directory. Without it (the default) a job starts fresh (each job has its "
        "own directory).",
    )
    submit_parser.add_argument(
        "--dry-run",
        action="store_true",
        help="check the config and the --set items offline and print what would be sent (the resolved config's "
        "key settings, the jobs document's parameters), with no AWS call and no credentials needed",
    )
    submit_parser.add_argument(
        "--instance-type",
        type=instance_type,
        help="with --dry-run and --nodes: check the [parallel] layout against this instance type's GPUs per node "
        "(a submit reads the type from the stack; default: the layout is checked at submit)",
    )
    submit_parser.set_defaults(handler=submit.submit)

    commcheck_parser = add(
        "commcheck",
        "Check NCCL all_reduce bandwidth across the ready nodes before a costly run: a job of "
        "`python -m training.commcheck` (torchrun, one process per GPU), submitted like `submit`. "
        "Prints the job id; read the result with `clusterctl status JOB` (busbw) and `clusterctl logs JOB`.",
        epilog="busbw is nccl-tests' bus bandwidth, algbw x 2(n-1)/n for n ranks. Reference over EFA: "
        "2 x p5.48xlarge about 440-480 GB/s for 1-16 GiB messages, about 350 GB/s at 4-16 nodes. Far less, "
        "or `Socket` in status's NETWORK column, means NCCL is not on EFA. The job fails (exit 1 on the "
        "nodes, state failed) when --min-busbw-gbps is given and busbw at the largest size is below it.",
        example="clusterctl commcheck --nodes 2 --min-busbw-gbps 400",
    )
    commcheck_parser.add_argument("--nodes", type=positive_int, help="nodes to use (default: the stack's NodeCount)")
    commcheck_parser.add_argument(
        "--min-busbw-gbps",
        type=positive_float,
        metavar="GBPS",
        help="fail the job when busbw at the largest size is below this, e.g. 400 for 2 p5 nodes, 300 for "
        "4-16 (default: no threshold)",
    )
    commcheck_parser.add_argument(
        "--sizes-mib",
        type=sizes_mib,
        metavar="N,N,...",
        help="message sizes per GPU in MiB (default on the nodes: 64,256,1024,4096,16384)",
    )
    commcheck_parser.add_argument("--iters", type=positive_int, help="timed all_reduce calls per size (default 20)")
    commcheck_parser.add_argument(
        "--warmup-iters", type=non_negative_int, help="untimed all_reduce calls per size first (default 5)"
    )
    commcheck_parser.add_argument(
        "--dtype", choices=("bfloat16", "float32"), help="element type (default bfloat16)"
    )
    commcheck_parser.add_argument(
        "--max-restarts",
        type=int,
        default=0,
        help="torchrun --max-restarts (default 0: a failed check is an answer, not something to retry)",
    )
    commcheck_parser.set_defaults(handler=submit.commcheck)

    jobs_parser = add(
        "jobs",
        "The jobs in the stack's job table, newest first: state, attempt, nodes, start, last step, and the "
        "cost so far (each attempt's nodes x its hours x the catalog's on-demand price); then the active job.",
        example="clusterctl jobs --limit 5",
    )
    jobs_parser.add_argument("--limit", type=positive_int, default=20, help="show at most this many jobs (default 20)")
    jobs_parser.set_defaults(handler=status.jobs_list)

    status_parser = add(
        "status",
        "The job's record (state, the layout it was submitted with, e.g. 'layout: TP 8 x FSDP 4 "
        "(parallel.dp_replicate=1 dp_shard=4 tp=8)', and every attempt: nodes, rendezvous host, start, end, "
        "reason, step reached, "
        "step resumed from, steps lost at the restart), then per node of its current attempt: running, "
        "succeeded, failed (exit code) or cancelled; last step and loss (for a commcheck: its all_reduce "
        "busbw); the network NCCL chose (Libfabric/efa is EFA, Socket is TCP).",
        epilog="The nodes' answers are copied into the job's record. A job not in the job table (older, or a "
        "stack without one) is found in SSM's command history (30 days). "
        "Exits 1, with a warning on stderr naming the nodes, when a job of more than one node has "
        "NCCL on TCP (Socket, or a libfabric provider other than efa) instead of EFA on any node; exits 1 when "
        "a node did not answer (state unknown); a job found in SSM's history exits 1 with one line when no "
        "node has it or all of its nodes are gone. Nodes the Auto Scaling group replaced are shown as gone "
        "(replaced) and not asked.",
        example=f"clusterctl status {JOB_ID_EXAMPLE}",
    )
    status_parser.add_argument("job_id", metavar="JOB", help="the job id `clusterctl submit` printed")
    status_parser.set_defaults(handler=status.status)

    logs_parser = add("logs", "A job's output from CloudWatch Logs, all nodes interleaved by time.",
                      example=f"clusterctl logs {JOB_ID_EXAMPLE} --follow")
    logs_parser.add_argument("job_id", metavar="JOB", help="the job id `clusterctl submit` printed")
    logs_parser.add_argument("--node", metavar="INSTANCE_ID", help="only this node's log (default: all nodes)")
    logs_parser.add_argument("--follow", "-f", action="store_true", help="keep printing new lines until Ctrl-C")
    logs_parser.set_defaults(handler=logs.logs)

    cancel_parser = add(
        "cancel",
        "Record the job as cancelled (so the job keeper never restarts it, and the cluster's one-job lock is "
        "free for the next `clusterctl submit`: nothing is queued, nothing starts by itself), then "
        "SIGTERM it on every node of its current attempt that is left (replaced nodes are shown as gone) so "
        "the trainer checkpoints, and kill what is left after the timeout.",
        epilog="A job that already ended (succeeded, failed, cancelled) is left alone: one line, exit 0, nothing "
        "sent. A job not in the job table is stopped on the nodes of its start command (SSM's history). "
        "Exits 1 when a node still reports the job running or did not answer.",
        example=f"clusterctl cancel {JOB_ID_EXAMPLE}",
    )
    cancel_parser.add_argument("job_id", metavar="JOB", help="the job id `clusterctl submit` printed")
    cancel_parser.add_argument(
        "--timeout-seconds",
        type=int,
        default=STOP_GRACE_SECONDS,
        help=f"seconds between SIGTERM and SIGKILL, 0-{MAX_CANCEL_TIMEOUT_SECONDS} (default %(default)s)",
    )
    cancel_parser.set_defaults(handler=cancel.cancel)

    export.add_parser(add)
