"""The job supervisor run for real, in-process, on a fake node's directories: the job is a `python -c` that prints
what a test needs, run as the user running the tests (as the fake nodes do), so each run takes a fraction of a
second. Used by the tests of what a job prints (tests/node_bootstrap/test_job_report.py, test_job_metrics.py)."""

from __future__ import annotations

import os
import sys
from pathlib import Path

from node_bootstrap import jobs

JOB = "j-untrusted-1"


def make_settings(root: Path, **extra) -> jobs.JobSettings:
    for d in ("jobs", "logs"):
        (root / d).mkdir(parents=True, exist_ok=True)
    return jobs.JobSettings(root=str(root), python=sys.executable, bundle_dir=str(root), env_file=str(root / "none"),
                            jobs_dir=str(root / "jobs"), job_log_dir=str(root / "logs"),
                            checkpoint_root=str(root / "fsx"), rendezvous_port=29400, log_group_name="g",
                            **{"hang_timeout_s": 0, **extra})


def run_job(settings: jobs.JobSettings, code: str, attempt: int = 1) -> dict:
    """One attempt of JOB whose job prints what `code` prints, supervised for real; its `status`."""
    files = jobs.JobFiles.of(settings, JOB)
    os.makedirs(files.job_dir, exist_ok=True)
    jobs.write_json_atomic(files.spec_path, {
        "jobId": JOB, "attempt": attempt, "module": jobs.TRAINING_MODULE, "argv": [sys.executable, "-c", code],
        "cwd": settings.root, "envFile": settings.env_file, "logPath": files.log_path, "launcher": "direct",
        "user": {"name": "cluster-job", "uid": os.geteuid(), "gid": os.getegid(), "groups": [], "home": "/"}})
    assert jobs.Supervisor(settings, JOB).run() == 0
    return jobs.job_status(settings, JOB)


def printing(text: str) -> str:
    return f"import sys; sys.stdout.write({text!r})"
