"""Where clusterctl takes its region from: --region, then AWS_REGION, then AWS_DEFAULT_REGION (the AWS CLI's order).

boto3 alone reads only AWS_DEFAULT_REGION; a user with AWS_REGION set (the AWS CLI v2's and Lambda's variable)
was told "no AWS region" (issue 44). No test here makes a client, so nothing reaches AWS.
"""

from __future__ import annotations

import pytest

from cluster_aws.errors import EXIT_ENDPOINT
from cluster_aws.session import build_context


@pytest.fixture
def no_region(monkeypatch, tmp_path):
    for name in ("AWS_REGION", "AWS_DEFAULT_REGION", "AWS_PROFILE", "AWS_DEFAULT_PROFILE"):
        monkeypatch.delenv(name, raising=False)
    # no ~/.aws/config region either
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "credentials"))
    return monkeypatch


@pytest.mark.parametrize(
    ("environment", "flag", "expected"),
    [
        ({"AWS_REGION": "us-east-1"}, None, "us-east-1"),
        ({"AWS_DEFAULT_REGION": "eu-west-1"}, None, "eu-west-1"),
        ({"AWS_REGION": "us-east-1", "AWS_DEFAULT_REGION": "eu-west-1"}, None, "us-east-1"),
        ({"AWS_REGION": "us-east-1"}, "us-west-2", "us-west-2"),
        ({"AWS_REGION": "  "}, None, None),
    ],
)
def test_the_region_comes_from_the_flag_then_aws_region_then_aws_default_region(no_region, environment, flag, expected):
    for name, value in environment.items():
        no_region.setenv(name, value)
    assert build_context(flag, None).region == expected


def test_no_region_names_both_variables(no_region, capsys):
    from clusterctl.cli import main

    assert main(["nodes"]) == EXIT_ENDPOINT
    assert capsys.readouterr().err == (
        "clusterctl: error: no AWS region: pass --region, or set AWS_REGION or AWS_DEFAULT_REGION\n"
    )
