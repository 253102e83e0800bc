"""clusterctl's command line: the parser (global options, then each command group's subcommands) and `main`,
the one place errors become exit codes. The command groups live in modules and packages of their own
(capacity, nodes, jobs, plan, watch) and import clusterctl.runtime, never this module."""

from __future__ import annotations

import argparse
import os
import re
import sys
import traceback
from collections.abc import Sequence

import botocore.exceptions

from cluster_aws.errors import EXIT_CODES_HELP, EXIT_FAILED, EXIT_USAGE, describe_aws_error, one_line
from cluster_aws.session import build_context
from cluster_aws.stack_outputs import DEFAULT_STACK_NAME
from clusterctl import nodes
from clusterctl.arguments import HelpFormatter, with_example
from clusterctl.capacity import commands as capacity_commands
from clusterctl.capacity import cost_command
from clusterctl.jobs import commands as job_commands
from clusterctl.plan import command as plan_command
from clusterctl.render import terminal_safe
from clusterctl.runtime import Runtime
from clusterctl.watch import command as watch_command
from instance_catalog.instance_types import UnknownInstanceType


def _add_global_options(parser: argparse.ArgumentParser, suppress: bool) -> None:
    """Global options work before or after the command: the subcommands repeat them with SUPPRESS defaults
    so that a value given before the command is not reset by the subcommand's default."""

    def default(value: object) -> object:
        return argparse.SUPPRESS if suppress else value

    parser.add_argument("--region", default=default(None), help="AWS region (default: the profile's)")
    parser.add_argument("--profile", default=default(None), help="AWS named profile (default: the environment's)")
    parser.add_argument(
        "--stack",
        default=default(DEFAULT_STACK_NAME),
        help=f"CloudFormation stack name (default {DEFAULT_STACK_NAME})",
    )
    parser.add_argument("--json", action="store_true", default=default(False), help="print JSON")
    parser.add_argument(
        "--debug", action="store_true", default=default(False), help="print the traceback of an error"
    )


def build_parser() -> argparse.ArgumentParser:
    common = argparse.ArgumentParser(add_help=False)
    _add_global_options(common, suppress=True)
    parser = argparse.ArgumentParser(
        prog="clusterctl",
        description="Plan and operate the P5 training cluster: plan (memory, nodes, time, cost per instance "
        "type), quota and capacity (offerings and prices across regions), nodes, jobs (submit, status, logs, "
        "cancel), cost, and a live view (top).",
        epilog=EXIT_CODES_HELP,
    )
    _add_global_options(parser, suppress=False)
    sub = parser.add_subparsers(dest="command", required=True, metavar="COMMAND")

    def add(name: str, help_text: str, example: str = "", epilog: str | None = None,
            **kwargs: object) -> argparse.ArgumentParser:
        # every command's help ends with one example (tests/clusterctl/test_help_texts.py holds them to it)
        return sub.add_parser(name, parents=[common], help=help_text, description=help_text,
                              epilog=with_example(epilog, example) if example else epilog,
                              formatter_class=HelpFormatter, **kwargs)

    # In the order `clusterctl --help` lists them: plan, quota, capacity, nodes, submit, commcheck, jobs, status,
    # logs, cancel, cost, top.
    plan_command.add_parsers(add)
    capacity_commands.add_parsers(add, common)
    nodes.add_parsers(add)
    job_commands.add_parsers(add)
    cost_command.add_parsers(add)
    watch_command.add_parsers(add)
    return parser


def _join_negative_values(argv: Sequence[str]) -> list[str]:
    """`--tokens -5B` -> `--tokens=-5B`: argparse takes a value that starts with '-' and is not a plain number for
    an option, and answers "expected one argument"; joined, the value reaches its check, which names what is
    allowed."""
    joined: list[str] = []
    for arg in argv:
        if joined and joined[-1].startswith("--") and "=" not in joined[-1] and _NEGATIVE_VALUE.match(arg):
            joined[-1] = f"{joined[-1]}={arg}"
        else:
            joined.append(arg)
    return joined


_NEGATIVE_VALUE = re.compile(r"^-[0-9.]")


def main(argv: Sequence[str] | None = None, runtime: Runtime | None = None) -> int:
    runtime = runtime or Runtime()
    args = build_parser().parse_args(_join_negative_values(sys.argv[1:] if argv is None else argv))
    try:
        if runtime.context is None:
            runtime.context = build_context(args.region, args.profile)
        return int(args.handler(args, runtime) or 0)
    except KeyboardInterrupt:
        print("clusterctl: interrupted", file=runtime.err)
        return 130
    except BrokenPipeError:
        # the reader went away (`clusterctl --json plan ... | head`): nothing more to say, and nothing to say it
        # to. Python's documented idiom (library/signal.html, "Note on SIGPIPE"): point stdout at devnull so the
        # interpreter's flush at exit does not fail again.
        if runtime.out is sys.stdout:
            devnull = os.open(os.devnull, os.O_WRONLY)
            os.dup2(devnull, sys.stdout.fileno())
        return EXIT_FAILED
    except Exception as error:  # noqa: BLE001 - every error ends as one line unless --debug
        region = runtime.context.region if runtime.context else args.region
        if isinstance(error, UnknownInstanceType | botocore.exceptions.ParamValidationError):
            message, code = str(error), EXIT_USAGE
        else:
            mapped = describe_aws_error(error, region)
            message, code = (
                (mapped.args[0], mapped.exit_code)
                if mapped
                else (
                    f"unexpected {type(error).__name__}: {error} (rerun with --debug for the traceback)",
                    EXIT_FAILED,
                )
            )
        if args.debug:
            traceback.print_exc(file=runtime.err)
        # one line, whatever it says, and no escape sequence obeyed (a record's or a node's text may be in it)
        print(f"clusterctl: error: {terminal_safe(one_line(message))}", file=runtime.err)
        return code


if __name__ == "__main__":
    sys.exit(main())
