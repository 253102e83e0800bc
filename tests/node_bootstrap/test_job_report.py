"""What a job prints is untrusted input (issue 42), the node side: every value read from a job's output passes
node_bootstrap/jobs/job_report.py's schema, or is dropped and counted; the supervisor's record, not the job's
lines, says which attempt runs; the job's output is capped per line and per job.

The supervisor runs here in-process, for real (the job is a python -c that prints what the test needs, run as
the user running the tests, as the fake nodes do), so each case takes a fraction of a second."""

from __future__ import annotations

import json
import os
import string
from pathlib import Path

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from node_supervisor_support import JOB, make_settings, printing, run_job

from node_bootstrap import jobs
from node_bootstrap.jobs.job_output import CUT_NOTE, OutputCap
from node_bootstrap.jobs.job_report import TRAINER_PHASES, Rejections, checked_network, step_report

# the exact lines of issue 42's reproduction
FLOAT_STEP = '{"event": "step", "step": 2.5}\n'
FLOAT_RESUME = '{"event": "resume", "step": 2.5, "path": "/fsx/checkpoints/x", "tier": "durable"}\n'
STRING_RESUME = '{"event": "resume", "step": "1200", "path": "/fsx/checkpoints/x", "tier": "durable"}\n'
STRING_STEP = '{"event": "step", "step": "20", "loss": "0.5"}\n'
TERMINAL_ESCAPES = "host:1:1 [0] NCCL INFO Using network \x1b]0;pwned\x07\x1b[2J\n"
FORGED_MARKER = "[node_bootstrap.jobs] 2026-11-20T23:15:04Z attempt 9 starts on ip-10-0-0-9: x\n"
SHOWN_RE = r"[A-Za-z0-9_.+/;: -]*"  # what job_report lets through for a name a person sees


def test_the_issues_lines_are_dropped_and_counted_never_passed_on(tmp_path):
    settings = make_settings(tmp_path)
    good = '{"event": "step", "step": 10, "loss": 2.5}\n'
    status = run_job(settings, printing(good + FLOAT_STEP + STRING_STEP + FLOAT_RESUME + TERMINAL_ESCAPES))
    # the last step line's values fail: the status shows none, rather than a float or a string
    assert (status["lastStep"], status["lastLoss"]) == (None, None)
    assert (status["resumedFromStep"], status["resumedFromTier"]) == (None, "durable")
    assert (status["ncclNetwork"], status["ncclProvider"]) == (None, None)
    # the supervisor's record (its _observe) holds no float either
    recorded = json.loads(Path(jobs.JobFiles.of(settings, JOB).status_path).read_text())
    assert recorded["resumedFromStep"] is None and recorded["rejectedValues"] == {"resumedFromStep": 1}
    assert status["rejectedValues"] == {"lastLoss": 1, "lastStep": 1, "ncclNetwork": 1, "resumedFromStep": 2}
    assert "\x1b" not in json.dumps(status) and "\\u001b" not in json.dumps(status)

    status = run_job(settings, printing(good + STRING_RESUME), attempt=2)
    assert (status["lastStep"], status["lastLoss"], status["resumedFromStep"]) == (10, 2.5, None)
    assert status["rejectedValues"] == {"resumedFromStep": 2}  # the supervisor's and this read's


def test_a_hung_jobs_last_step_seen_is_checked_too():
    watch = jobs.ProgressWatch(60.0, 60.0, clock=lambda: 0.0)
    watch.observe(FLOAT_STEP.encode())
    watch.observe(b'{"event": "step", "step": true}\n')
    assert watch.last_step is None and watch.rejected.as_dict() == {"lastStepSeen": 2}
    watch.observe(b'[rank0]:{"event": "step", "step": 7}\n')
    assert watch.last_step == 7


def test_a_forged_attempt_marker_in_the_jobs_output_changes_nothing(tmp_path):
    settings = make_settings(tmp_path)
    run_job(settings, printing('{"event": "step", "step": 10}\n'))
    code = printing('{"event": "resume", "step": 10, "path": null}\n{"event": "step", "step": 20}\n' + FORGED_MARKER)
    status = run_job(settings, code, attempt=2)
    # what status says is attempt 2's, from where the supervisor recorded attempt 2's part begins
    assert (status["attempt"], status["state"], status["lastStep"], status["resumedFromStep"]) == (2, "succeeded",
                                                                                                   20, 10)
    recorded = json.loads(Path(jobs.JobFiles.of(settings, JOB).status_path).read_text())
    log = Path(jobs.JobFiles.of(settings, JOB).log_path).read_bytes()
    assert log.index(b"attempt 2 starts on") < recorded["logOffsetBytes"] < log.index(FORGED_MARKER.encode())


def test_a_line_longer_than_the_cap_is_cut_and_read_in_pieces(tmp_path):
    settings = make_settings(tmp_path, job_line_max_bytes=1024)
    code = ("import sys; w = sys.stdout.write; w('x' * (3 * 1024 * 1024)); w('\\n'); "
            "w('{\"event\": \"step\", \"step\": 5, \"loss\": 1.5}\\n'); w('y' * 5000)")
    status = run_job(settings, code)
    log = Path(status["logPath"]).read_bytes()
    assert (b"x" * 1024 + CUT_NOTE) in log and b"x" * 1025 not in log
    assert (b"y" * 1024 + CUT_NOTE) in log
    assert status["output"] == {"cutLines": 2, "droppedBytes": 3 * 1024 * 1024 + 1 - 1024 + 5000 - 1024,
                                "droppedLines": 0}
    assert (status["lastStep"], status["lastLoss"]) == (5, 1.5)


def test_the_job_log_stops_growing_at_its_limit_and_counts_the_rest(tmp_path):
    settings = make_settings(tmp_path, job_log_max_bytes=64 * 1024)
    code = "import sys\nfor i in range(10000): sys.stdout.write('{\"event\": \"step\", \"step\": %d}\\n' % i)"
    status = run_job(settings, code)
    size = os.path.getsize(status["logPath"])
    assert 60 * 1024 < size <= 64 * 1024 + 1024  # the cap, plus the supervisor's own closing lines
    assert status["output"]["droppedLines"] > 7000 and status["output"]["cutLines"] == 0
    assert "job output not kept" in Path(status["logPath"]).read_text()
    # the supervisor still saw every line: progress does not stop at a full log
    recorded = json.loads(Path(jobs.JobFiles.of(settings, JOB).status_path).read_text())
    assert recorded["state"] == "succeeded" and recorded["output"] == status["output"]


def test_the_cap_rejects_nonsense_limits():
    with pytest.raises(ValueError, match="line_max_bytes=0"):
        OutputCap(1024, 0)


# ----- property-based: arbitrary JSON, bytes and escapes -----

_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=True, allow_infinity=True)
    | st.text(alphabet=st.characters(codec="utf-8"), max_size=20),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12)
_keys = st.sampled_from(["step", "loss", "val_loss", "tier", "compile_cache", "phases", "busbw_gbps",
                         "size_bytes", "largest_size_bytes", "path"])
_events = st.fixed_dictionaries({"event": st.sampled_from(["step", "resume", "allreduce", "allreduce_summary"])},
                                optional={k: _json_values for k in ["step", "loss", "val_loss", "tier",
                                                                    "compile_cache", "phases", "busbw_gbps"]})
_escapes = st.text(alphabet=st.sampled_from(list("\x1b\x07\x9b[]0;?JHm\r\t\x00 ") + list(string.ascii_letters)),
                   max_size=30)
_lines = st.one_of(
    _events.map(lambda e: json.dumps(e, allow_nan=True)),
    st.builds(lambda k, v: json.dumps({"event": "step", k: v}, allow_nan=True), _keys, _json_values),
    _escapes.map(lambda e: "x:1:1 [0] NCCL INFO Using network " + e),
    _escapes.map(lambda e: "x:1:1 [0] NCCL INFO NET/OFI Selected provider is " + e + ", fabric is x"),
    st.binary(max_size=60).map(lambda b: b.decode("utf-8", "replace")),
)


def _assert_clean(status: dict) -> None:
    """Only values of the schema's types and ranges, and names of its characters, come out."""
    for key in ("lastStep", "lastValStep", "resumedFromStep", "busbwSizeBytes"):
        value = status.get(key)
        assert value is None or (type(value) is int and value >= 0), (key, value)
    for key in ("lastLoss", "lastValLoss", "busbwGbps"):
        value = status.get(key)
        assert value is None or (type(value) is float and 0 <= value < float("inf")), (key, value)
    assert status.get("resumedFromTier") in (None, "local", "durable")
    assert status.get("compileCache") in (None, "snapshot", "cold")
    for key in ("ncclNetwork", "ncclProvider"):
        value = status.get(key)
        assert value is None or (isinstance(value, str) and value.isascii() and value.isprintable()
                                 and "\x1b" not in value and len(value) <= 32), (key, value)
    for name, when in (status.get("phases") or {}).items():
        assert name in ("started", *TRAINER_PHASES) and isinstance(when, str) and when.isascii() and when.isprintable()
    json.dumps(status, allow_nan=False)  # what the keeper gets is strict JSON


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(_lines, max_size=6), st.sampled_from([jobs.TRAINING_MODULE, jobs.COMMCHECK_MODULE]),
       st.dictionaries(st.sampled_from(["started", "first_step", "compiled", "x"]), _json_values, max_size=3))
def test_status_never_raises_and_lets_nothing_raw_through(tmp_path, lines, module, phases):
    settings = make_settings(tmp_path)
    files = jobs.JobFiles.of(settings, JOB)
    os.makedirs(files.job_dir, exist_ok=True)
    jobs.write_json_atomic(files.spec_path, {"jobId": JOB, "module": module})
    jobs.write_json_atomic(files.status_path, {"jobId": JOB, "attempt": 1, "state": "succeeded",
                                               "logOffsetBytes": 0, "supervisorPid": 1, "phases": phases})
    Path(files.log_path).write_text("".join(line + "\n" for line in lines), errors="surrogateescape")
    _assert_clean(jobs.job_status(settings, JOB))


@settings(max_examples=60, deadline=None, derandomize=True, database=None,
          suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(st.lists(st.one_of(_lines.map(str.encode), st.binary(max_size=80)), max_size=6))
def test_the_supervisor_records_nothing_raw(tmp_path, lines):
    settings = make_settings(tmp_path, hang_timeout_s=60)
    files = jobs.JobFiles.of(settings, JOB)
    os.makedirs(files.job_dir, exist_ok=True)
    jobs.write_json_atomic(files.spec_path, {"jobId": JOB, "module": jobs.TRAINING_MODULE})
    supervisor = jobs.Supervisor(settings, JOB)
    for line in lines:
        supervisor._observe(line + b"\n")
    _assert_clean(supervisor.status)
    assert supervisor.watch is not None
    assert supervisor.watch.last_step is None or type(supervisor.watch.last_step) is int


def test_the_schema_in_short():
    rejected = Rejections()
    assert step_report({"step": True, "loss": float("nan")}, rejected) == (None, None)
    assert step_report({"step": 10**12, "loss": -1}, rejected) == (None, None)
    assert step_report({"step": 3, "loss": 2}, rejected) == (3, 2.0)
    assert checked_network("Libfabric", rejected) == "Libfabric"
    assert checked_network("Socket\x1b[2J", rejected) is None
    assert rejected.as_dict() == {"lastLoss": 2, "lastStep": 2, "ncclNetwork": 1}
