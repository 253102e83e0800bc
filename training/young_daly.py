"""The checkpoint interval that maximizes goodput (Young 1974, Daly 2006): about sqrt(2 x MTBF x save cost).

Saving more often stalls the loop more; saving less often re-runs more steps after each failure. To first order
the interval between saves that loses the least is sqrt(2 x the job's mean time between failures x one save's
stall). The two inputs, both from published or measured figures (no torch: clusterctl plan imports this):

- the job's MTBF: a per-node interruption rate from Llama 3 (Meta, "The Llama 3 Herd of Models", 2024, section
  3.3.4: 419 unexpected interruptions in 54 days of pre-training on 16,384 H100 GPUs = 2,048 nodes of 8), which
  is one per 6,336 node-hours, divided by the job's node count;
- one save's stall: the one measured on a GPU (docs/benchmarks.md, 2026-11-23, one H100: the 1b preset's 16.7
  GiB of fp32 parameters and AdamW moments, an async save to the VM's local disk, blocked the loop 15.4 s,
  median), scaled by the state each GPU holds (12 bytes per parameter over the GPUs: its shard). Measured before
  staging moved beside the loop (training/checkpoint/staging.py), so an upper bound for the local tier until
  the local-tier row of docs/benchmarks.md's next H100 check is run.
"""

from __future__ import annotations

import math

LLAMA3_INTERRUPTIONS = 419
LLAMA3_NODE_HOURS = 54 * 24 * 2048  # 54 days x 2,048 nodes of 8 H100
NODE_MTBF_H = LLAMA3_NODE_HOURS / LLAMA3_INTERRUPTIONS  # ~6,336 hours between interruptions of one node
MEASURED_STALL_S = 15.4  # the 1b preset's async save on one H100 blocked the loop this long (median)
MEASURED_STATE_BYTES = 16.7 * 2**30  # the state it saved, on that one GPU
STATE_BYTES_PER_PARAM = 12  # fp32 parameter + AdamW's two fp32 moments
FAR_FACTOR = 3.0  # an interval more than 3x from the optimum, or under a third of it, is worth changing


def job_mtbf_s(nodes: int) -> float:
    """The job's mean time between interruptions: any one of its nodes, at Llama 3's per-node rate."""
    return NODE_MTBF_H * 3600 / max(1, nodes)


def save_stall_s(params: int, gpus: int) -> float:
    """One save's stall of the loop: the measured one, scaled by each GPU's shard of the state."""
    return MEASURED_STALL_S * (params * STATE_BYTES_PER_PARAM / max(1, gpus)) / MEASURED_STATE_BYTES


def optimal_interval_s(nodes: int, stall_s: float) -> float:
    """Young/Daly's first-order optimum: sqrt(2 x MTBF x save cost), in seconds."""
    return math.sqrt(2 * job_mtbf_s(nodes) * stall_s)


def optimal_interval_steps(nodes: int, stall_s: float, step_s: float) -> int:
    return max(1, round(optimal_interval_s(nodes, stall_s) / step_s))


def is_far(interval_steps: int, optimal_steps: int) -> bool:
    """More than FAR_FACTOR x the optimum or under 1/FAR_FACTOR of it."""
    return interval_steps > FAR_FACTOR * optimal_steps or interval_steps * FAR_FACTOR < optimal_steps


def interval_line(nodes: int, params: int, gpus: int, step_s: float) -> str:
    """What `clusterctl plan` prints for the run it plans; `gpus`: those one copy of the state is sharded over."""
    stall = save_stall_s(params, gpus)
    steps = optimal_interval_steps(nodes, stall, step_s)
    return (f"local checkpoint interval for goodput (Young/Daly, sqrt(2 x MTBF x save)): every {steps:,} steps "
            f"({optimal_interval_s(nodes, stall) / 60:,.1f} min) at {nodes} nodes: MTBF "
            f"{job_mtbf_s(nodes) / 3600:,.1f} h (Llama 3: 419 interruptions in 54 days on 2,048 nodes), save stall "
            f"{stall:.2f} s (the 1b save measured on an H100, 15.4 s for 16.7 GiB, scaled to "
            f"{params * STATE_BYTES_PER_PARAM / gpus / 2**30:.2f} GiB per GPU); --set "
            f"checkpoint.local_interval_steps={steps}")


class IntervalCheck:
    """The trainer's start-up check of its local checkpoint interval: once the step after the first (which
    compiles) gives the step time, one line when the interval is far (is_far) from Young/Daly's optimum for
    this run, None otherwise; nothing without a local tier. `nodes`: WORLD_SIZE / LOCAL_WORLD_SIZE; `gpus`:
    those one copy of the state is sharded over; `params`: the whole model's."""

    def __init__(self, interval_steps: int, *, nodes: int, params: int, gpus: int, start_step: int) -> None:
        self.interval_steps, self.nodes, self.params, self.gpus = interval_steps, nodes, params, gpus
        self.start_step = start_step
        self._first_done_s: float | None = None  # when the first step of this start ended (time.perf_counter)

    def step_done(self, done: int, now_s: float) -> str | None:
        """After step `done` ended at `now_s` (seconds, any monotonic clock): the line, once, after the second."""
        if self.interval_steps <= 0:
            return None
        if done == self.start_step + 1:
            self._first_done_s = now_s
            return None
        if done != self.start_step + 2 or self._first_done_s is None:
            return None
        return self.advice(step_s=now_s - self._first_done_s)

    def advice(self, step_s: float) -> str | None:
        if step_s <= 0:
            return None
        stall = save_stall_s(self.params, self.gpus)
        optimal = optimal_interval_steps(self.nodes, stall, step_s)
        if not is_far(self.interval_steps, optimal):
            return None
        side = f"more than {FAR_FACTOR:g}x" if self.interval_steps > optimal else f"under 1/{FAR_FACTOR:g} of"
        return (f"checkpoint.local_interval_steps={self.interval_steps} is {side} Young/Daly's "
                f"optimum for this run, every {optimal:,} steps (sqrt(2 x MTBF x save): MTBF "
                f"{job_mtbf_s(self.nodes) / 3600:,.1f} h at {self.nodes} nodes at Llama 3's interruption rate, save "
                f"stall {stall:.2f} s estimated, step {step_s:.3g} s measured); --set "
                f"checkpoint.local_interval_steps={optimal}")
