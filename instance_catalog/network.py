"""The network of each instance type, as `clusterctl plan` models it: NVLink inside a node, EFA between nodes.

Each figure is kept with its source; `estimate=True` marks a type whose figures were not published but carried
over from a measured type (the reason is in its `sources`). Standard library only, Python >= 3.9 (the catalog
ships to the nodes).

The model is alpha-beta per ring collective (NCCL's ring: n - 1 steps for an all-gather or reduce-scatter over n
ranks, 2 (n - 1) for an all-reduce):

    time = steps x latency per ring step + bytes x (n - 1) / n / bus bandwidth      (x 2 for an all-reduce)

where the bus bandwidth is the model's large-message limit (beta) for that node count, and the latency per step
is what is left of a published mid-size time after its bytes term, divided by its steps: both solved from two
published sizes at one node count (solve_alpha_beta), so the model passes through the published points.
nccl-tests defines busbw so that it compares across rank counts (awsome-distributed-training
micro-benchmarks/nccl-tests/README.md, "Notes for Algbw & Busbw"): busbw = bytes / time x (n - 1) / n for
all-gather and reduce-scatter, x 2 (n - 1) / n for all-reduce. The bus bandwidth of a mid-size message (32 MB
falling from 131 to 12 GB/s between 2 and 32 p5 nodes) is then the latency term's doing, not a separate table.

Sources read for p5 (2026, checked by the plan's tests against this module):
- EFA_P5_ALL_GATHER: all_gather busbw on p5.48xlarge: 2 GB reaches 329/331/294/265/263 GB/s at 2/4/8/16/32
  nodes; 32 MB 131 GB/s at 2 nodes and 12 GB/s at 32. As quoted in issue 43 from aws-samples/
  awsome-distributed-training micro-benchmarks/nccl-tests/README.md: NOT FOUND there, so the issue's figures,
  not verified. Searched (snapshot commit 7217859, 2026-02-21): the README at each of its 93 commits, the whole
  snapshot for 329/331 in a table, the 22 commits under micro-benchmarks/ whose changes mention all_gather
  (docs/benchmarks.md, "The plan against published runs", lists them).
- EFA_P5_ALL_REDUCE: all_reduce_perf on 2 x p5.48xlarge, same README (verified at commit 7217859, out-of-place
  columns): 8 B to 16 GB; 65-75 us for small messages, 105.52 GB/s busbw at 16 MB, 143.09 at 32 MB, 443.72 at
  2 GB, 487.09 at 16 GB.
- EFA_P4DE_ALL_REDUCE: all_reduce_perf on 2 x p4de.24xlarge, same README (verified at 7217859): 161 us for
  small messages, 26.39 GB/s busbw at 16 MB, 40.85 at 32 MB, 78.33 at 2 GB.
- NVLink: NVIDIA datasheets: A100 SXM 600 GB/s, H100/H200 SXM 900 GB/s, B200 (HGX) 1.8 TB/s of NVLink per GPU,
  both directions together, so half of it each way. nccl-tests inside an NVSwitch node reach about 80% of one
  direction's figure as busbw: NVLINK_BUSBW_FRACTION is that rule of thumb, an estimate for every type (no
  single-node table was read), and so is the NVLink latency per ring step.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

GB = 1e9  # nccl-tests reports GB/s in 1e9 bytes

# (nodes, message bytes, busbw GB/s) of all_gather on p5.48xlarge, as issue 43 quotes the nccl-tests README
EFA_P5_ALL_GATHER = (
    (2, 2 * 2**30, 329.0), (4, 2 * 2**30, 331.0), (8, 2 * 2**30, 294.0), (16, 2 * 2**30, 265.0),
    (32, 2 * 2**30, 263.0), (2, 32 * 2**20, 131.0), (32, 32 * 2**20, 12.0),
)
# (nodes, message bytes, busbw GB/s) of all_reduce on 2 x p5.48xlarge (README table, out-of-place column)
EFA_P5_ALL_REDUCE = ((2, 16 * 2**20, 105.52), (2, 32 * 2**20, 143.09), (2, 2 * 2**30, 443.72))
# ... on 2 x p4de.24xlarge (same README; p4d has the same 4 x 100 Gbps EFA)
EFA_P4DE_ALL_REDUCE = ((2, 16 * 2**20, 26.39), (2, 32 * 2**20, 40.85), (2, 2 * 2**30, 78.33))
NVLINK_BUSBW_FRACTION = 0.8  # estimate: busbw inside an NVSwitch node over one direction's NVLink bandwidth
NVLINK_STEP_LATENCY_US = 3.0  # estimate: one ring step between GPUs of a node (NVLink + kernel launch share)


def ring_steps(kind: str, ranks: int) -> int:
    """NCCL ring steps of one collective over `ranks` ranks."""
    if kind not in ("all_gather", "reduce_scatter", "all_reduce"):
        raise ValueError(f"kind={kind!r}: allowed: all_gather, reduce_scatter, all_reduce")
    return (2 if kind == "all_reduce" else 1) * (ranks - 1)


def bytes_factor(kind: str, ranks: int) -> float:
    """Bytes each rank moves per byte of the message, the factor nccl-tests' busbw divides out."""
    return ring_steps(kind, ranks) / ranks


def _time_s(kind: str, ranks: int, message_bytes: int, busbw_gbps: float) -> float:
    """The time of a published point: nccl-tests' busbw turned back into seconds."""
    return message_bytes * bytes_factor(kind, ranks) / (busbw_gbps * GB)


def solve_alpha_beta(kind: str, ranks: int, small: tuple[int, float], large: tuple[int, float]) -> tuple[float, float]:
    """(seconds per ring step, bus bandwidth in GB/s) that put the model through two published points of one node
    count, (message bytes, busbw) each: the bytes term's slope from their difference, the rest is latency."""
    (small_bytes, small_busbw), (large_bytes, large_busbw) = small, large
    small_s, large_s = _time_s(kind, ranks, small_bytes, small_busbw), _time_s(kind, ranks, large_bytes, large_busbw)
    busbw = (large_bytes - small_bytes) * bytes_factor(kind, ranks) / (large_s - small_s) / GB
    return (small_s - small_bytes * bytes_factor(kind, ranks) / (busbw * GB)) / ring_steps(kind, ranks), busbw


def beta_at(kind: str, ranks: int, point: tuple[int, float], step_latency_s: float) -> float:
    """The bus bandwidth (GB/s) that puts the model through one published point, given the latency per step."""
    message_bytes, busbw = point
    rest_s = _time_s(kind, ranks, message_bytes, busbw) - ring_steps(kind, ranks) * step_latency_s
    return message_bytes * bytes_factor(kind, ranks) / rest_s / GB


def _log_interpolate(points: dict[int, float], nodes: int) -> float:
    """A value at `nodes` between published node counts, linear in log2(nodes); flat beyond the ends."""
    counts = sorted(points)
    if nodes <= counts[0]:
        return points[counts[0]]
    if nodes >= counts[-1]:
        return points[counts[-1]]
    for index in range(len(counts) - 1):  # not zip(..., strict=): Python 3.9 on the nodes
        low, high = counts[index], counts[index + 1]
        if low <= nodes <= high:
            weight = (math.log2(nodes) - math.log2(low)) / (math.log2(high) - math.log2(low))
            return points[low] + weight * (points[high] - points[low])
    raise AssertionError("unreachable")


@dataclass(frozen=True)
class NetworkModel:
    """One instance type's network for the plan: bus bandwidths at large messages and latency per ring step."""

    instance_type: str
    gpus_per_node: int
    nvlink_busbw_gbps: float  # inside a node, any collective (estimate: NVLINK_BUSBW_FRACTION)
    nvlink_step_latency_s: float
    # the model's bus bandwidth (beta) by node count, fitted through the published points with the latency
    efa_all_gather_busbw_gbps: tuple[tuple[int, float], ...]  # (nodes, GB/s); reduce-scatter uses it too
    efa_all_reduce_busbw_gbps: tuple[tuple[int, float], ...]  # (nodes, GB/s)
    efa_step_latency_s: tuple[tuple[int, float], ...]  # (nodes, seconds per ring step over EFA)
    estimate: bool  # True: not published for this type (see sources)
    sources: tuple[str, ...]

    def busbw_gbps(self, kind: str, nodes: int) -> float:
        """Bus bandwidth of a large collective over `nodes` nodes (NVLink when it stays in one node)."""
        if nodes <= 1:
            return self.nvlink_busbw_gbps
        table = self.efa_all_reduce_busbw_gbps if kind == "all_reduce" else self.efa_all_gather_busbw_gbps
        return _log_interpolate(dict(table), nodes)

    def step_latency_s(self, nodes: int) -> float:
        return self.nvlink_step_latency_s if nodes <= 1 else _log_interpolate(dict(self.efa_step_latency_s), nodes)

    def collective_s(self, kind: str, message_bytes: float, ranks: int, nodes: int) -> float:
        """Seconds for one ring collective of `message_bytes` (the whole gathered or reduced tensor) over `ranks`
        ranks on `nodes` nodes: alpha-beta as the module says. 0 for one rank."""
        if ranks <= 1 or message_bytes <= 0:
            return 0.0
        bandwidth_s = message_bytes * bytes_factor(kind, ranks) / (self.busbw_gbps(kind, nodes) * GB)
        return ring_steps(kind, ranks) * self.step_latency_s(nodes) + bandwidth_s

    def modelled_busbw_gbps(self, kind: str, message_bytes: float, nodes: int) -> float:
        """nccl-tests' busbw this model predicts for a message on `nodes` full nodes (to check it against them)."""
        ranks = nodes * self.gpus_per_node
        return message_bytes * bytes_factor(kind, ranks) / self.collective_s(kind, message_bytes, ranks, nodes) / GB


def _fit(kind: str, points: tuple[tuple[int, int, float], ...]) -> tuple[dict[int, float], dict[int, float]]:
    """({nodes: seconds per ring step}, {nodes: bus bandwidth}) through published (nodes, bytes, busbw) points of
    8-GPU nodes: where a node count has two sizes both are solved from them; elsewhere the latency is interpolated
    between those node counts and the bandwidth put through the large-message point."""
    by_nodes: dict[int, dict[int, float]] = {}
    for nodes, size, busbw in points:
        by_nodes.setdefault(nodes, {})[size] = busbw
    latency, bandwidth = {}, {}
    for nodes, sizes in by_nodes.items():
        if len(sizes) >= 2:
            small, large = min(sizes), max(sizes)
            latency[nodes], bandwidth[nodes] = solve_alpha_beta(kind, nodes * 8, (small, sizes[small]),
                                                                (large, sizes[large]))
    for nodes, sizes in by_nodes.items():
        if nodes not in bandwidth:
            large = max(sizes)
            bandwidth[nodes] = beta_at(kind, nodes * 8, (large, sizes[large]), _log_interpolate(latency, nodes))
    return latency, bandwidth


def _p5_like(name: str, nvlink_gbps_both_ways: float, estimate: bool, sources: tuple[str, ...]) -> NetworkModel:
    """A type with p5's EFA (published for p5, carried over to the others) and its own NVLink."""
    latency, gather = _fit("all_gather", EFA_P5_ALL_GATHER)
    _, reduce_2 = _fit("all_reduce", EFA_P5_ALL_REDUCE)
    # all_reduce beyond 2 nodes is not published: it falls as all_gather does (estimate)
    all_reduce = {n: reduce_2[2] * b / gather[2] for n, b in gather.items()}
    return NetworkModel(
        instance_type=name, gpus_per_node=8,
        nvlink_busbw_gbps=nvlink_gbps_both_ways / 2 * NVLINK_BUSBW_FRACTION,
        nvlink_step_latency_s=NVLINK_STEP_LATENCY_US * 1e-6,
        efa_all_gather_busbw_gbps=tuple(sorted(gather.items())),
        efa_all_reduce_busbw_gbps=tuple(sorted(all_reduce.items())),
        efa_step_latency_s=tuple(sorted(latency.items())), estimate=estimate, sources=sources,
    )


def _p4d(name: str) -> NetworkModel:
    """p4d/p4de: 4 x 100 Gbps EFA. The 2-node all_reduce is published; all_gather and more nodes scale p5's
    curve by the ratio of the 2-node all_reduce bandwidths (estimate)."""
    p5 = _p5_like("p5.48xlarge", 900.0, False, ())
    latency, reduce_2 = _fit("all_reduce", EFA_P4DE_ALL_REDUCE)
    scale = reduce_2[2] / dict(p5.efa_all_reduce_busbw_gbps)[2]
    return NetworkModel(
        instance_type=name, gpus_per_node=8,
        nvlink_busbw_gbps=600.0 / 2 * NVLINK_BUSBW_FRACTION, nvlink_step_latency_s=NVLINK_STEP_LATENCY_US * 1e-6,
        efa_all_gather_busbw_gbps=tuple((n, b * scale) for n, b in p5.efa_all_gather_busbw_gbps),
        efa_all_reduce_busbw_gbps=tuple((n, b * scale) for n, b in p5.efa_all_reduce_busbw_gbps),
        efa_step_latency_s=tuple(sorted(latency.items())), estimate=True,
        sources=("EFA_P4DE_ALL_REDUCE (2 x p4de.24xlarge, nccl-tests README): the 2-node all_reduce and the latency "
                 "per step; all_gather and more nodes: p5's curve x the 2-node all_reduce ratio (estimate)",
                 "NVLink: A100 SXM 600 GB/s (NVIDIA datasheet) x NVLINK_BUSBW_FRACTION (estimate)"),
    )


_P5_SOURCES = ("EFA_P5_ALL_GATHER: all_gather busbw at 2 GB by node count and 32 MB at 2 and 32 nodes (issue 43, "
               "quoting the awsome-distributed-training nccl-tests README, where it was not found: unverified)",
               "EFA_P5_ALL_REDUCE: 2 x p5 all_reduce (awsome-distributed-training micro-benchmarks/nccl-tests/"
               "README.md); more nodes: as all_gather falls (estimate)",
               "NVLink: H100 SXM 900 GB/s (NVIDIA datasheet) x NVLINK_BUSBW_FRACTION (estimate)")

NETWORKS: dict[str, NetworkModel] = {
    "p5.48xlarge": _p5_like("p5.48xlarge", 900.0, False, _P5_SOURCES),
    # same 32 x 100 Gbps EFA and NVLink as p5 (EC2 guide); no nccl-tests figures read for it
    "p5e.48xlarge": _p5_like("p5e.48xlarge", 900.0, True, ("p5's figures: the same 32 EFA, 3200 Gbps, and H200's "
                                                           "NVLink equals H100's (estimate)",) + _P5_SOURCES),
    # 16 x 200 Gbps EFAv3, the same 3200 Gbps a node; no nccl-tests figures read for it
    "p5en.48xlarge": _p5_like("p5en.48xlarge", 900.0, True, ("p5's figures: 3200 Gbps a node as p5 (16 x 200 Gbps "
                                                             "EFA); not published here (estimate)",) + _P5_SOURCES),
    # 8 x 400 Gbps EFAv4 (3200 Gbps) and fifth-generation NVLink, 1.8 TB/s per GPU
    "p6-b200.48xlarge": _p5_like("p6-b200.48xlarge", 1800.0, True, (
        "EFA: p5's figures (3200 Gbps a node, 8 x 400 Gbps); NVLink: B200 1.8 TB/s (NVIDIA HGX B200 datasheet) x "
        "NVLINK_BUSBW_FRACTION (estimate)",) + _P5_SOURCES),
    "p4d.24xlarge": _p4d("p4d.24xlarge"),
    "p4de.24xlarge": _p4d("p4de.24xlarge"),
}


def get_network(name: str) -> NetworkModel:
    """The network model of catalog type `name`; KeyError names the types that have one."""
    try:
        return NETWORKS[name]
    except KeyError:
        raise KeyError(f"no network model for {name!r}; allowed: {', '.join(sorted(NETWORKS))}") from None
