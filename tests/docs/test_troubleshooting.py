"""docs/troubleshooting.md: every command in it runs against this project's cluster. Each `clusterctl` and
`node_bootstrap` command is parsed by the real argument parser, each training `--set` by the training config
loader, each `cdk deploy -c` by the settings loader, and each `aws` command is checked against the service's
API model (the operation and its parameters exist)."""

from __future__ import annotations

import re
import shlex
from pathlib import Path

import botocore.session
import pytest
from cdk_support import build_settings

from clusterctl.cli import build_parser as clusterctl_parser
from node_bootstrap.cli import build_parser as node_bootstrap_parser
from training.config import load_config

REPO = Path(__file__).resolve().parents[2]
DOC = REPO / "docs" / "troubleshooting.md"
PLACEHOLDERS = {
    "JOB": "j-20261120-231502-ab12",
    "i-...": "i-0123456789abcdef0",
    "<old job id>": "j-20261120-231502-ab12",
    "<FileSystemId>": "fs-0123456789abcdef0",
}
AWS_GLOBAL_OPTIONS = {"--query", "--region", "--output", "--profile"}


def commands() -> list[str]:
    text = DOC.read_text()
    found = []
    for block in re.findall(r"```\n(.*?)```", text, re.S):
        found += [line.split("  #")[0].strip() for line in block.splitlines() if line.strip()]
    text = re.sub(r"```\n.*?```", "", text, flags=re.S)
    found += [" ".join(span.split()) for span in re.findall(r"`([^`]+)`", text)]
    wanted = ("clusterctl ", "aws ", "npx cdk ", "sudo PYTHONPATH=")
    return [c.split(" | ")[0] for c in found if c.startswith(wanted)]


def fill(command: str) -> list[str]:
    for placeholder, value in PLACEHOLDERS.items():
        command = command.replace(placeholder, value)
    return shlex.split(command)


ALL = commands()


def test_the_guide_has_commands_for_each_kind():
    kinds = {c.split()[0] if not c.startswith("sudo") else "node_bootstrap" for c in ALL}
    assert {"clusterctl", "aws", "npx", "node_bootstrap"} <= kinds
    assert len([c for c in ALL if c.startswith("clusterctl ")]) >= 15


@pytest.mark.parametrize("command", sorted({c for c in ALL if c.startswith("clusterctl ")}))
def test_clusterctl_commands_parse(command):
    args = clusterctl_parser().parse_args(fill(command)[1:])  # SystemExit(2) on an unknown option
    if args.command == "submit":
        load_config(REPO / args.config, args.overrides)  # the --set items are real, valid training fields


@pytest.mark.parametrize("command", sorted({c for c in ALL if "-m node_bootstrap" in c}))
def test_node_bootstrap_commands_parse(command):
    argv = fill(command)
    assert argv[:3] == ["sudo", "PYTHONPATH=/opt/cluster/bundle", "python3"]
    node_bootstrap_parser().parse_args(argv[argv.index("node_bootstrap") + 1:])


@pytest.mark.parametrize("command", sorted({c for c in ALL if c.startswith("npx cdk ")}))
def test_cdk_settings_are_valid(command):
    argv = fill(command)
    settings = dict(argv[i + 1].split("=", 1) for i, a in enumerate(argv) if a == "-c")
    build_settings(**settings)


@pytest.mark.parametrize("command", sorted({c for c in ALL if c.startswith("aws ")}))
def test_aws_commands_exist_in_the_api_model(command):
    argv = fill(command)
    service, operation = argv[1], argv[2]
    model = botocore.session.get_session().get_service_model(service)
    name = "".join(part.capitalize() for part in operation.split("-"))
    assert name in model.operation_names, f"{service} has no {name}"
    members = model.operation_model(name).input_shape.members
    for option in (a for a in argv[3:] if a.startswith("--") and a not in AWS_GLOBAL_OPTIONS):
        member = "".join(part.capitalize() for part in option[2:].split("-"))
        assert member in members or option == "--no-should-respect-grace-period", f"{command}: {option}"
