"""``python -m training.commcheck``: all_reduce bus bandwidth across every rank of the job, to check before a
costly run that NCCL runs over EFA at full bandwidth.

    torchrun --nnodes 2 --nproc-per-node 8 ... -m training.commcheck --min-busbw-gbps 400
    python -m training.commcheck --sizes-mib 1,4       # one process (gloo on a CPU): a smoke test only

For each message size, ascending: one all_reduce whose result is checked (every rank contributes a known
value, so a collective that loses or corrupts data fails the check), ``--warmup-iters`` untimed calls (NCCL
sets up its channels and buffers), then ``--iters`` timed calls on the same buffer. Timing: CUDA events on
the current stream on a GPU, perf_counter after a barrier on the CPU; each rank's mean time per call is
averaged over the ranks, as nccl-tests does by default (``-a 1``, ``average = 1`` in src/common.cu).

Bandwidth as nccl-tests defines it (NVIDIA/nccl-tests doc/PERFORMANCE.md; AllReduceGetBw in
src/all_reduce.cu): with S the buffer size in bytes on each rank and t the time of one all_reduce,
``algbw = S / t`` and ``busbw = algbw * 2 * (n - 1) / n`` for n ranks, in GB/s of 10^9 bytes. busbw is
comparable with the hardware's per-rank bandwidth whatever the number of ranks; on one rank it is 0 (no
data crosses any link). The project's reference for NCCL over EFA: about 440-480 GB/s between two p5.48xlarge nodes
for 1-16 GiB messages, about 350 GB/s at 4-16 nodes.

Rank 0 prints one JSON line per size on stdout, ``{"event": "allreduce", ...}``, a table on stderr, and
a final ``{"event": "allreduce_summary", ...}`` line. Exit codes: 0 ok; 1 wrong all_reduce values, or busbw
at the largest size below ``--min-busbw-gbps`` (one line on stderr says which); 2 invalid arguments.
"""

from __future__ import annotations

import argparse
import json
import os
import sys
import time
from collections.abc import Callable, Sequence
from dataclasses import asdict, dataclass

import torch
import torch.distributed as dist

from training.errors import ConfigError
from training.parallel.fsdp import DTYPES
from training.parallel.process_group import DistInfo, destroy_distributed, init_distributed

EXIT_OK = 0
EXIT_FAILED = 1
EXIT_USAGE = 2
MIB = 1024**2
GPU_SIZES_MIB = (64, 256, 1024, 4096, 16384)  # nccl-tests' range where p5 reaches its plateau
CPU_SIZES_MIB = (1, 4, 16)  # gloo on a CPU: a smoke test of the path, not a measurement
MAX_SIZE_MIB = 64 * 1024
# The check's values are (rank mod 256) + 1 in float32: every partial sum stays an integer below 2^24, so
# it is exact in any reduction order for up to 65536 ranks.
CHECK_VALUE_PERIOD = 256
CHECK_CHUNK_ELEMENTS = 64 * MIB  # compared per 256 MiB of float32, so the check needs little extra memory


class CommCheckError(RuntimeError):
    """The interconnect failed the check; the message is one line."""


@dataclass(frozen=True)
class AllReduceResult:
    """One size's measurement, as rank 0 prints it (the JSON keys)."""

    size_bytes: int  # the buffer each rank all-reduces (nccl-tests' S)
    dtype: str
    ranks: int
    backend: str  # nccl on a GPU, gloo on a CPU
    time_ms: float  # mean time of one all_reduce, averaged over the ranks
    algbw_gbps: float  # size_bytes / time, in 10^9 bytes/s
    busbw_gbps: float  # algbw * 2 (n - 1) / n


def bus_bandwidth_gbps(size_bytes: int, seconds: float, ranks: int) -> tuple[float, float]:
    """(algbw, busbw) in GB/s of 10^9 bytes for an all_reduce (nccl-tests doc/PERFORMANCE.md)."""
    algbw = size_bytes / seconds / 1e9
    return algbw, algbw * 2 * (ranks - 1) / ranks


def expected_check_sum(ranks: int) -> int:
    """The all_reduce sum of the check values (rank mod 256) + 1 over `ranks` ranks; n(n+1)/2 for n <= 256."""
    full, rest = divmod(ranks, CHECK_VALUE_PERIOD)
    return full * CHECK_VALUE_PERIOD * (CHECK_VALUE_PERIOD + 1) // 2 + rest * (rest + 1) // 2


def run_value_check(
    buffer: torch.Tensor, info: DistInfo, all_reduce: Callable[[torch.Tensor], object] = dist.all_reduce
) -> None:
    """All-reduce `buffer` (raw bytes) seen as float32, filled with this rank's check value, and compare
    every element with the exact sum. float32 whatever --dtype: bfloat16 cannot hold n(n+1)/2 exactly once
    n passes 22. The ranks agree on the outcome, so all of them fail together."""
    values = buffer.view(torch.float32)
    values.fill_(float(info.rank % CHECK_VALUE_PERIOD + 1))
    all_reduce(values)
    expected = float(expected_check_sum(info.world_size))
    wrong, example = 0, None
    for chunk in values.split(CHECK_CHUNK_ELEMENTS):  # a bool mask of 16 GiB / 4 at once would not fit
        mismatch = chunk != expected
        count = int(mismatch.sum().item())
        if count and example is None:
            example = chunk[mismatch][0].item()
        wrong += count
    if wrong:
        print(f"commcheck: rank {info.rank}: {wrong} of {values.numel()} float32 elements wrong after "
              f"all_reduce: expected {expected:.0f}, found e.g. {example}", file=sys.stderr, flush=True)
    bad_ranks = torch.tensor([1.0 if wrong else 0.0], device=buffer.device)
    dist.all_reduce(bad_ranks)
    if bad_ranks.item():
        raise CommCheckError(
            f"all_reduce of {buffer.numel()} bytes returned wrong values on {bad_ranks.item():.0f} of "
            f"{info.world_size} ranks (each rank's stderr has the details): the collective is broken"
        )


def time_allreduce_seconds(buffer: torch.Tensor, iters: int) -> float:
    """This rank's mean seconds per all_reduce of `buffer` over `iters` back-to-back calls."""
    if buffer.is_cuda:
        # The events go on the current stream, which the NCCL stream waits on before each collective and
        # which waits on the NCCL stream after it (a synchronous all_reduce): they bracket all `iters` calls.
        start, end = torch.cuda.Event(enable_timing=True), torch.cuda.Event(enable_timing=True)
        torch.cuda.synchronize()
        start.record()
        for _ in range(iters):
            dist.all_reduce(buffer)
        end.record()
        end.synchronize()
        return start.elapsed_time(end) / 1e3 / iters
    dist.barrier()  # gloo's all_reduce returns when done: wall time after a common start is the time
    started = time.perf_counter()
    for _ in range(iters):
        dist.all_reduce(buffer)
    return (time.perf_counter() - started) / iters


def mean_over_ranks(value: float, info: DistInfo) -> float:
    total = torch.tensor([value], dtype=torch.float64, device=info.device)
    dist.all_reduce(total)
    return float(total.item()) / info.world_size


def measure_allreduce(size_bytes: int, dtype: str, iters: int, warmup_iters: int,
                      info: DistInfo) -> AllReduceResult:
    buffer = torch.empty(size_bytes, dtype=torch.uint8, device=info.device)
    run_value_check(buffer, info)
    data = buffer.view(DTYPES[dtype])
    data.zero_()  # sums of zeros stay zero: repeated in-place all_reduces never overflow
    for _ in range(warmup_iters):
        dist.all_reduce(data)
    seconds = mean_over_ranks(time_allreduce_seconds(data, iters), info)
    algbw, busbw = bus_bandwidth_gbps(size_bytes, seconds, info.world_size)
    return AllReduceResult(size_bytes=size_bytes, dtype=dtype, ranks=info.world_size,
                           backend="nccl" if info.device.type == "cuda" else "gloo",
                           time_ms=seconds * 1e3, algbw_gbps=algbw, busbw_gbps=busbw)


def build_summary(results: Sequence[AllReduceResult], min_busbw_gbps: float | None,
                  nodes: int) -> dict[str, object]:
    """The final line: busbw at the largest size is the figure the threshold judges (the plateau)."""
    largest = max(results, key=lambda r: r.size_bytes)
    return {
        "event": "allreduce_summary",
        "backend": largest.backend,
        "dtype": largest.dtype,
        "ranks": largest.ranks,
        "nodes": nodes,
        "sizes_bytes": [r.size_bytes for r in results],
        "largest_size_bytes": largest.size_bytes,
        "busbw_gbps": largest.busbw_gbps,  # at the largest size
        "peak_busbw_gbps": max(r.busbw_gbps for r in results),
        "min_busbw_gbps": min_busbw_gbps,
        "passed": None if min_busbw_gbps is None else largest.busbw_gbps >= min_busbw_gbps,
    }


def format_size(size_bytes: int) -> str:
    return f"{size_bytes / 1024**3:g} GiB" if size_bytes >= 1024**3 else f"{size_bytes / MIB:g} MiB"


def _sizes(text: str) -> list[int]:
    try:
        sizes = [int(part) for part in text.split(",")]
    except ValueError:
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: comma-separated whole MiB, e.g. 64,1024") from None
    if not all(1 <= s <= MAX_SIZE_MIB for s in sizes):
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: sizes of 1-{MAX_SIZE_MIB} MiB")
    return sorted(set(sizes))


def _at_least(minimum: int) -> Callable[[str], int]:
    def parse(text: str) -> int:
        try:
            value = int(text)
        except ValueError:
            value = minimum - 1
        if value < minimum:
            raise argparse.ArgumentTypeError(f"{text!r}: allowed: an integer >= {minimum}")
        return value
    return parse


def _positive_gbps(text: str) -> float:
    try:
        value = float(text)
    except ValueError:
        value = float("nan")
    if not 0 < value < float("inf"):
        raise argparse.ArgumentTypeError(f"{text!r}: allowed: a number of GB/s > 0, e.g. 350")
    return value


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training.commcheck",
        description="Measure all_reduce bus bandwidth (busbw, as nccl-tests defines it) across every rank of "
        "the job. Run it under torchrun, one process per GPU; rank 0 prints JSON lines on stdout and a table "
        "on stderr.",
        epilog="Reference over EFA: 2 x p5.48xlarge about 440-480 GB/s busbw for 1-16 GiB "
        "messages, about 350 GB/s at 4-16 nodes. Exit codes: 0 ok, 1 wrong all_reduce values or busbw below "
        "--min-busbw-gbps, 2 invalid arguments.",
    )
    parser.add_argument(
        "--sizes-mib", type=_sizes, metavar="N,N,...",
        help="message sizes per rank in MiB, comma-separated (default on a GPU "
        f"{','.join(map(str, GPU_SIZES_MIB))}; on a CPU {','.join(map(str, CPU_SIZES_MIB))})",
    )
    parser.add_argument("--iters", type=_at_least(1), default=20,
                        help="timed all_reduce calls per size (default %(default)s)")
    parser.add_argument("--warmup-iters", type=_at_least(0), default=5,
                        help="untimed all_reduce calls per size before the timed ones (default %(default)s)")
    parser.add_argument("--dtype", choices=tuple(DTYPES), default="bfloat16",
                        help="element type of the timed all_reduce (default %(default)s)")
    parser.add_argument("--min-busbw-gbps", type=_positive_gbps, metavar="GBPS",
                        help="exit 1 when busbw at the largest size is below this (default: no threshold)")
    return parser


def _check_fits(sizes_mib: Sequence[int], info: DistInfo) -> None:
    if info.device.type != "cuda":
        return
    free_bytes, _ = torch.cuda.mem_get_info(info.device)
    if max(sizes_mib) * MIB > free_bytes:
        raise ConfigError(f"--sizes-mib: {max(sizes_mib)} MiB does not fit in the {free_bytes / MIB:.0f} MiB "
                          f"free on {info.device}")


def _nodes(info: DistInfo) -> int:
    """torchrun's LOCAL_WORLD_SIZE is the processes per node; 1 node without torchrun."""
    per_node = int(os.environ.get("LOCAL_WORLD_SIZE", info.world_size))
    return max(1, info.world_size // max(1, per_node))


def run(args: argparse.Namespace, info: DistInfo) -> int:
    sizes_mib = args.sizes_mib or list(GPU_SIZES_MIB if info.device.type == "cuda" else CPU_SIZES_MIB)
    _check_fits(sizes_mib, info)
    if info.is_main:
        print(f"all_reduce over {info.world_size} ranks on {_nodes(info)} nodes "
              f"({'nccl' if info.device.type == 'cuda' else 'gloo'}, {args.dtype}): {args.iters} timed "
              f"calls per size after {args.warmup_iters} warm-up", file=sys.stderr)
        print(f"{'size':>10}  {'time ms':>10}  {'algbw GB/s':>10}  {'busbw GB/s':>10}", file=sys.stderr,
              flush=True)
    results = []
    for size_mib in sizes_mib:
        result = measure_allreduce(size_mib * MIB, args.dtype, args.iters, args.warmup_iters, info)
        results.append(result)
        if info.is_main:
            print(json.dumps({"event": "allreduce", **asdict(result)}), flush=True)
            print(f"{format_size(result.size_bytes):>10}  {result.time_ms:>10.3f}  {result.algbw_gbps:>10.2f}  "
                  f"{result.busbw_gbps:>10.2f}", file=sys.stderr, flush=True)
    summary = build_summary(results, args.min_busbw_gbps, _nodes(info))
    if info.is_main:
        print(json.dumps(summary), flush=True)
    if summary["passed"] is not False:
        return EXIT_OK
    if info.is_main:  # every rank has the same averaged figures, so every rank exits 1
        largest = max(results, key=lambda r: r.size_bytes)
        print(f"commcheck: busbw {largest.busbw_gbps:.1f} GB/s at {format_size(largest.size_bytes)} is below "
              f"--min-busbw-gbps {args.min_busbw_gbps:g}: check the log for the network NCCL chose "
              "(Socket is TCP, not EFA)", file=sys.stderr, flush=True)
    return EXIT_FAILED


def main(argv: Sequence[str] | None = None) -> int:
    args = build_parser().parse_args(argv)  # exits 2 with a message naming the option
    info = init_distributed()
    try:
        return run(args, info)
    except ConfigError as exc:
        print(f"commcheck: {exc}", file=sys.stderr)
        return EXIT_USAGE
    except CommCheckError as exc:
        print(f"commcheck: {exc}", file=sys.stderr)
        return EXIT_FAILED
    finally:
        destroy_distributed()


if __name__ == "__main__":
    sys.exit(main())
