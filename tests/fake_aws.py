"""Fake credentials for moto, and no way to the developer's real AWS config or the instance metadata service;
answers, in AWS's shapes, for calls moto does not implement (the tests stub them with botocore's Stubber)."""

from __future__ import annotations

import datetime
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


def capacity_block_offering(offering_id: str, fee: str, *, az: str = "us-east-1a", start_day: int = 3) -> dict:
    """One item of ec2 DescribeCapacityBlockOfferings: 4 x p5.48xlarge for 168 hours from 2026-12-<start_day>."""
    start = datetime.datetime(2026, 12, start_day, 11, 30, tzinfo=datetime.UTC)
    return {
        "CapacityBlockOfferingId": offering_id,
        "InstanceType": "p5.48xlarge",
        "AvailabilityZone": az,
        "InstanceCount": 4,
        "StartDate": start,
        "EndDate": start + datetime.timedelta(hours=168),
        "CapacityBlockDurationHours": 168,
        "UpfrontFee": fee,
        "CurrencyCode": "USD",
        "Tenancy": "default",
    }
