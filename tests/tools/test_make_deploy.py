"""`make deploy` and `make diff` (issue 28: `npx cdk` run by hand prints jsii's Node banner as 11 lines of byte
strings): the CDK CLI with the Makefile's quiet environment and the settings of CDK_ARGS. A stand-in `npx` on
PATH records what make ran it with; `-o setup` keeps make from running the set-up (venv, npm ci, wheels)."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest
from cdk_support import REPO_ROOT

pytestmark = pytest.mark.skipif(shutil.which("make") is None, reason="no make")

FAKE_NPX = """#!/bin/sh
printf '%s\\n' "$@" > "$RECORD.args"
env > "$RECORD.env"
"""


def run_make(tmp_path: Path, *argv: str) -> tuple[list[str], dict[str, str]]:
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    npx = bin_dir / "npx"
    npx.write_text(FAKE_NPX)
    npx.chmod(0o755)
    env = {k: v for k, v in os.environ.items() if not k.startswith(("JSII_", "AWS_", "CDK_", "MAKE"))}
    env.update(PATH=f"{bin_dir}{os.pathsep}{env['PATH']}", RECORD=str(tmp_path / "npx"))
    result = subprocess.run(["make", "-s", "-o", "setup", *argv], cwd=REPO_ROOT, env=env, capture_output=True,
                            text=True, timeout=60)
    assert result.returncode == 0, result.stdout + result.stderr
    args = (tmp_path / "npx.args").read_text().splitlines()
    recorded = dict(line.split("=", 1) for line in (tmp_path / "npx.env").read_text().splitlines() if "=" in line)
    return args, recorded


def test_make_deploy_passes_cdk_args_with_the_quiet_environment(tmp_path):
    args, env = run_make(tmp_path, "deploy", "CDK_ARGS=-c nodeCount=2 -c spareNodes=1")
    assert args == ["--no-install", "cdk", "deploy", "TrainingClusterStack", "--no-notices",
                    "--no-version-reporting", "-c", "nodeCount=2", "-c", "spareNodes=1"]
    # the variables that silence jsii's Node banner, as `make synth` has them (tests/stacks/test_cdk_cli.py)
    assert env["JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION"] == "1"
    assert env["JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"] == "20"
    assert env["CDK_DISABLE_CLI_TELEMETRY"] == "true"
    # a deploy may take its credentials from an EC2 instance's role, which synth's setting would hide
    assert env["AWS_EC2_METADATA_DISABLED"] == "false"


@pytest.mark.parametrize("target", ["diff", "destroy"])
def test_make_diff_and_destroy_take_the_same_settings(tmp_path, target):
    args, env = run_make(tmp_path, target, "CDK_ARGS=-c nodeCount=4")
    assert args == ["--no-install", "cdk", target, "TrainingClusterStack", "--no-notices", "--no-version-reporting",
                    "-c", "nodeCount=4"]
    assert env["JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION"] == "20"


def test_make_bootstrap_takes_the_environment_in_cdk_args(tmp_path):
    args, env = run_make(tmp_path, "bootstrap", "CDK_ARGS=aws://123456789012/us-east-1")
    assert args == ["--no-install", "cdk", "bootstrap", "--no-notices", "--no-version-reporting",
                    "aws://123456789012/us-east-1"]
    assert env["JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION"] == "1"
