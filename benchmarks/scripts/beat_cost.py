"""What the hang watch's beats and slow-wait guards cost (docs/benchmarks.md, issue 45): a child process prints
beats into a pipe its parent reads line by line and feeds to a ProgressWatch, as the job supervisor does.

    python benchmarks/scripts/beat_cost.py            # prints one JSON line per round, then the parent's cost
"""

from __future__ import annotations

import json
import subprocess
import sys
import time
from pathlib import Path

REPO = Path(__file__).resolve().parents[2]
BEATS = 20_000
ROUNDS = 3


def child() -> None:
    from training.phases import PhaseReporter

    reporter = PhaseReporter(True)
    for _ in range(ROUNDS):
        began = time.perf_counter()
        for n in range(BEATS):
            reporter.beat(n)
        beat_us = (time.perf_counter() - began) / BEATS * 1e6
        began = time.perf_counter()
        for _ in range(BEATS // 4):
            with reporter.data_wait(), reporter.staging_wait():
                pass
        guards_us = (time.perf_counter() - began) / (BEATS // 4) * 1e6
        print(json.dumps({"beat_us": round(beat_us, 2), "two_wait_guards_us": round(guards_us, 1)}), file=sys.stderr)


def parent() -> None:
    from node_bootstrap.jobs.progress import ProgressWatch

    watch = ProgressWatch(1800, 3600, floor_s=120, step_floor_s=20)
    proc = subprocess.Popen([sys.executable, __file__, "--child"], stdout=subprocess.PIPE, cwd=REPO)
    assert proc.stdout is not None
    lines, spent = 0, 0.0
    for line in proc.stdout:
        began = time.perf_counter()
        watch.observe(line)
        spent += time.perf_counter() - began
        lines += 1
    proc.wait()
    print(json.dumps({"observe_us": round(spent / lines * 1e6, 2), "lines": lines, "last_step": watch.last_step}))


if __name__ == "__main__":
    sys.path.insert(0, str(REPO))
    child() if sys.argv[1:] == ["--child"] else parent()
