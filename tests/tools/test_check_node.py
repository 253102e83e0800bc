"""tools/check_node.py: make tells the user plainly whether their Node.js is one AWS CDK supports."""

import datetime as dt
import subprocess
import sys

import pytest
from cdk_support import REPO_ROOT

from tools.check_node import CDK_SUPPORT_ENDS, cli_minimum_major, judge

TODAY = dt.date(2026, 11, 23)


def test_the_pinned_cli_runs_on_node_18_and_later():
    assert cli_minimum_major() == 18  # package-lock.json: aws-cdk 2.1148.1 engines.node ">= 18.0.0"


@pytest.mark.parametrize("version", ["v22.11.0", "v24.1.0"])
def test_supported_lts_releases_pass_silently(version):
    assert judge(version, TODAY, 18) == (0, "")


def test_node_20_still_runs_but_gets_one_plain_warning():
    code, message = judge("v20.20.2", TODAY, 18)
    assert code == 0
    assert message == (
        "warning: Node.js v20.20.2 is no longer supported by AWS CDK (support ended 2026-10-30; supported: "
        "22.x (until 2027-10-30), 24.x (until 2028-10-30)). make goes on (the pinned CLI still runs on Node >= 18), "
        "but install Node.js 22 or 24 (an LTS release AWS CDK supports), e.g. from nodejs.org or your OS's packages."
    )
    assert judge("v20.20.2", dt.date(2026, 10, 30), 18) == (0, "")  # the last day of support


def test_too_old_or_missing_node_stops_make():
    code, message = judge("v16.20.2", TODAY, 18)
    assert code == 1 and message.startswith("error: Node.js v16.20.2 is too old for the pinned AWS CDK CLI")
    code, message = judge(None, TODAY, 18)
    assert code == 1 and message.startswith("error: Node.js not found")
    assert judge("node: command not found", TODAY, 18)[0] == 1


def test_odd_and_unknown_releases_warn():
    assert "non-LTS" in judge("v23.3.0", TODAY, 18)[1]
    assert "not yet in AWS CDK's support table" in judge("v26.0.0", TODAY, 18)[1]


def test_an_lts_release_older_than_the_table_is_no_longer_supported_not_too_new():
    code, message = judge("v18.20.4", TODAY, 18)
    assert code == 0 and message.startswith("warning: Node.js v18.20.4 is no longer supported by AWS CDK")
    assert "not yet" not in message


def test_script_prints_one_line_and_exits_with_the_verdict():
    result = subprocess.run(
        [sys.executable, "tools/check_node.py", "--version", "v16.0.0", "--today", "2026-11-23"],
        cwd=REPO_ROOT,
        capture_output=True,
        text=True,
        timeout=60,
    )
    assert result.returncode == 1 and result.stdout == ""
    assert result.stderr.count("\n") == 1 and result.stderr.startswith("check_node: error: ")


def test_readme_states_the_supported_versions():
    readme = (REPO_ROOT / "README.md").read_text()
    for major, end in CDK_SUPPORT_ENDS.items():
        assert f"{major}.x" in readme and end.isoformat() in readme
