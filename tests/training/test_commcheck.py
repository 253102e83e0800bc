"""training.commcheck: one real ``torchrun --nproc_per_node=2`` run on gloo (module-scoped: one torchrun start
for every assertion about it), single-process runs in this process, and the value check against a collective
that corrupts its result."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.distributed as dist

from node_bootstrap import jobs as node_jobs
from training import commcheck
from training.parallel.process_group import destroy_distributed, init_distributed

REPO = Path(__file__).resolve().parents[2]
RUN_TIMEOUT_S = 180  # a hung collective fails the test instead of the whole CI job
MIB = 1024**2


@pytest.fixture()
def single_process(monkeypatch):
    """No torchrun variables: init_distributed makes a one-rank gloo group on a free local port."""
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "LOCAL_WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(name, raising=False)
    yield
    destroy_distributed()


@pytest.fixture(scope="module")
def torchrun_run():
    cmd = [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
           "-m", "training.commcheck", "--sizes-mib", "4,1", "--iters", "5", "--warmup-iters", "1",
           "--dtype", "float32", "--min-busbw-gbps", "0.000001"]
    env = {**os.environ, "OMP_NUM_THREADS": "1", "PYTHONPATH": str(REPO), "PYTHONUNBUFFERED": "1"}
    return subprocess.run(cmd, cwd=REPO, env=env, capture_output=True, text=True, timeout=RUN_TIMEOUT_S)


def json_lines(stdout: str) -> list[dict]:
    return [json.loads(line) for line in stdout.splitlines() if line.startswith("{")]


@pytest.mark.slow
def test_torchrun_two_ranks_print_one_line_per_size_from_rank_0(torchrun_run):
    assert torchrun_run.returncode == 0, torchrun_run.stderr
    *sizes, summary = json_lines(torchrun_run.stdout)
    assert [s["event"] for s in sizes] == ["allreduce", "allreduce"]  # rank 0 only, ascending sizes
    assert [s["size_bytes"] for s in sizes] == [1 * MIB, 4 * MIB]
    for line in sizes:
        assert (line["ranks"], line["dtype"], line["backend"]) == (2, "float32", "gloo")
        assert line["time_ms"] > 0
        # nccl-tests: algbw = S / t in 10^9 B/s, busbw = algbw * 2(n-1)/n (= algbw for n = 2)
        seconds = line["time_ms"] / 1e3
        assert line["algbw_gbps"] == pytest.approx(line["size_bytes"] / seconds / 1e9, rel=1e-12)
        assert line["busbw_gbps"] == pytest.approx(line["algbw_gbps"] * 2 * (2 - 1) / 2, rel=1e-12)
    assert summary == {
        "event": "allreduce_summary", "backend": "gloo", "dtype": "float32", "ranks": 2, "nodes": 1,
        "sizes_bytes": [1 * MIB, 4 * MIB], "largest_size_bytes": 4 * MIB,
        "busbw_gbps": sizes[1]["busbw_gbps"], "peak_busbw_gbps": max(s["busbw_gbps"] for s in sizes),
        "min_busbw_gbps": 1e-06, "passed": True,
    }


@pytest.mark.slow
def test_torchrun_table_on_stderr(torchrun_run):
    stderr = torchrun_run.stderr
    assert "all_reduce over 2 ranks on 1 nodes (gloo, float32): 5 timed calls per size after 1 warm-up" in stderr
    assert "algbw GB/s" in stderr and "busbw GB/s" in stderr
    rows = [line.split() for line in stderr.splitlines() if line.split()[1:2] == ["MiB"]]
    assert [row[:2] for row in rows] == [["1", "MiB"], ["4", "MiB"]]
    assert all(len(row) == 5 for row in rows)  # size, unit, time ms, algbw, busbw
    assert "{" not in stderr.split("all_reduce over")[1]  # the JSON goes to stdout only


def test_single_process_measures_and_checks_the_sum(single_process, capsys):
    assert commcheck.main(["--sizes-mib", "1", "--iters", "2", "--warmup-iters", "0"]) == commcheck.EXIT_OK
    (line, summary) = json_lines(capsys.readouterr().out)
    assert (line["ranks"], line["size_bytes"], line["dtype"]) == (1, MIB, "bfloat16")
    assert line["algbw_gbps"] > 0
    assert line["busbw_gbps"] == 0.0  # 2(n-1)/n = 0: no data crosses a link with one rank
    assert (summary["passed"], summary["min_busbw_gbps"]) == (None, None)


def test_busbw_below_the_threshold_exits_1_with_one_line(single_process, capsys):
    code = commcheck.main(["--sizes-mib", "1,2", "--iters", "1", "--min-busbw-gbps", "350"])
    assert code == commcheck.EXIT_FAILED
    out, err = capsys.readouterr()
    assert json_lines(out)[-1]["passed"] is False
    assert err.strip().splitlines()[-1] == (
        "commcheck: busbw 0.0 GB/s at 2 MiB is below --min-busbw-gbps 350: check the log for the network "
        "NCCL chose (Socket is TCP, not EFA)"
    )


def test_a_collective_that_loses_a_contribution_fails_the_value_check(single_process, capsys):
    info = init_distributed()

    def all_reduce_losing_element_7(tensor):
        dist.all_reduce(tensor)
        tensor[7] -= 1.0  # as if one rank's contribution to one element had been dropped

    buffer = torch.empty(MIB, dtype=torch.uint8)
    commcheck.run_value_check(buffer, info)  # the real collective passes
    with pytest.raises(commcheck.CommCheckError,
                       match=r"all_reduce of 1048576 bytes returned wrong values on 1 of 1 ranks"):
        commcheck.run_value_check(buffer, info, all_reduce=all_reduce_losing_element_7)
    assert "rank 0: 1 of 262144 float32 elements wrong after all_reduce: expected 1, found e.g. 0.0" in (
        capsys.readouterr().err)


@pytest.mark.parametrize(
    ("argv", "message"),
    [
        (["--sizes-mib", "0"], "argument --sizes-mib: '0': allowed: sizes of 1-65536 MiB"),
        (["--sizes-mib", "64,x"], "argument --sizes-mib: '64,x': allowed: comma-separated whole MiB"),
        (["--iters", "0"], "argument --iters: '0': allowed: an integer >= 1"),
        (["--warmup-iters", "-1"], "argument --warmup-iters: '-1': allowed: an integer >= 0"),
        (["--dtype", "float16"], "argument --dtype: invalid choice: 'float16'"),
        (["--min-busbw-gbps", "0"], "argument --min-busbw-gbps: '0': allowed: a number of GB/s > 0"),
        (["--min-busbw-gbps", "nan"], "argument --min-busbw-gbps: 'nan'"),
    ],
)
def test_bad_arguments_exit_2_naming_the_option(argv, message, capsys):
    with pytest.raises(SystemExit) as exited:
        commcheck.main(argv)
    assert exited.value.code == commcheck.EXIT_USAGE
    assert message in capsys.readouterr().err


def test_bus_bandwidth_is_nccl_tests_formula():
    # 16 ranks (2 p5 nodes), 1 GiB in 4.5 ms: algbw 238.6 GB/s, busbw = algbw * 30/16
    algbw, busbw = commcheck.bus_bandwidth_gbps(1024**3, 4.5e-3, 16)
    assert algbw == pytest.approx(1024**3 / 4.5e-3 / 1e9)
    assert busbw == pytest.approx(algbw * 1.875)
    assert commcheck.bus_bandwidth_gbps(MIB, 1e-3, 1)[1] == 0.0


def test_check_sum_is_n_n_plus_1_over_2_and_stays_exact_in_float32():
    assert [commcheck.expected_check_sum(n) for n in (1, 2, 16, 256)] == [1, 3, 136, 32896]
    assert commcheck.expected_check_sum(257) == 32896 + 1  # values repeat every 256 ranks
    # Every partial sum of up to 65536 ranks is an integer below 2^24, which float32 holds exactly.
    assert commcheck.expected_check_sum(65536) < 2**24


def test_parses_the_options_the_node_launcher_builds():
    # node_bootstrap.jobs turns a commcheck job's key=value overrides into these options.
    argv = node_jobs.build_option_args(
        ("sizes_mib=64,1024", "iters=20", "warmup_iters=5", "dtype=float32", "min_busbw_gbps=350.0"))
    args = commcheck.build_parser().parse_args(argv)
    assert (args.sizes_mib, args.iters, args.warmup_iters, args.dtype, args.min_busbw_gbps) == (
        [64, 1024], 20, 5, "float32", 350.0)
