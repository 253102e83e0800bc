"""The real `cdk synth` through the pinned CLI (node_modules, from `npm ci`), with no AWS credentials and no
network access to AWS: what `make synth` runs."""

import json
import os
import subprocess
from pathlib import Path

import pytest

REPO_ROOT = Path(__file__).resolve().parents[2]
CDK = REPO_ROOT / "node_modules" / ".bin" / "cdk"

pytestmark = pytest.mark.skipif(not CDK.exists(), reason="node_modules missing: run `make setup` (npm ci)")


def _offline_env(home: Path) -> dict[str, str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("AWS_")}
    env.update(
        HOME=str(home),
        AWS_EC2_METADATA_DISABLED="true",
        CDK_DISABLE_CLI_TELEMETRY="true",
        AWS_CONFIG_FILE=str(home / "none"),
        AWS_SHARED_CREDENTIALS_FILE=str(home / "none"),
        JSII_SILENCE_WARNING_DEPRECATED_NODE_VERSION="1",
        JSII_SILENCE_WARNING_END_OF_LIFE_NODE_VERSION="20",
    )
    env["PATH"] = f"{REPO_ROOT / '.venv' / 'bin'}{os.pathsep}{env.get('PATH', '')}"
    return env


def _cdk_synth(tmp_path: Path, *context: str) -> subprocess.CompletedProcess:
    args = [
        str(CDK),
        "synth",
        "TrainingClusterStack",
        "--quiet",
        "--no-notices",
        "--no-version-reporting",
        "--output",
        str(tmp_path / "cdk.out"),
    ]
    for item in context:
        args += ["-c", item]
    return subprocess.run(
        args, cwd=REPO_ROOT, env=_offline_env(tmp_path), capture_output=True, text=True, timeout=600
    )


def test_cli_synthesizes_the_default_cluster_offline(tmp_path):
    result = _cdk_synth(tmp_path)
    assert result.returncode == 0, result.stdout + result.stderr
    template = json.loads((tmp_path / "cdk.out" / "TrainingClusterStack.template.json").read_text())
    (lt,) = [r for r in template["Resources"].values() if r["Type"] == "AWS::EC2::LaunchTemplate"]
    assert len(lt["Properties"]["LaunchTemplateData"]["NetworkInterfaces"]) == 33
    assert not (REPO_ROOT / "cdk.context.json").exists(), "synthesis must not do context lookups"
    assert "end-of-life" not in result.stderr  # the jsii Node banner is silenced, real warnings are not


def test_cli_rejects_a_bad_setting_with_one_line(tmp_path):
    result = _cdk_synth(tmp_path, "fsxStorageGiB=3000")
    assert result.returncode != 0
    assert (
        "Invalid setting: fsxStorageGiB=3000: must be 1200 or a multiple of 2400 (PERSISTENT_2)"
        in result.stderr
    )
    assert "Traceback" not in result.stderr
