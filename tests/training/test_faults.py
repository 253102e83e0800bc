"""The SIGTERM and SIGINT flag in one process (the cross-rank agreement runs for real in test_torchrun.py), and
Ctrl-C on a real `python -m training`."""

from __future__ import annotations

import json
import os
import signal
import socket
import subprocess
import sys
from pathlib import Path

import pytest
import torch.distributed as dist

from training import __main__ as training_main
from training.faults import StopRequest

REPO = Path(__file__).resolve().parents[2]


def test_sigterm_sets_the_flag_instead_of_ending_the_process():
    with StopRequest() as stop:
        assert not stop.requested_locally and not stop.agreed()
        os.kill(os.getpid(), signal.SIGTERM)
        assert stop.requested_locally
        assert stop.agreed()


def test_uninstall_restores_the_previous_handler():
    seen = []

    def previous(signum, frame):
        seen.append(signum)

    old = signal.signal(signal.SIGTERM, previous)
    try:
        with StopRequest():
            assert signal.getsignal(signal.SIGTERM) is not previous
        assert signal.getsignal(signal.SIGTERM) is previous
        os.kill(os.getpid(), signal.SIGTERM)
        assert seen == [signal.SIGTERM]
    finally:
        signal.signal(signal.SIGTERM, old)


def test_agreement_is_a_collective_on_the_process_group():
    initialized_here = not dist.is_initialized()
    if initialized_here:
        with socket.socket() as sock:
            sock.bind(("127.0.0.1", 0))
            port = sock.getsockname()[1]
        dist.init_process_group("gloo", init_method=f"tcp://127.0.0.1:{port}", rank=0, world_size=1)
    try:
        stop = StopRequest()
        assert stop.agreed() is False
        stop.request()
        assert stop.agreed() is True
    finally:
        if initialized_here:
            dist.destroy_process_group()


def test_ctrl_c_is_a_stop_request_and_a_second_one_stops_at_once():
    with StopRequest(same_ctrl_c_s=0.0) as stop:  # every later SIGINT is a new key press
        os.kill(os.getpid(), signal.SIGINT)
        assert stop.requested_locally and stop.agreed() and stop.signal_name == "SIGINT"
        with pytest.raises(KeyboardInterrupt):
            os.kill(os.getpid(), signal.SIGINT)


def test_the_launchers_forward_of_the_same_ctrl_c_is_not_a_second_one():
    # torchrun's agent passes the Ctrl-C it got on to workers that got it from the terminal already
    with StopRequest(same_ctrl_c_s=3600.0) as stop:
        os.kill(os.getpid(), signal.SIGINT)
        os.kill(os.getpid(), signal.SIGINT)  # no KeyboardInterrupt: still the one stop request
        assert stop.agreed() and stop.signal_name == "SIGINT"


def test_a_keyboard_interrupt_that_reaches_the_cli_is_one_line_and_exit_130(monkeypatch, capsys):
    # what the second Ctrl-C raises (or a first one before the trainer installed its handler)
    def interrupted(*args, **kwargs):
        raise KeyboardInterrupt

    monkeypatch.setattr("training.train.train", interrupted)
    assert training_main.main(["--set", "run.steps=1"]) == training_main.EXIT_INTERRUPTED
    assert capsys.readouterr().err.splitlines() == [
        "interrupted: stopped at once, without saving a checkpoint (the newest complete one stays)"]


def test_ctrl_c_on_a_one_process_run_saves_at_the_step_boundary_and_exits_0(tmp_path):
    # issue 44: a ~70-line KeyboardInterrupt traceback, exit 130, and every step since the last checkpoint lost
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1", "PYTHONUNBUFFERED": "1"}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    proc = subprocess.Popen(
        [sys.executable, "-m", "training", "--config", "tiny-cpu", "--set", "run.steps=100000", "--set",
         "run.log_interval_steps=1", "--set", f"checkpoint.dir={tmp_path}"],
        cwd=REPO, env=env, text=True, stdout=subprocess.PIPE, stderr=subprocess.PIPE)
    seen = []  # the lines read before the signal: the stop may come right after the step that triggered it
    try:
        for line in proc.stdout:  # the signal comes once training runs, as a user's Ctrl-C would
            seen.append(line)
            if json.loads(line).get("step", 0) >= 3 and '"event": "step"' in line:
                proc.send_signal(signal.SIGINT)
                break
        out, err = proc.communicate(timeout=120)
    finally:
        proc.kill()
    out = "".join(seen) + out
    steps = [json.loads(x)["step"] for x in out.splitlines() if '"event": "step"' in x]
    stopped = [x.split("WARNING training: ", 1)[1] for x in err.splitlines() if "WARNING training: stopped" in x]
    assert proc.returncode == 0, err
    assert stopped == [f"stopped by SIGINT after step {steps[-1]} (checkpoint saved)"], err
    assert "Traceback" not in err
    assert (tmp_path / f"step-{steps[-1]}" / "train_state.json").is_file()
