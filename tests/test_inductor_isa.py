"""tests/inductor_isa.py: TORCHINDUCTOR_VEC_ISA_OK=1, set for the tests' processes after one check, makes Inductor
choose what a process that checks for itself chooses."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

from inductor_isa import VEC_ISA_OK_ENV, isa_choice, settle_vec_isa_check
from local_cluster import machine_env

TESTS = Path(__file__).resolve().parent
CHOICE = "import json, inductor_isa; print(json.dumps(inductor_isa.isa_choice()))"


def test_where_the_variable_is_set_a_process_that_checks_chooses_the_same():
    settled = settle_vec_isa_check()  # the suite's hook already ran it in a run that imported torch: idempotent
    env = {k: v for k, v in os.environ.items() if k != VEC_ISA_OK_ENV}
    checked = subprocess.run([sys.executable, "-c", CHOICE], env={**env, "PYTHONPATH": str(TESTS)},
                             capture_output=True, text=True, check=True, timeout=120)
    choice = json.loads(checked.stdout)
    if settled:
        assert os.environ[VEC_ISA_OK_ENV] == "1"
        assert isa_choice() == choice  # this process, which the variable let skip the base check
        assert choice["picked"] in choice["valid"], choice  # a vectorized ISA, not Inductor's scalar fallback
    else:
        assert os.environ.get(VEC_ISA_OK_ENV) != "1"


def test_a_value_the_caller_set_is_left_alone(monkeypatch):
    monkeypatch.setenv(VEC_ISA_OK_ENV, "0")
    assert settle_vec_isa_check() is False
    assert os.environ[VEC_ISA_OK_ENV] == "0"
    monkeypatch.setenv(VEC_ISA_OK_ENV, "1")
    assert settle_vec_isa_check() is True


def test_the_drills_nodes_get_the_answer_with_their_machines_environment(tmp_path, monkeypatch):
    """The drills' nodes start their trainers from the node's training.env, not from the test's environment."""
    monkeypatch.setenv(VEC_ISA_OK_ENV, "1")
    assert machine_env(tmp_path)[VEC_ISA_OK_ENV] == "1"
    monkeypatch.delenv(VEC_ISA_OK_ENV)
    assert VEC_ISA_OK_ENV not in machine_env(tmp_path)
