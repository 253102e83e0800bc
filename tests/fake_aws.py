"""Fake credentials for moto, and no way to the developer's real AWS config or the instance metadata service."""

from __future__ import annotations

from pathlib import Path

import pytest


def isolate_from_real_aws(monkeypatch: pytest.MonkeyPatch, tmp_path: Path, region: str) -> None:
    for key in ("AWS_PROFILE", "AWS_DEFAULT_PROFILE", "AWS_SESSION_TOKEN", "AWS_ENDPOINT_URL", "AWS_REGION"):
        monkeypatch.delenv(key, raising=False)
    monkeypatch.setenv("AWS_ACCESS_KEY_ID", "testing")
    monkeypatch.setenv("AWS_SECRET_ACCESS_KEY", "testing")
    monkeypatch.setenv("AWS_DEFAULT_REGION", region)
    monkeypatch.setenv("AWS_EC2_METADATA_DISABLED", "true")
    # moto would otherwise load thousands of public AMIs (~10 s) on the first EC2 call of every test.
    monkeypatch.setenv("MOTO_EC2_LOAD_DEFAULT_AMIS", "false")
    monkeypatch.setenv("AWS_CONFIG_FILE", str(tmp_path / "no-aws-config"))
    monkeypatch.setenv("AWS_SHARED_CREDENTIALS_FILE", str(tmp_path / "no-aws-credentials"))
