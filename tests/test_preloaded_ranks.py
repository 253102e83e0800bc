"""tests/preloaded_ranks.py: a rank forked from the zygote is the process ``python *argv`` would be (its
argv, environment, directory, import path, output, shutdown and exit code), and it can be waited on,
signalled and killed like a subprocess. The zygote here preloads nothing: the fork, not torch, is tested."""

from __future__ import annotations

import json
import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import preloaded_ranks
import pytest
from preloaded_ranks import run_preloaded, start_rank

REPORT = """\
import atexit, json, os, sys
atexit.register(lambda: print("atexit ran", flush=True))
print(json.dumps({"argv": sys.argv, "name": __name__, "cwd": os.getcwd(), "path0": sys.path[0],
                  "rank": os.environ.get("RANK"), "extra": os.environ.get("EXTRA")}))
print("to stderr", file=sys.stderr)
if sys.argv[1:] == ["raise"]:
    raise ValueError("raised in the rank")
if sys.argv[1:] == ["sleep"]:
    import time
    time.sleep(60)
sys.exit(int(sys.argv[1]))
"""


@pytest.fixture
def work(tmp_path):
    (tmp_path / "report.py").write_text(REPORT)
    (tmp_path / "pkg").mkdir()
    (tmp_path / "pkg/__init__.py").write_text("")
    (tmp_path / "pkg/__main__.py").write_text(REPORT)
    return tmp_path


def env(**extra: str) -> dict[str, str]:
    return {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1", **extra}


def forked(argv: list[str], work: Path, **extra: str) -> tuple[int, str]:
    log = work / f"rank-{time.monotonic_ns()}.log"
    rank = start_rank(argv, env=env(**extra), cwd=work, log=log, preload=())
    code = rank.wait(timeout=60)
    return code, log.read_text()


def real(argv: list[str], work: Path, **extra: str) -> tuple[int, str]:
    proc = subprocess.run([sys.executable, *argv], cwd=work, env=env(**extra), stdout=subprocess.PIPE,
                          stderr=subprocess.STDOUT, text=True, timeout=60)
    return proc.returncode, proc.stdout


@pytest.mark.parametrize("argv", [["report.py", "3"], ["-m", "pkg", "0"]], ids=["script", "module"])
def test_a_forked_rank_is_the_process_python_would_start(work, argv):
    code, output = forked(argv, work, RANK="1", EXTRA="x")
    assert (code, output) == real(argv, work, RANK="1", EXTRA="x")
    report = json.loads(output.splitlines()[0])
    assert report["name"] == "__main__" and report["rank"] == "1" and report["extra"] == "x"
    assert report["cwd"] == str(work) and report["argv"][1:] == argv[-1:]
    assert output.splitlines()[1:] == ["to stderr", "atexit ran"]


def test_run_preloaded_gives_what_subprocess_run_gives_without_the_unbuffered_output(work):
    env = {k: v for k, v in os.environ.items() if k != "PYTHONUNBUFFERED"} | {"OMP_NUM_THREADS": "1"}
    forked = run_preloaded(["report.py", "4"], env=env, cwd=work, timeout=60, preload=())
    real = subprocess.run([sys.executable, "report.py", "4"], env=env, cwd=work, capture_output=True, text=True,
                          timeout=60)
    assert (forked.returncode, forked.stdout, forked.stderr) == (real.returncode, real.stdout, real.stderr)
    assert forked.returncode == 4 and forked.stderr == "to stderr\n" and forked.stdout.endswith("atexit ran\n")


def test_an_uncaught_exception_exits_1_with_its_traceback(work):
    code, output = forked(["report.py", "raise"], work)
    assert code == 1
    assert "Traceback" in output and "ValueError: raised in the rank" in output


def test_a_rank_is_waited_on_signalled_and_killed_like_a_subprocess(work):
    ranks = [start_rank(["report.py", "sleep"], env=env(), cwd=work, log=work / f"sleep{k}.log", preload=())
             for k in range(2)]
    with pytest.raises(subprocess.TimeoutExpired):
        ranks[0].wait(timeout=0.2)
    assert ranks[0].poll() is None and ranks[0].pid != ranks[1].pid
    ranks[0].send_signal(signal.SIGTERM)
    ranks[1].kill()
    assert [rank.wait(timeout=30) for rank in ranks] == [-signal.SIGTERM, -signal.SIGKILL]


def test_the_zygote_refuses_to_fork_with_several_openblas_threads(work):
    with pytest.raises(RuntimeError, match="the rank zygote exited with 1"):
        start_rank(["report.py", "0"], env=env(OMP_NUM_THREADS="2"), cwd=work, log=work / "refused.log", preload=())


def test_a_zygote_stuck_in_its_imports_fails_the_start_and_is_killed(work, monkeypatch):
    (work / "stuck_import.py").write_text("import time\ntime.sleep(60)\n")
    monkeypatch.setattr(preloaded_ranks, "START_TIMEOUT_S", 0.5)
    with pytest.raises(RuntimeError, match=r"did not start a rank within 0.5 s \(its preload: stuck_import\)"):
        start_rank(["report.py", "0"], env=env(), cwd=work, log=work / "stuck.log", preload=("stuck_import",))
    (zygote,) = [z for z in preloaded_ranks._zygotes.values() if z.proc.args[2:] == ["stuck_import"]]
    assert zygote.proc.poll() == -signal.SIGKILL
