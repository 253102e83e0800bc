"""Every clusterctl command's help (issue 28, "Help and README"): each option says what it is and its default,
each command's help ends with one example line, and that example parses as the command it documents."""

from __future__ import annotations

import argparse
import shlex

import pytest

from clusterctl.arguments import EXAMPLE_PREFIX
from clusterctl.cli import build_parser


def commands(parser: argparse.ArgumentParser, path: tuple[str, ...] = ()):
    """(command path, its parser) for every command and subcommand, depth first."""
    for action in parser._actions:
        if isinstance(action, argparse._SubParsersAction):
            for name, sub in action.choices.items():
                yield (*path, name), sub
                yield from commands(sub, (*path, name))


COMMANDS = dict(commands(build_parser()))


def arguments(parser: argparse.ArgumentParser):
    return [a for a in parser._actions if not isinstance(a, argparse._HelpAction | argparse._SubParsersAction)]


def test_every_command_is_walked():
    names = {" ".join(path) for path in COMMANDS}
    assert {"plan", "quota", "capacity", "capacity offerings", "capacity prices", "capacity purchase",
            "capacity list", "nodes", "submit", "commcheck", "jobs", "status", "logs", "cancel", "cost",
            "top"} <= names


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_every_option_has_help_and_says_its_default(path):
    parser = COMMANDS[path]
    for action in arguments(parser):
        name = "/".join(action.option_strings) or action.dest
        assert action.help, f"clusterctl {' '.join(path)} {name}: no help"
        takes_value = action.option_strings and action.nargs != 0  # flags default to off
        if takes_value and not action.required:
            assert "default" in action.help, f"clusterctl {' '.join(path)} {name}: help names no default"


@pytest.mark.parametrize("path", [("quota",), ("cost",), ("capacity", "offerings"), ("capacity", "prices")],
                         ids=" ".join)
def test_instance_type_and_nodes_have_help(path):
    """The options the issue found bare."""
    text = " ".join(COMMANDS[path].format_help().split("options:")[1].split())
    assert "--instance-type INSTANCE_TYPE a catalog instance type" in text
    assert "(default p5.48xlarge)" in text
    if path != ("capacity", "prices"):  # prices are per instance, for any count
        assert "--nodes NODES nodes" in text or "--nodes NODES instances" in text


@pytest.mark.parametrize("path", [p for p in COMMANDS if p[0] == "capacity" and len(p) == 2], ids=" ".join)
def test_each_capacity_action_has_a_description(path):
    parser = COMMANDS[path]
    assert parser.description, f"clusterctl {' '.join(path)}: no description"
    above_the_options = " ".join(parser.format_help().split("options:")[0].split())
    assert " ".join(parser.description.split()) in above_the_options


@pytest.mark.parametrize("path", sorted(COMMANDS), ids=" ".join)
def test_help_ends_with_one_example_that_parses(path):
    text = COMMANDS[path].format_help()
    last = text.rstrip().splitlines()[-1]
    assert last.startswith(f"{EXAMPLE_PREFIX}clusterctl "), f"clusterctl {' '.join(path)}: ends with {last!r}"
    assert text.count(EXAMPLE_PREFIX) == 1
    argv = shlex.split(last.removeprefix(EXAMPLE_PREFIX))[1:]
    args = build_parser().parse_args(argv)  # SystemExit(2) on an option the command does not have
    chosen = (args.command, args.capacity_command) if args.command == "capacity" else (args.command,)
    assert chosen[: len(path)] == path


def test_cancel_does_not_promise_a_queue():
    text = " ".join(COMMANDS[("cancel",)].format_help().split())
    assert "takes the next job" not in text
    assert "nothing is queued, nothing starts by itself" in text
