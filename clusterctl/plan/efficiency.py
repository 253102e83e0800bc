"""The compute efficiency the step model runs the forward and backward at: the fraction of the GPU's dense BF16
peak its kernels reach, before any communication (clusterctl.plan.step_time).

It comes from the chosen MFU (clusterctl.plan.mfu), never from the multi-node runs the plan is checked against
(docs/benchmarks.md, "The plan against published runs"):
- `--mfu` or the 0.40 default: taken as the efficiency as it is.
- a one-GPU measurement (benchmarks/mfu.json): its step also holds work a multi-GPU layout shards or turns into
  collectives the step model counts itself: the fused AdamW step over every parameter and FSDP2's one-rank
  parameter and gradient copies. The profile of the 1b preset on one H100 (docs/benchmarks.md, "One H100",
  bf16, compile, micro-batch 2) puts them at 16.6 ms (AdamW) + 20.0 ms (copies) a step for its 1,498,482,688
  parameters; scaled by parameters, they are taken off the measured step first:
      efficiency = MFU x step / (step - parameters x ONE_GPU_OVERHEAD_S_PER_PARAM)
  e.g. 1b, bf16, compile, micro-batch 2: 0.4155 x 179.9 / (179.9 - 36.6) = 0.52.
  Measured on an H100 only; the plan uses an H100 figure for the H100 and H200 types alone (clusterctl.plan.mfu
  matches the GPU), so the H100's per-parameter time is the one that applies.
"""

from __future__ import annotations

from clusterctl.plan.mfu import MfuChoice
from training.shapes import ModelConfig, count_params

PROFILED_PARAMS = 1_498_482_688  # the 1b preset the profile ran
ONE_GPU_OVERHEAD_S_PER_PARAM = (16.6e-3 + 20.0e-3) / PROFILED_PARAMS  # AdamW + FSDP2's one-rank copies, H100


def one_gpu_overhead_s(params: int) -> float:
    return params * ONE_GPU_OVERHEAD_S_PER_PARAM


def compute_efficiency(choice: MfuChoice, measured_cfg: ModelConfig) -> float:
    """The kernels' fraction of peak without activation checkpointing (the step model adds the recomputation);
    `measured_cfg` is the model the measurement ran (its preset)."""
    measured = choice.measurement
    value = choice.at(False)
    if measured is None:
        return value
    step_s = measured.seq_len * measured.micro_batch_size / measured.tokens_per_s
    overhead_s = one_gpu_overhead_s(count_params(measured_cfg))
    if overhead_s >= step_s / 2:  # a row that cannot be this model's one-GPU step: leave it as measured
        return value
    return value * step_s / (step_s - overhead_s)
