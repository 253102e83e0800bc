"""What a command touches outside itself (Runtime: streams, prompts, clocks, the AWS context; tests replace any
of it), and the few things every command does with it: print a line, read the stack's outputs, open its job
table. Command modules import this, never clusterctl.cli, so the parser can import them without a circle."""

from __future__ import annotations

import argparse
import datetime
import sys
import time
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TextIO

from cluster_aws.errors import EXIT_STACK, ClusterctlError
from cluster_aws.session import AwsContext
from cluster_aws.stack_outputs import JOB_TABLE_OUTPUT, StackOutputs, read_stack_outputs
from cluster_jobs.table import JobTable
from clusterctl.render import terminal_safe


@dataclass
class Runtime:
    """What a command touches outside itself; tests replace any of it."""

    out: TextIO = field(default_factory=lambda: sys.stdout)
    err: TextIO = field(default_factory=lambda: sys.stderr)
    confirm: Callable[[str], str] = input
    sleep: Callable[[float], None] = time.sleep
    clock: Callable[[], float] = time.monotonic
    now: Callable[[], datetime.datetime] = lambda: datetime.datetime.now(datetime.UTC)
    context: AwsContext | None = None  # built from --region/--profile when None


def say(runtime: Runtime, text: str) -> None:
    """A line of the command's answer, on stdout; control characters as escapes (render.terminal_safe): a
    line may hold what a job printed."""
    print(terminal_safe(text), file=runtime.out, flush=True)


def note(runtime: Runtime, text: str) -> None:
    """A line about the answer (what was left alone, and why), on stderr, so that --json output stays JSON."""
    print(f"clusterctl: note: {terminal_safe(text)}", file=runtime.err, flush=True)


def warn(runtime: Runtime, text: str) -> None:
    """A setting that works against the user's intent (a warmup the run never finishes), on stderr: the command
    still does what it was asked."""
    print(f"clusterctl: warning: {terminal_safe(text)}", file=runtime.err, flush=True)


def stack_outputs(args: argparse.Namespace, runtime: Runtime) -> StackOutputs:
    """The outputs of the stack --stack names, in the command's region."""
    assert runtime.context is not None
    return read_stack_outputs(runtime.context.client("cloudformation"), args.stack, runtime.context.region)


def job_table(outputs: StackOutputs, runtime: Runtime) -> JobTable | None:
    """The stack's job table, or None for a stack deployed before it."""
    assert runtime.context is not None
    if outputs.job_table_name is None:
        return None
    return JobTable(runtime.context.client("dynamodb"), outputs.job_table_name)


def require_job_table(outputs: StackOutputs, runtime: Runtime, refused: str) -> JobTable:
    """The stack's job table; for a stack deployed before it, one line that says what was refused and why."""
    table = job_table(outputs, runtime)
    if table is None:
        raise ClusterctlError(
            f"{refused}: stack {outputs.stack_name} predates the job table (no output {JOB_TABLE_OUTPUT}): "
            "redeploy it with this version (cdk deploy), then every job is recorded, one runs at a time, and "
            "a job that loses a node is restarted",
            EXIT_STACK,
        )
    return table
