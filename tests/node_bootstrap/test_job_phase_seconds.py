"""Badput from the phase records (issue 45): the supervisor's hang watch sums the seconds the trainer spent in each
phase after its first step (progress.py phase_seconds), the supervisor records them in the status
("phaseSeconds"), `status` passes them through job_report's schema, and says when the job last printed
("lastOutputAt")."""

from __future__ import annotations

import json
import os
import re

import pytest
from hang_watch_support import Run, phase, step
from node_supervisor_support import JOB, make_settings, run_job

from node_bootstrap import jobs
from node_bootstrap.job_contract import MAX_PHASE_SECONDS
from node_bootstrap.jobs.job_report import Rejections, checked_phase_seconds
from node_bootstrap.jobs.progress import RESTART_MARKER


def test_the_watch_sums_each_phase_after_the_first_step_and_an_inner_phase_only_once():
    run = Run()
    run.during("checkpoint_load", 30)  # before the first step: the restart timeline's, not counted here
    run.during("compile", 90)
    assert run.watch.phase_totals() == {}
    run.steps(3)
    run.during("checkpoint_save", 12)
    run.steps(2)
    run.feed(phase("validation", "start"))
    run.wait(4)
    run.during("compile", 6)  # a recompile inside the validation: compile's 6 s, not validation's
    run.wait(5)
    run.feed(phase("validation", "end"))
    run.during("checkpoint_save", 3)
    run.steps(1)
    assert run.hung is None
    assert run.watch.phase_totals() == {"checkpoint_save": 15.0, "validation": 9.0, "compile": 6.0}
    # an open phase counts up to now; a step line ends it (its end record lost)
    run.feed(phase("data_wait", "start"))
    run.wait(2)
    assert run.watch.phase_totals()["data_wait"] == 2.0
    run.steps(1)
    assert run.watch.phase_totals()["data_wait"] == 2.0 + 2.0  # the step's wait was still the open phase
    changes = run.watch.phase_changes
    run.steps(1)
    assert run.watch.phase_changes == changes  # a step without a phase changes nothing to record


def test_after_torchrun_restarts_the_workers_only_phases_after_their_first_step_count():
    run = Run().started()
    run.steps(2)
    run.during("checkpoint_save", 5)
    run.feed(b"[E] failed (exitcode: 1) local_rank: 0 (pid: 7) of binary: python\n")
    assert RESTART_MARKER in b"failed (exitcode: 1)"
    run.during("checkpoint_load", 40)
    run.during("compile", 50)
    assert run.watch.phase_totals() == {"checkpoint_save": 5.0}
    run.steps(1)
    run.during("compile", 7)
    assert run.watch.phase_totals() == {"checkpoint_save": 5.0, "compile": 7.0}


def test_the_supervisor_records_the_seconds_and_status_reads_them(tmp_path):
    settings = make_settings(tmp_path, hang_timeout_s=60)
    lines = [step(1), phase("checkpoint_save", "start"), phase("checkpoint_save", "end"), step(2),
             phase("export", "start"), phase("export", "end")]
    code = "import time, sys\n" + "".join(
        f"sys.stdout.write({line.decode()!r}); sys.stdout.flush(); time.sleep(0.05)\n" for line in lines)
    status = run_job(settings, code)
    seconds = status["phaseSeconds"]
    assert set(seconds) == {"checkpoint_save", "export"}, status
    assert all(type(s) is float and 0.0 < s < 10 for s in seconds.values()), seconds
    with open(jobs.JobFiles.of(settings, JOB).status_path) as f:
        recorded = json.load(f)
    assert recorded["phaseSeconds"] == seconds
    assert re.fullmatch(r"\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d\.\d{3}Z", status["lastOutputAt"]), status


@pytest.mark.parametrize("value", [
    {"checkpoint_save": float("nan")}, {"checkpoint_save": -1}, {"checkpoint_save": MAX_PHASE_SECONDS + 1},
    {"checkpoint_save": True}, {"checkpoint_save": "3"}, {"\x1b[2J": 1.0}, {"started": 1.0}, [1.0], "x",
])
def test_a_recorded_value_outside_the_schema_is_dropped_and_counted(tmp_path, value):
    settings = make_settings(tmp_path)
    files = jobs.JobFiles.of(settings, JOB)
    os.makedirs(files.job_dir, exist_ok=True)
    jobs.write_json_atomic(files.spec_path, {"jobId": JOB, "module": jobs.TRAINING_MODULE})
    jobs.write_json_atomic(files.status_path, {"jobId": JOB, "attempt": 1, "state": "succeeded", "supervisorPid": 1,
                                               "phaseSeconds": {"validation": 2.5, "x": 1} if value == "x" else value})
    status = jobs.job_status(settings, JOB)
    assert status["phaseSeconds"] == ({"validation": 2.5} if value == "x" else {})
    assert status["rejectedValues"]["phaseSeconds"] >= 1
    assert status["lastOutputAt"] is None  # no log yet


def test_the_checker_keeps_known_names_with_finite_seconds():
    rejected = Rejections()
    assert checked_phase_seconds({"compile": 3, "data_wait": 0.25}, rejected) == {"compile": 3.0, "data_wait": 0.25}
    assert checked_phase_seconds(None, rejected) == {} and not rejected.as_dict()
