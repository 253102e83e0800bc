"""Shared fixtures for the CDK tests: synthesized stacks shared per session (synthesis runs a jsii process and
takes seconds; every variant is synthesized once). And botocore's parsed models, shared by every session a test
process creates (tests/botocore_models.py)."""

from __future__ import annotations

from collections.abc import Callable

import pytest
from botocore_models import share_parsed_models
from cdk_support import STACK_VARIANTS, SynthesizedStack

share_parsed_models()


@pytest.fixture(scope="session")
def synth(tmp_path_factory) -> Callable[[str], SynthesizedStack]:
    """synth(variant_name) -> SynthesizedStack, synthesized at most once per session."""
    cache: dict[str, SynthesizedStack] = {}

    def get(variant: str) -> SynthesizedStack:
        if variant not in cache:
            cache[variant] = SynthesizedStack(STACK_VARIANTS[variant], tmp_path_factory.mktemp(variant))
        return cache[variant]

    return get
