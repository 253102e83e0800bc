"""Fixtures of the failure drills: moto with no way out to real AWS, and drills made per test
(tests/keeper_drill.py), whose nodes' processes are killed at the end."""

from __future__ import annotations

from pathlib import Path

import pytest
from fake_aws import isolate_from_real_aws
from keeper_drill import Drill, make_drill
from local_cluster import REGION
from moto import mock_aws


@pytest.fixture()
def aws(monkeypatch, tmp_path):
    isolate_from_real_aws(monkeypatch, tmp_path, REGION)
    with mock_aws():
        yield


@pytest.fixture(scope="session")
def drill_machine_tmp(tmp_path_factory) -> Path:
    """The temporary directory of the machine every drill's nodes run on in this session
    (LocalCluster.machine_tmp): what one drill compiled, the next finds, as on a machine that ran the job before.

    Inductor's C++ precompiled header, which it builds under <TMPDIR>/torchinductor_<user>, is the test session's
    own: a file named by the compiler, its flags and the preprocessed header, the same for every process here, so
    the drills' first compile does not build it again (~7 CPU-s)."""
    from torch._inductor.runtime.cache_dir_utils import default_cache_dir

    machine_tmp = tmp_path_factory.mktemp("machine-tmp")
    session_headers = Path(default_cache_dir())
    session_headers.mkdir(parents=True, exist_ok=True)
    (machine_tmp / session_headers.name).symlink_to(session_headers)
    return machine_tmp


@pytest.fixture()
def drills(aws, tmp_path, drill_machine_tmp):
    """make_drill(**stack outputs) for this test; its nodes' processes are killed at the end."""
    made: list[Drill] = []

    def make(**outputs) -> Drill:
        assert not made, "one cluster per test: the stack, group and table names are fixed"
        made.append(make_drill(tmp_path, machine_tmp=drill_machine_tmp, **outputs))
        return made[-1]

    yield make
    for each in made:
        each.cluster.cleanup()


@pytest.fixture()
def drill(drills):
    return drills()


