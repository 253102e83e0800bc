"""Shared fixtures for the CDK tests: synthesized stacks shared per session (synthesis runs a jsii process and
takes seconds; every variant is synthesized once). And botocore's parsed models, shared by every session a test
process creates (tests/botocore_models.py). And Inductor's CPU ISA check, once per test process
(tests/inductor_isa.py)."""

from __future__ import annotations

import gc
import sys
from collections.abc import Callable

import pytest
from botocore_models import share_parsed_models
from cdk_support import STACK_VARIANTS, SynthesizedStack
from inductor_isa import settle_vec_isa_check

share_parsed_models()


@pytest.hookimpl(hookwrapper=True)
def pytest_collection(session):
    """Collection imports every test module, and with them torch, moto and the CDK: objects that live as long as
    the worker. The cycle collector is off meanwhile (~1 CPU-s a worker): each collection would walk the growing
    heap and find nothing. It is back on for the tests (freezing that heap was measured slower: docs/benchmarks.md)."""
    was_enabled = gc.isenabled()
    gc.disable()
    try:
        yield
    finally:
        if was_enabled:
            gc.enable()


def pytest_collection_finish(session):
    """Inductor's CPU ISA check once in this test process, for every process the tests start
    (tests/inductor_isa.py). Only where the collected tests imported torch: a run of the CDK tests alone has no
    use for it."""
    if "torch" in sys.modules:
        settle_vec_isa_check()


@pytest.fixture(scope="session")
def synth(tmp_path_factory) -> Callable[[str], SynthesizedStack]:
    """synth(variant_name) -> SynthesizedStack, synthesized at most once per session."""
    cache: dict[str, SynthesizedStack] = {}

    def get(variant: str) -> SynthesizedStack:
        if variant not in cache:
            cache[variant] = SynthesizedStack(STACK_VARIANTS[variant], tmp_path_factory.mktemp(variant))
        return cache[variant]

    return get
