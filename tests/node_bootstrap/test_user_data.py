"""user_data.sh for real: rendered as the stack renders it, run by bash with stub aws/curl/python3 on PATH."""

from __future__ import annotations

import json
import os
import shutil
import subprocess
import sys
import zipfile
from pathlib import Path

import pytest

pytestmark = pytest.mark.waits  # mostly sleeps on real timeouts: run beside the slow files (conftest.py)

TEMPLATE = Path(__file__).parents[2] / "node_bootstrap" / "user_data.sh"
PLACEHOLDERS = ("@@REGION@@", "@@BUNDLE_S3_URI@@", "@@NODE_CONFIG_JSON@@", "@@LOG_GROUP@@")
BUNDLE_URI = "s3://cdk-hnb659fds-assets-123456789012-us-east-1/3f2a9c.zip"
PYTHON39 = "/root/.pyenv/versions/3.9.18/bin/python3.9"  # Amazon Linux 2023's system Python is 3.9

STUBS = {
    # Records each call; `s3 cp` copies the test bundle after $STUB_S3_FAILURES failures.
    "aws": """#!/bin/bash
echo "aws $*" >>"$STUB_LOG"
if [ "$1 $2" = "s3 cp" ]; then
  failures=$(cat "$STUB_STATE/s3_failures" 2>/dev/null || echo 0)
  if [ "$failures" -gt 0 ]; then
    echo $((failures - 1)) >"$STUB_STATE/s3_failures"
    echo "download failed: NoSuchKey" >&2
    exit 1
  fi
  cp "$STUB_BUNDLE_ZIP" "${@: -1}"
fi
""",
    # IMDSv2: a token for the PUT, the instance id for a GET that carries it.
    "curl": """#!/bin/bash
echo "curl $*" >>"$STUB_LOG"
case "$*" in
  *"-X PUT"*api/token*) echo -n "stub-token" ;;
  *"X-aws-ec2-metadata-token: stub-token"*meta-data/instance-id) echo -n "i-0a1b2c3d4e5f60718" ;;
  *) exit 22 ;;
esac
""",
    "sleep": """#!/bin/bash
echo "sleep $*" >>"$STUB_LOG"
""",
    # The real interpreter for `-m zipfile`; node_bootstrap is replaced by a recorder with a chosen exit
    # (and, with STUB_BOOTSTRAP_HANG, one that never ends; with STUB_BOOTSTRAP_MARKER, one that signalled).
    "python3": """#!/bin/bash
if [ "$1 $2" = "-m node_bootstrap" ]; then
  echo "bootstrap PYTHONPATH=$PYTHONPATH args=$*" >>"$STUB_LOG"
  if [ -n "${STUB_BOOTSTRAP_MARKER:-}" ]; then
    mkdir -p "$CLUSTER_ROOT/var/lib/cluster" && echo signalled >"$CLUSTER_ROOT/var/lib/cluster/bootstrap-signalled"
  fi
  if [ -n "${STUB_BOOTSTRAP_HANG:-}" ]; then
    exec /bin/sleep 60
  fi
  exit "${STUB_BOOTSTRAP_RC:-0}"
fi
exec "$STUB_REAL_PYTHON" "$@"
""",
}


def render(config_json: str) -> str:
    """The template filled in by the stack's own renderer (what the launch template carries, tokens aside)."""
    from stacks.training_cluster_stack import render_user_data

    return render_user_data(TEMPLATE.read_text(), region="us-east-1", bundle_s3_uri=BUNDLE_URI,
                            node_config_json=config_json, log_group_name="/training-cluster/TrainingClusterStack")


@pytest.fixture
def world(tmp_path, kit):
    stubs = tmp_path / "bin"
    stubs.mkdir()
    for name, body in STUBS.items():
        (stubs / name).write_text(body)
        (stubs / name).chmod(0o755)
    bundle = tmp_path / "bundle.zip"
    with zipfile.ZipFile(bundle, "w") as z:
        z.writestr("node_bootstrap/__init__.py", "")
        z.writestr("training/__init__.py", "")
        z.writestr("instance_catalog/instance_types.py", "")
    config = kit.node_config_dict(stackName="Stack-$HOME-`id`")  # must arrive verbatim: a quoted heredoc
    config_json = json.dumps(config, indent=2)
    script = tmp_path / "user-data.sh"
    script.write_text(render(config_json))
    (tmp_path / "state").mkdir()
    env = {
        "PATH": f"{stubs}:/usr/bin:/bin",
        "CLUSTER_ROOT": str(tmp_path / "root"),
        "STUB_LOG": str(tmp_path / "calls.log"),
        "STUB_STATE": str(tmp_path / "state"),
        "STUB_BUNDLE_ZIP": str(bundle),
        "STUB_REAL_PYTHON": PYTHON39 if os.path.exists(PYTHON39) else sys.executable,
        "TMPDIR": str(tmp_path),
    }
    return tmp_path, script, env, config_json


def run_user_data(world, **extra_env):
    tmp_path, script, env, _ = world
    result = subprocess.run(["bash", str(script)], env={**env, **extra_env}, capture_output=True, text=True,
                            timeout=60)
    calls = (tmp_path / "calls.log").read_text().splitlines() if (tmp_path / "calls.log").exists() else []
    return result, calls


def aws_calls(calls):
    return [c for c in calls if c.startswith("aws ")]


def retry_sleeps(calls):
    return [c for c in calls if c.startswith("sleep") and c != "sleep 0.5"]  # 0.5 s: the shim polling node_bootstrap


def test_template_has_every_placeholder_and_is_valid_bash(world):
    text = TEMPLATE.read_text()
    # Exactly once each: a placeholder in a comment would splice multi-line JSON into the script.
    assert [text.count(p) for p in PLACEHOLDERS] == [1, 1, 1, 1]
    assert "set -euo pipefail" in text
    assert "<<'NODE_CONFIG_EOF'" in text  # quoted heredoc: the JSON is never expanded
    tmp_path, script, _, _ = world
    assert "@@" not in script.read_text()
    for path in (TEMPLATE, script):
        check = subprocess.run(["bash", "-n", str(path)], capture_output=True, text=True)
        assert check.returncode == 0, check.stderr


def test_success_path_downloads_unpacks_writes_config_and_runs_the_bootstrap(world):
    tmp_path, _, _, config_json = world
    root = tmp_path / "root"
    result, calls = run_user_data(world)
    assert result.returncode == 0, result.stdout + result.stderr
    assert aws_calls(calls)[0] == ("aws ec2 create-tags --region us-east-1 --resources i-0a1b2c3d4e5f60718 "
                                   "--tags Key=cluster:bootstrap,Value=running")
    assert aws_calls(calls)[1].startswith(f"aws s3 cp --region us-east-1 --only-show-errors {BUNDLE_URI} ")
    assert len(aws_calls(calls)) == 2  # no failure signal
    assert (root / "opt/cluster/bundle/training/__init__.py").exists()
    assert (root / "opt/cluster/bundle/instance_catalog/instance_types.py").exists()
    assert (root / "etc/cluster/node-config.json").read_text() == config_json + "\n"
    assert [c for c in calls if c.startswith("bootstrap")] == [
        f"bootstrap PYTHONPATH={root}/opt/cluster/bundle args=-m node_bootstrap run "
        f"--config /etc/cluster/node-config.json --root {root}"]
    log = (root / "var/log/cluster/bootstrap.log").read_text()
    assert "user-data: bootstrapping i-0a1b2c3d4e5f60718 in us-east-1" in log
    assert log.rstrip().endswith("user-data: bootstrap finished")
    assert not list(tmp_path.glob("tmp.*"))  # the download directory is cleaned up


def test_a_failing_bootstrap_is_signalled_by_user_data_and_exits_non_zero(world):
    result, calls = run_user_data(world, STUB_BOOTSTRAP_RC="1")
    assert result.returncode == 1
    create_failed, health = aws_calls(calls)[-2:]
    tags = json.loads(create_failed.split("--tags ", 1)[1])
    assert tags == [{"Key": "cluster:bootstrap", "Value": "failed"},
                    {"Key": "cluster:bootstrap-reason",
                     "Value": "user-data failed at stage 'node_bootstrap run (exit 1)' (exit 1); "
                              "see /var/log/cluster/bootstrap.log"}]
    assert health == ("aws autoscaling set-instance-health --region us-east-1 "
                      "--instance-id i-0a1b2c3d4e5f60718 --health-status Unhealthy "
                      "--no-should-respect-grace-period")
    assert "FAILED at stage 'node_bootstrap run (exit 1)'" in result.stdout


def test_a_bootstrap_that_already_signalled_is_not_signalled_twice(world):
    result, calls = run_user_data(world, STUB_BOOTSTRAP_RC="3")
    assert result.returncode == 3
    assert not any("set-instance-health" in c or "Value\":\"failed" in c for c in aws_calls(calls))
    assert "it already tagged the instance failed and marked it Unhealthy" in result.stdout


def test_a_failed_download_is_retried_then_signalled(world):
    tmp_path = world[0]
    (tmp_path / "state/s3_failures").write_text("99")
    result, calls = run_user_data(world)
    assert result.returncode != 0
    assert len([c for c in calls if c.startswith("aws s3 cp")]) == 5
    assert retry_sleeps(calls) == ["sleep 2", "sleep 4", "sleep 8", "sleep 16"]
    assert "stage 'download bundle'" in aws_calls(calls)[-2]
    assert "set-instance-health" in aws_calls(calls)[-1]
    assert not any(c.startswith("bootstrap") for c in calls)


def test_a_download_that_recovers_continues(world):
    (world[0] / "state/s3_failures").write_text("2")
    result, calls = run_user_data(world)
    assert result.returncode == 0, result.stdout + result.stderr
    assert retry_sleeps(calls) == ["sleep 2", "sleep 4"]


@pytest.mark.skipif(shutil.which("bash") is None, reason="bash is not installed")
def test_imds_failure_before_tagging_still_exits_non_zero(world):
    tmp_path, script, env, _ = world
    (tmp_path / "bin/curl").write_text("#!/bin/bash\necho \"curl $*\" >>\"$STUB_LOG\"\nexit 7\n")
    result, calls = run_user_data(world)
    assert result.returncode != 0
    assert "FAILED at stage 'tag running'" in result.stdout
    assert "cannot read the instance id from IMDS" in result.stdout  # nothing to tag: the log says why


def test_the_running_tag_is_not_fatal(world):
    tmp_path = world[0]
    (tmp_path / "bin/aws").write_text("""#!/bin/bash
echo "aws $*" >>"$STUB_LOG"
case "$*" in
  *Value=running*) echo "An error occurred (RequestLimitExceeded)" >&2; exit 254 ;;
  "s3 cp"*) cp "$STUB_BUNDLE_ZIP" "${@: -1}" ;;
esac
""")
    result, calls = run_user_data(world)
    assert result.returncode == 0, result.stdout + result.stderr
    assert "could not tag i-0a1b2c3d4e5f60718 cluster:bootstrap=running (not fatal); continuing" in result.stdout
    assert any(c.startswith("bootstrap") for c in calls)


def _hanging_world(world):
    tmp_path, script, env, _ = world
    config = json.loads((tmp_path / "user-data.sh").read_text().split("<<'NODE_CONFIG_EOF'\n", 1)[1]
                        .split("\nNODE_CONFIG_EOF", 1)[0])
    config["bootstrap"]["deadlineSeconds"] = 1
    text = script.read_text()
    start = text.index("<<'NODE_CONFIG_EOF'\n") + len("<<'NODE_CONFIG_EOF'\n")
    end = text.index("\nNODE_CONFIG_EOF", start)
    script.write_text(text[:start] + json.dumps(config) + text[end:])
    (tmp_path / "bin/sleep").write_text('#!/bin/bash\necho "sleep $*" >>"$STUB_LOG"\nexec /bin/sleep "$1"\n')


def test_a_bootstrap_that_never_ends_is_abandoned_after_its_deadline_and_signalled(world):
    _hanging_world(world)
    result, calls = run_user_data(world, STUB_BOOTSTRAP_HANG="1", CLUSTER_BOOTSTRAP_GRACE_S="1")
    assert result.returncode == 124
    assert "still ran 2 s after it started: killed and abandoned" in result.stdout
    create_failed, health = aws_calls(calls)[-2:]
    assert "user-data failed at stage 'node_bootstrap run (exit 124)'" in create_failed
    assert "set-instance-health" in health


def test_a_stuck_bootstrap_that_already_signalled_is_not_signalled_again(world):
    _hanging_world(world)
    result, calls = run_user_data(world, STUB_BOOTSTRAP_HANG="1", STUB_BOOTSTRAP_MARKER="1",
                                  CLUSTER_BOOTSTRAP_GRACE_S="1")
    assert result.returncode == 124
    assert not any("set-instance-health" in c for c in aws_calls(calls))
    assert "it already tagged the instance failed and marked it Unhealthy" in result.stdout
