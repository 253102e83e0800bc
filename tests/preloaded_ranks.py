"""Ranks of a test job forked from a process that has already imported the trainer.

A rank started as ``python -m training`` spends ~2 CPU-s importing torch, DTensor, torch._dynamo and the
training package before it reads its config: on the 2-core CI machine the tests' 2-rank runs spent more time
importing than training. Here a helper process (the "zygote", one per environment and pytest worker) imports
that once, and each rank is a fork of it that then runs its entry exactly as ``python -m training`` or
``python script.py`` would: the command line in sys.argv, the rank's environment, its working directory, its
output on a file, and the interpreter's own shutdown at the end (atexit handlers, the process groups'
release in training.__main__.cli), so the exit code is the one the real process would give.

What a fork does not cover: the interpreter's start and the imports themselves. The modules preloaded are only
those every trainer imports, and test_torchrun.py and the drills start real processes through torchrun.

Why a fork is safe here: the zygote has one thread. torch starts no thread at import, and OpenBLAS starts
none with OMP_NUM_THREADS=1, which torchrun_support.env() sets (the zygote refuses to serve otherwise).
"""

from __future__ import annotations

import atexit
import json
import os
import select
import signal
import subprocess
import sys
import tempfile
import time
from pathlib import Path

# What `python -m training` imports before its first step anyway: the trainer (torch, DTensor, FSDP2,
# safetensors) and torch._dynamo, which DTensor's constructor imports.
PRELOAD = ("training.train", "training.checkpoint.resume", "torch._dynamo")
# Variables in which ranks forked from one zygote may differ: those torchrun gives each worker, which no module
# reads at import, and the test that pytest is running. The rest of a rank's environment must be its zygote's.
PER_RANK_VARIABLES = frozenset({"RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT",
                                "GROUP_RANK", "ROLE_RANK", "TORCHELASTIC_RESTART_COUNT", "PYTEST_CURRENT_TEST"})
# A zygote that has not forked a requested rank by then is stuck in its imports: the test fails instead of hanging.
START_TIMEOUT_S = 120.0


class ForkedRank:
    """A started rank, with the part of subprocess.Popen's interface the tests use."""

    def __init__(self, zygote: _Zygote, pid: int):
        self._zygote = zygote
        self.pid = pid

    @property
    def returncode(self) -> int | None:
        return self._zygote.exit_codes.get(self.pid)

    def poll(self) -> int | None:
        self._zygote.read_reports(timeout_s=0)
        return self.returncode

    def wait(self, timeout: float | None = None) -> int:
        """The exit code (negative: the signal that ended it, as Popen's); subprocess.TimeoutExpired after
        ``timeout`` seconds."""
        deadline = None if timeout is None else time.monotonic() + timeout
        while self.returncode is None:
            left = None if deadline is None else deadline - time.monotonic()
            if left is not None and left <= 0:
                raise subprocess.TimeoutExpired(f"rank pid {self.pid}", timeout)
            self._zygote.read_reports(timeout_s=left)
        return self.returncode

    def send_signal(self, sig: int) -> None:
        if self.poll() is None:
            os.kill(self.pid, sig)

    def kill(self) -> None:
        self.send_signal(signal.SIGKILL)


class _Zygote:
    """The test's side of one zygote process: requests go to its stdin, reports come from its stdout."""

    def __init__(self, env: dict[str, str], cwd: Path, preload: tuple[str, ...]):
        # no -u: the ranks' buffering is what their environment (PYTHONUNBUFFERED) makes it, as in python
        self.proc = subprocess.Popen([sys.executable, __file__, *preload], cwd=cwd, env=env, text=True,
                                     stdin=subprocess.PIPE, stdout=subprocess.PIPE)
        self.exit_codes: dict[int, int] = {}
        self._started: list[int] = []
        self._buffer = ""

    def start(self, argv: list[str], *, env: dict[str, str], cwd: Path, stdout: Path, stderr: Path) -> ForkedRank:
        assert self.proc.stdin is not None
        request = {"argv": argv, "env": env, "cwd": str(cwd), "stdout": str(stdout), "stderr": str(stderr)}
        self.proc.stdin.write(json.dumps(request) + "\n")
        self.proc.stdin.flush()
        deadline = time.monotonic() + START_TIMEOUT_S  # the zygote's imports come first
        while not self._started:
            left = deadline - time.monotonic()
            if left <= 0:
                self.proc.kill()
                self.proc.wait()
                raise RuntimeError(f"the rank zygote did not start a rank within {START_TIMEOUT_S} s (its preload: "
                                   f"{' '.join(self.proc.args[2:]) or 'nothing'})")
            self.read_reports(timeout_s=left)
        return ForkedRank(self, self._started.pop(0))

    def read_reports(self, timeout_s: float | None) -> None:
        """Read what the zygote has reported within ``timeout_s`` (None: until something comes)."""
        assert self.proc.stdout is not None
        fd = self.proc.stdout.fileno()
        if not select.select([fd], [], [], timeout_s)[0]:
            return
        chunk = os.read(fd, 65536).decode()
        if not chunk:
            raise RuntimeError(f"the rank zygote exited with {self.proc.wait()} (its error is on the test's stderr)")
        self._buffer += chunk
        *lines, self._buffer = self._buffer.split("\n")
        for line in lines:
            report = json.loads(line)
            if "started" in report:
                self._started.append(report["started"])
            else:
                self.exit_codes[report["exited"]] = report["code"]

    def close(self) -> None:
        """Its stdin closed, the zygote kills the ranks still running and exits."""
        if self.proc.poll() is None:
            assert self.proc.stdin is not None
            self.proc.stdin.close()
            try:
                self.proc.wait(timeout=30)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()


_zygotes: dict[tuple, _Zygote] = {}


def start_rank(argv: list[str], *, env: dict[str, str], cwd: Path, log: Path, stderr: Path | None = None,
               preload: tuple[str, ...] = PRELOAD) -> ForkedRank:
    """Start ``python *argv`` (``argv``: ``-m module ...`` or ``script.py ...``) as a fork of a zygote that
    has imported ``preload``, with ``env``, in ``cwd``, its stdout appended to ``log``, its stderr too unless
    ``stderr`` names another file. One zygote per environment (less PER_RANK_VARIABLES), directory and preload:
    modules read some variables at import."""
    base = {k: v for k, v in env.items() if k not in PER_RANK_VARIABLES}
    key = (tuple(sorted(base.items())), str(cwd), preload)
    zygote = _zygotes.get(key)
    if zygote is None or zygote.proc.poll() is not None:
        if not _zygotes:
            atexit.register(_close_all)
        zygote = _zygotes[key] = _Zygote(base, cwd, preload)
    return zygote.start(argv, env=env, cwd=cwd, stdout=log, stderr=stderr or log)


def run_preloaded(argv: list[str], *, env: dict[str, str], cwd: Path, timeout: float, merge_stderr: bool = False,
                  preload: tuple[str, ...] = PRELOAD) -> subprocess.CompletedProcess:
    """``subprocess.run([sys.executable, *argv], capture_output=True, text=True, ...)`` with the process
    forked from a zygote (start_rank): for the tests whose subject is what a run computes, not its start.
    ``merge_stderr``: stderr into stdout, as ``stderr=subprocess.STDOUT`` (the result's stderr is then None)."""
    with tempfile.TemporaryDirectory() as tmp:
        out, err = Path(tmp) / "stdout", Path(tmp) / "stderr"
        rank = start_rank(argv, env=env, cwd=cwd, log=out, stderr=None if merge_stderr else err, preload=preload)
        try:
            code = rank.wait(timeout=timeout)
        finally:
            if rank.poll() is None:
                rank.kill()
                rank.wait()
        stderr = None if merge_stderr else err.read_text()
        return subprocess.CompletedProcess([sys.executable, *argv], code, out.read_text(), stderr)


def _close_all() -> None:
    for zygote in _zygotes.values():
        zygote.close()


# --- the zygote process -----------------------------------------------------------------------------------

def _serve(preload: list[str]) -> dict | None:
    """Import ``preload``, then fork a child per request line on stdin and report its pid and, once it has
    ended, its exit code on stdout. Returns the request in a child (which then becomes the rank); None in the
    zygote when stdin closes, after it has killed and reaped the children still running."""
    if os.environ.get("OMP_NUM_THREADS") != "1":
        sys.exit("preloaded_ranks: OMP_NUM_THREADS must be 1 (OpenBLAS's threads make a fork unsafe)")
    import importlib

    from training.startup import frozen_imports

    with frozen_imports():  # as `python -m training` imports them: each rank's fork shares them frozen
        for name in preload:
            importlib.import_module(name)
    running: dict[int, int] = {}  # pidfd -> pid
    stdin = sys.stdin.fileno()
    pending = b""
    while True:
        readable = select.select([stdin, *running], [], [])[0]
        for pidfd in [fd for fd in readable if fd in running]:
            pid = running.pop(pidfd)
            os.close(pidfd)
            code = os.waitstatus_to_exitcode(os.waitpid(pid, 0)[1])
            print(json.dumps({"exited": pid, "code": code}), flush=True)
        if stdin not in readable:
            continue
        chunk = os.read(stdin, 65536)
        if not chunk:
            for pidfd, pid in running.items():
                os.kill(pid, signal.SIGKILL)
                os.waitpid(pid, 0)
                os.close(pidfd)
            return None
        pending += chunk
        *lines, pending = pending.split(b"\n")
        for line in lines:
            request = json.loads(line)
            pid = os.fork()
            if pid == 0:
                for pidfd in running:
                    os.close(pidfd)
                return request
            running[os.pidfd_open(pid)] = pid
            print(json.dumps({"started": pid}), flush=True)


def _become_rank(request: dict) -> None:
    """In the forked child: the process ``python *argv`` would be, up to the entry's first line."""
    devnull = os.open(os.devnull, os.O_RDONLY)
    os.dup2(devnull, 0)
    os.close(devnull)
    stdout = os.open(request["stdout"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
    os.dup2(stdout, 1)
    if request["stderr"] == request["stdout"]:
        os.dup2(stdout, 2)
    else:
        stderr = os.open(request["stderr"], os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o644)
        os.dup2(stderr, 2)
        os.close(stderr)
    os.close(stdout)
    os.environ.clear()
    os.environ.update(request["env"])
    os.chdir(request["cwd"])
    import runpy

    argv = request["argv"]
    if argv[0] == "-m":
        sys.argv = argv[1:]  # run_module puts the module's file in sys.argv[0], as python -m does
        sys.path[0] = request["cwd"]
        runpy.run_module(argv[1], run_name="__main__", alter_sys=True)
    else:
        sys.argv = list(argv)
        sys.path[0] = str(Path(argv[0]).resolve().parent)
        runpy.run_path(argv[0], run_name="__main__")


if __name__ == "__main__":
    sys.path[0] = os.getcwd()  # as under python -m: the preloaded modules come from where the ranks run
    served = _serve(sys.argv[1:])
    if served is not None:
        _become_rank(served)  # the entry's sys.exit (or its exception) ends the rank as it would end python
