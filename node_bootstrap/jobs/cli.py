"""The command line: `python3 -m node_bootstrap.jobs [--root R] [--node-config C] COMMAND ...`, COMMAND one
of start, status, cancel, supervise. start, status and cancel print one JSON object on stdout; the exit
codes are in errors.py."""

import argparse
import json
import sys
from collections.abc import Sequence
from typing import Optional

from node_bootstrap.jobs.control import cancel_job, job_status
from node_bootstrap.jobs.errors import EXIT_OK, JobError
from node_bootstrap.jobs.launch import start_job
from node_bootstrap.jobs.settings import DEFAULT_NODE_CONFIG, load_settings
from node_bootstrap.jobs.spec import (
    ABORT_STOP_SECONDS,
    CANCEL_MODES,
    CANCEL_SAVE,
    MAX_ATTEMPT,
    MODULES,
    STOP_GRACE_SECONDS,
    TRAINING_MODULE,
    JobSpec,
    parse_attempt,
)
from node_bootstrap.jobs.supervise import Supervisor


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python3 -m node_bootstrap.jobs",
        description="Start, inspect and cancel a training job on this node (run by the stack's SSM "
        "document).",
        epilog="Exit codes: 0 ok, 1 the job failed to start or the operation failed, 2 invalid arguments or "
        "node config, 3 no such job on this node. Every command prints one JSON object on stdout.",
    )
    parser.add_argument("--root", default="/", help="prefix for every absolute path (tests; default /)")
    parser.add_argument("--node-config", default=DEFAULT_NODE_CONFIG,
                        help="node config JSON (default %(default)s)")
    sub = parser.add_subparsers(dest="command", required=True)

    start = sub.add_parser(
        "start", help="launch torchrun detached and return once it runs",
        description="Launch torchrun detached and return once it runs. Only the attempt the job table (the "
        "node config's training.jobTableName) holds as the job's current one, of a job starting, running or "
        "restarting there, starts: any other start is refused before anything is made (exit 1). A job id this "
        "node already has starts "
        "again only as a later --attempt of a job that ended here: the previous attempt's status is kept as "
        "status.attempt-<K>.json, the job log is appended to, and the checkpoint directory and rendezvous id "
        "stay the job's. A start while the job runs here, or of an attempt not greater than the recorded one "
        "(a repeated delivery), is refused (exit 1).")
    start.add_argument("--job-id", required=True)
    start.add_argument("--attempt", default="1", metavar="N",
                       help=f"the job's attempt, an integer 1-{MAX_ATTEMPT}: 1 (default) for its first start, "
                       "one more for each restart on a new node set")
    start.add_argument("--module", choices=MODULES, default=TRAINING_MODULE,
                       help="what the job runs: training (default) or training.commcheck (all_reduce "
                       "bandwidth check) under torchrun; training.export (a checkpoint of --resume-from's job "
                       "to a Hugging Face directory in this job's checkpoint directory) as one process, "
                       "--nodes 1")
    start.add_argument("--config", default="",
                       help="training TOML, relative to the bundle dir or absolute (training only; required "
                       "there, empty for training.commcheck)")
    start.add_argument("--nodes", type=int, required=True, help="torchrun --nnodes")
    start.add_argument("--gpus-per-node", type=int, required=True, help="torchrun --nproc-per-node")
    start.add_argument("--rendezvous-host", required=True,
                       help="private IP of the node hosting the c10d store")
    start.add_argument("--max-restarts", type=int, default=3, help="torchrun --max-restarts (default 3)")
    start.add_argument("--overrides", default="",
                       help='space-separated "k=v k2=v2": training --set items, or for training.commcheck '
                       "its options (min_busbw_gbps=350 -> --min-busbw-gbps 350), for training.export "
                       "step=N (default: the newest complete step)")
    start.add_argument("--resume-from", default="", metavar="JOB_ID",
                       help="training: start from the newest complete checkpoint of that job's directory "
                       "when this job's own has none (it still saves only to its own); default: only its own. "
                       "training.export: the job whose checkpoint it exports (required)")
    start.add_argument(
        "--stop-grace-seconds", type=int, default=STOP_GRACE_SECONDS,
        help="seconds from SIGTERM to SIGKILL: the unit's TimeoutStopSec, and torchrun's --shutdown-timeout "
        "(this less 10 s) for the trainer's checkpoint (default %(default)s; the SSM document never sets it: "
        "for drills and tests)")
    start.add_argument(
        "--launcher", choices=("auto", "systemd", "direct"), default="auto",
        help="systemd: systemd-run unit training-job-<id>; direct: double fork + setsid, for hosts where "
        "systemd is not PID 1 (containers, tests); auto (default): systemd when it runs, else direct",
    )

    status = sub.add_parser("status", help="print the job's state, attempt, exit code, last step and loss, the "
                                "checkpoint step it resumed from (a commcheck: its all_reduce busbw), and the "
                                "network NCCL chose on this node, all for its current attempt")
    status.add_argument("--job-id", required=True)

    cancel = sub.add_parser("cancel", help="SIGTERM (the trainer checkpoints), wait, then kill; --mode abort: "
                            "kill at once, no checkpoint")
    cancel.add_argument("--job-id", required=True)
    cancel.add_argument("--timeout-seconds", type=float, default=float(STOP_GRACE_SECONDS),
                        help="how long to wait after SIGTERM before SIGKILL (default %(default).0f; the job keeper "
                        f"gives an abort {ABORT_STOP_SECONDS})")
    cancel.add_argument("--mode", choices=CANCEL_MODES, default=CANCEL_SAVE,
                        help="save (default): the trainer's collective checkpoint after SIGTERM (a user's cancel, a "
                        "Capacity Block's end); abort: SIGKILL to torchrun and its workers at once, no checkpoint "
                        "(the job keeper stopping the survivors of an attempt that lost a node: the job restarts "
                        "from its newest checkpoint, and a collective save would block without the lost node)")

    supervise = sub.add_parser("supervise", help="internal: the process `start` launches")
    supervise.add_argument("--job-id", required=True)
    return parser


def main(argv: Optional[Sequence[str]] = None) -> int:
    args = build_parser().parse_args(argv)
    try:
        settings = load_settings(args.root, args.node_config)
        if args.command == "supervise":
            return Supervisor(settings, args.job_id).run()
        if args.command == "start":
            spec = JobSpec(job_id=args.job_id, config=args.config, nodes=args.nodes,
                           gpus_per_node=args.gpus_per_node, rendezvous_host=args.rendezvous_host,
                           max_restarts=args.max_restarts, overrides=tuple(args.overrides.split()),
                           module=args.module, stop_grace_seconds=args.stop_grace_seconds,
                           resume_from=args.resume_from, attempt=parse_attempt(args.attempt))
            result = start_job(settings, spec, args.node_config, args.launcher)
        elif args.command == "status":
            result = job_status(settings, args.job_id)
        else:
            result = cancel_job(settings, args.job_id, args.timeout_seconds, args.mode)
    except JobError as e:
        print(json.dumps({"jobId": getattr(args, "job_id", None), "error": str(e)}, sort_keys=True))
        print(f"error: {e}", file=sys.stderr)
        return e.exit_code
    print(json.dumps(result, sort_keys=True))
    return EXIT_OK
