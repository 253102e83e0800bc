"""The training configuration's sections: one dataclass per TOML table, with its fields documented where they
are declared and its own validation. training.config loads and combines them; each part of the package gets
only its own section (training.checkpoint the [checkpoint] one, training.fp8 the [fp8] one, ...), which those
modules re-export.

This module imports neither torch nor numpy: clusterctl validates a job's config and `--set` items with the
trainer's own code (training.config.load_config) on a machine without torch, before anything is sent.
"""

from __future__ import annotations

import math
from dataclasses import dataclass, fields

from training.errors import ConfigError

# [data]: where batches come from
SOURCES = ("synthetic", "shards")
# [fp8]
BACKENDS = ("none", "torchao", "te")
TORCHAO_RECIPES = ("tensorwise", "rowwise")
TE_RECIPES = ("delayed", "current")
ROPE_SCALINGS = ("", "llama3")  # [model] rope_scaling
# [optim]: the learning-rate schedule after warmup (training/config/schedule.py lr_at)
LR_SCHEDULES = ("cosine", "wsd")
# [checkpoint]: where an asynchronous save copies the state (training/checkpoint/staging.py)
STAGING_MODES = ("auto", "pinned", "pageable", "inline")
JOB_ID_ENV = "CLUSTER_JOB_ID"  # set by node_bootstrap.jobs' supervisor for every job


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


# Shape presets. Sources: Meta's params.json / Hugging Face config.json of the released checkpoints
# (meta-llama/Llama-3.2-1B: hidden 2048, 16 layers, 32 heads, 8 kv heads, intermediate 8192, vocab 128256,
# rope_theta 500000, rms_norm_eps 1e-5; Meta-Llama-3-8B: 4096, 32, 32, 8, 14336; Meta-Llama-3-70B: 8192, 80,
# 64, 8, 28672), and torchtitan's models/llama3/__init__.py (llama3_configs "8B" and "70B": dim 4096/8192,
# n_layers 32/80, n_heads 32/64, n_kv_heads 8, ffn_dim_multiplier 1.3, multiple_of 1024/4096, theta 500000,
# which gives the same hidden sizes 14336 and 28672). The released 1B ties its input and output
# embeddings; here they stay separate (as in torchtitan) so the meta-device build, FSDP2 and the FP8 filter
# need no special case: the "1b" preset has 1.50B parameters instead of 1.24B, with the same blocks.
# "125m" is GPT-2-small's width and depth (768 x 12 layers, 12 heads) in Llama form, with 4 kv heads and a
# 32000 vocabulary (the Llama-2 tokenizer size): 124.7M parameters, 100M of them outside the embedding.
MODEL_PRESETS: dict[str, dict[str, int | float]] = {
    # trains on a laptop CPU in seconds; vocab 320 holds the byte-level tokenizer's 257 ids (256 bytes and the
    # end-of-document token), rounded up to a multiple of 64
    "tiny": dict(
        dim=64, n_layers=2, n_heads=4, n_kv_heads=2, ffn_dim=192, vocab_size=320, rope_theta=10000.0
    ),
    "125m": dict(
        dim=768, n_layers=12, n_heads=12, n_kv_heads=4, ffn_dim=2048, vocab_size=32000, rope_theta=10000.0
    ),
    "1b": dict(
        dim=2048, n_layers=16, n_heads=32, n_kv_heads=8, ffn_dim=8192, vocab_size=128256, rope_theta=500000.0
    ),
    "llama3-8b": dict(
        dim=4096, n_layers=32, n_heads=32, n_kv_heads=8, ffn_dim=14336, vocab_size=128256, rope_theta=500000.0
    ),
    "llama3-70b": dict(
        dim=8192, n_layers=80, n_heads=64, n_kv_heads=8, ffn_dim=28672, vocab_size=128256, rope_theta=500000.0
    ),
}


@dataclass
class ModelConfig:
    """The ``[model]`` section. With ``preset`` set, the preset's shape fills every shape field the file or
    ``--set`` does not give (resolved by training.config.load_config)."""

    preset: str = ""  # name in MODEL_PRESETS ("tiny", "125m", "1b", "llama3-8b", "llama3-70b"); "" = custom
    dim: int = 64  # model (residual stream) width
    n_layers: int = 2  # transformer blocks
    n_heads: int = 4  # query heads; head_dim = dim / n_heads
    n_kv_heads: int = 2  # key/value heads (grouped-query attention); divides n_heads
    ffn_dim: int = 192  # SwiGLU hidden width
    vocab_size: int = 256  # tokens in the vocabulary (the embedding and output head rows)
    rope_theta: float = 10000.0  # RoPE base frequency
    norm_eps: float = 1e-5  # RMSNorm epsilon
    init_std: float = 0.02  # std of the normal init of the linear layers (torchtitan's default)
    # The output head shares the token embedding's weight (Hugging Face's tie_word_embeddings: Llama 3.2 1B/3B)
    tie_embeddings: bool = False
    # RoPE frequency scaling: "" (none) or "llama3" (Llama 3.1 and later: low frequencies divided by
    # rope_scaling_factor, high ones kept, a smooth blend between; transformers' _compute_llama3_parameters)
    rope_scaling: str = ""
    rope_scaling_factor: float = 8.0
    rope_low_freq_factor: float = 1.0
    rope_high_freq_factor: float = 4.0
    rope_original_max_positions: int = 8192  # the context length the model was pre-trained at

    @property
    def head_dim(self) -> int:
        return self.dim // self.n_heads

    def validate(self) -> None:
        if self.preset and self.preset not in MODEL_PRESETS:
            raise ConfigError(
                f"model.preset={self.preset!r}: allowed: {', '.join(MODEL_PRESETS)} or '' (custom)"
            )
        for name in ("dim", "n_layers", "n_heads", "n_kv_heads", "ffn_dim", "vocab_size"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"model.{name}={value!r}: allowed: an integer >= 1")
        if self.dim % self.n_heads:
            raise ConfigError(f"model.n_heads={self.n_heads!r}: allowed: a divisor of model.dim ({self.dim})")
        if self.head_dim % 2:
            raise ConfigError(
                f"model.n_heads={self.n_heads!r}: allowed: a value giving an even head_dim (dim / n_heads = "
                f"{self.head_dim}); RoPE rotates pairs of channels"
            )
        if self.n_heads % self.n_kv_heads:
            raise ConfigError(
                f"model.n_kv_heads={self.n_kv_heads!r}: allowed: a divisor of model.n_heads ({self.n_heads})"
            )
        for name in ("rope_theta", "norm_eps", "init_std"):
            value = getattr(self, name)
            if (
                isinstance(value, bool)
                or not isinstance(value, int | float)
                or not (math.isfinite(value) and value > 0)
            ):
                raise ConfigError(f"model.{name}={value!r}: allowed: a finite number > 0")
        if not isinstance(self.tie_embeddings, bool):
            raise ConfigError(f"model.tie_embeddings={self.tie_embeddings!r}: allowed: true, false")
        if self.rope_scaling not in ROPE_SCALINGS:
            raise ConfigError(f"model.rope_scaling={self.rope_scaling!r}: allowed: '' (none), 'llama3'")
        for name in ("rope_scaling_factor", "rope_low_freq_factor", "rope_high_freq_factor"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int | float) or not (
                    math.isfinite(value) and value > 0):
                raise ConfigError(f"model.{name}={value!r}: allowed: a finite number > 0")
        if self.rope_high_freq_factor <= self.rope_low_freq_factor:
            raise ConfigError(f"model.rope_high_freq_factor={self.rope_high_freq_factor!r}: allowed: a number > "
                              f"model.rope_low_freq_factor ({self.rope_low_freq_factor})")
        if not _is_int(self.rope_original_max_positions) or self.rope_original_max_positions < 1:
            raise ConfigError(f"model.rope_original_max_positions={self.rope_original_max_positions!r}: allowed: "
                              "an integer >= 1")


SHAPE_FIELDS = tuple(f.name for f in fields(ModelConfig) if f.name != "preset")

@dataclass
class Fp8Config:
    """The ``[fp8]`` section."""

    backend: str = "none"  # none (bf16 matmuls) | torchao (torchao.float8) | te (Transformer Engine >= 2.16)
    torchao_recipe: str = (
        "tensorwise"  # torchao scaling: tensorwise | rowwise (per-row scales, more accurate)
    )
    te_recipe: str = (
        "delayed"  # TE scaling: delayed (DelayedScaling, amax history) | current (Float8CurrentScaling)
    )
    te_amax_history_len: int = 1024  # steps of amax history for te_recipe = delayed (TE's default)
    emulate: bool = False  # torchao only: FP8 casts with high-precision matmuls (CPU tests, GPUs without FP8)
    fsdp_float8_all_gather: bool = (
        True  # torchao tensorwise: FSDP2 all-gathers weights in FP8 (half the bytes)
    )

    def validate(self) -> None:
        if self.backend not in BACKENDS:
            raise ConfigError(f"fp8.backend={self.backend!r}: allowed: {', '.join(BACKENDS)}")
        if self.torchao_recipe not in TORCHAO_RECIPES:
            raise ConfigError(
                f"fp8.torchao_recipe={self.torchao_recipe!r}: allowed: {', '.join(TORCHAO_RECIPES)}"
            )
        if self.te_recipe not in TE_RECIPES:
            raise ConfigError(f"fp8.te_recipe={self.te_recipe!r}: allowed: {', '.join(TE_RECIPES)}")
        if (
            isinstance(self.te_amax_history_len, bool)
            or not isinstance(self.te_amax_history_len, int)
            or (self.te_amax_history_len < 1)
        ):
            raise ConfigError(
                f"fp8.te_amax_history_len={self.te_amax_history_len!r}: allowed: an integer >= 1"
            )
        if self.emulate and self.backend == "te":
            raise ConfigError("fp8.emulate=True: allowed only with fp8.backend='torchao' (TE cannot emulate)")

@dataclass
class DataConfig:
    """The ``[data]`` section."""

    source: str = "synthetic"  # "synthetic" (a learnable Markov chain, no files) or "shards" (data.path)
    path: str = ""  # shard directory holding index.json (docs/data-format.md); used when source = "shards"
    synthetic_branching: int = (
        4  # successors per token in the synthetic Markov chain (loss floor <= ln of it)
    )
    prefetch_depth_steps: int = 2  # optimizer steps of micro-batches prepared ahead by the loader thread
    pin_memory: bool = True  # stage batches in pinned host memory (only when the device is CUDA)
    numa_affinity: bool = True  # keep the loader thread on the CPUs of its GPU's NUMA node (multi-socket)

    def validate(self) -> None:
        if self.source not in SOURCES:
            raise ConfigError(f"data.source={self.source!r}: allowed: {', '.join(SOURCES)}")
        if self.source == "shards" and not self.path:
            raise ConfigError(
                "data.path='': allowed: a shard directory (with index.json) when data.source='shards'"
            )
        if self.source == "synthetic" and self.path:
            # a path the run would never read: training on made-up tokens while the user thinks it reads theirs
            raise ConfigError(f"data.path={self.path!r}: not read with data.source='synthetic'; allowed: "
                              "data.source='shards' with it, or no data.path for synthetic data")
        if not _is_int(self.synthetic_branching) or not 1 <= self.synthetic_branching <= 1024:
            raise ConfigError(
                f"data.synthetic_branching={self.synthetic_branching!r}: allowed: an integer in 1..1024"
            )
        if not _is_int(self.prefetch_depth_steps) or self.prefetch_depth_steps < 1:
            raise ConfigError(
                f"data.prefetch_depth_steps={self.prefetch_depth_steps!r}: allowed: an integer >= 1"
            )
        for name in ("pin_memory", "numa_affinity"):
            if not isinstance(getattr(self, name), bool):
                raise ConfigError(f"data.{name}={getattr(self, name)!r}: allowed: true, false")

@dataclass
class ValidationConfig:
    """The ``[validation]`` section: a held-out loss (training/validation.py). Off while ``path`` is ""."""

    path: str = ""  # held-out shard directory (index.json, docs/data-format.md); "" = no validation
    # Evaluate after every this many optimizer steps and after the last one; required (>= 1) with a path.
    interval_steps: int = 0
    # Held-out windows of run.seq_len + 1 tokens in the whole set, the same ones at every evaluation and whatever
    # the layout or the number of ranks (split over the data-parallel ranks, each window scored once); with a
    # path, this or batches (>= 1).
    windows: int = 0
    # The older spelling: batches x run.micro_batch_size windows (what one rank scored while the set grew with
    # the ranks); set windows or batches, not both.
    batches: int = 0
    # Evaluate once before the first step of a fresh start (not on a resume), logged as step 0: the baseline a
    # fine-tune is compared against (an imported model's own held-out loss). false where an evaluation is costly.
    at_start: bool = True

    @property
    def enabled(self) -> bool:
        return bool(self.path)

    def num_windows(self, micro_batch_size: int) -> int:
        """The held-out set's size in windows: ``windows``, or ``batches`` x ``micro_batch_size``."""
        return self.windows or self.batches * micro_batch_size

    def validate(self) -> None:
        if not isinstance(self.path, str):
            raise ConfigError(f"validation.path={self.path!r}: allowed: a shard directory, or '' for none")
        for name in ("interval_steps", "windows", "batches"):
            value = getattr(self, name)
            required = self.enabled and name == "interval_steps"  # windows and batches: one of them, below
            if not _is_int_at_least(value, minimum=1 if required else 0):
                or_zero = "" if name == "interval_steps" else ", or 0"
                raise ConfigError(f"validation.{name}={value!r}: allowed: an integer >= 1 (with validation.path "
                                  f"set){or_zero}")
            if not self.enabled and value:
                raise ConfigError(f"validation.path='': allowed: a held-out shard directory (with index.json) "
                                  f"when validation.{name} is set ({value!r})")
        if self.enabled and bool(self.windows) == bool(self.batches):
            raise ConfigError(f"validation.windows={self.windows!r}, validation.batches={self.batches!r}: allowed: "
                              "one of them >= 1 (with validation.path set), the other 0")
        if not isinstance(self.at_start, bool):
            raise ConfigError(f"validation.at_start={self.at_start!r}: allowed: true, false")

@dataclass
class OptimConfig:
    """The ``[optim]`` section."""

    lr: float = 3e-4  # peak learning rate, reached at the end of warmup
    min_lr: float = 3e-5  # floor the decay reaches at its last step (absolute, not a ratio)
    warmup_steps: int = 100  # optimizer steps of linear warmup from lr/warmup_steps up to lr
    # After warmup: "cosine" decays from lr to min_lr right away; "wsd" (warmup-stable-decay, torchtitan's
    # warmup_stable_decay) holds lr, then decays linearly to min_lr over the run's last decay steps, so a run
    # still in its stable phase can be made longer (a larger run.steps) without changing a step that ran.
    schedule: str = "cosine"
    # Length of the decay in optimizer steps, fixed whatever run.steps says (steps after it stay at min_lr).
    # 0: cosine decays until the last step (run.steps - warmup_steps), wsd over decay_fraction of run.steps.
    # Extending a cosine run: set it to the old run.steps - warmup_steps and the decay that ran stays as it was.
    decay_steps: int = 0
    decay_fraction: float = 0.2  # wsd with decay_steps 0: the share of run.steps spent decaying, in (0, 1]
    weight_decay: float = 0.1  # AdamW decoupled weight decay on matrices (norms and biases get none)
    betas: tuple[float, float] = (0.9, 0.95)  # AdamW (beta1, beta2)
    eps: float = 1e-8  # AdamW epsilon
    max_grad_norm: float = 1.0  # clip the global L2 gradient norm to this; 0 disables clipping

    def validate(self) -> None:
        if not (math.isfinite(self.lr) and self.lr > 0):
            raise ConfigError(f"optim.lr={self.lr!r}: allowed: a finite number > 0")
        if not (math.isfinite(self.min_lr) and 0 <= self.min_lr <= self.lr):
            raise ConfigError(f"optim.min_lr={self.min_lr!r}: allowed: 0 <= min_lr <= optim.lr ({self.lr})")
        if isinstance(self.warmup_steps, bool) or not isinstance(self.warmup_steps, int) or (
            self.warmup_steps < 0
        ):
            raise ConfigError(f"optim.warmup_steps={self.warmup_steps!r}: allowed: an integer >= 0")
        if self.schedule not in LR_SCHEDULES:
            raise ConfigError(f"optim.schedule={self.schedule!r}: allowed: {', '.join(LR_SCHEDULES)}")
        if not _is_int(self.decay_steps) or self.decay_steps < 0:
            raise ConfigError(f"optim.decay_steps={self.decay_steps!r}: allowed: an integer >= 0 (0: until the "
                              "run's last step)")
        if isinstance(self.decay_fraction, bool) or not isinstance(self.decay_fraction, int | float) or not (
                0 < self.decay_fraction <= 1):
            raise ConfigError(f"optim.decay_fraction={self.decay_fraction!r}: allowed: a number in (0, 1]")
        if not (math.isfinite(self.weight_decay) and self.weight_decay >= 0):
            raise ConfigError(f"optim.weight_decay={self.weight_decay!r}: allowed: a number >= 0")
        betas = tuple(self.betas)
        if len(betas) != 2 or not all(isinstance(b, int | float) and 0 <= b < 1 for b in betas):
            raise ConfigError(f"optim.betas={self.betas!r}: allowed: two numbers in [0, 1), e.g. [0.9, 0.95]")
        self.betas = (float(betas[0]), float(betas[1]))
        if not (math.isfinite(self.eps) and self.eps > 0):
            raise ConfigError(f"optim.eps={self.eps!r}: allowed: a number > 0")
        if not (math.isfinite(self.max_grad_norm) and self.max_grad_norm >= 0):
            raise ConfigError(f"optim.max_grad_norm={self.max_grad_norm!r}: allowed: a number >= 0 (0 = off)")

    def decay_window(self, total_steps: int) -> tuple[int, int]:
        """``(first step, length in steps)`` of the decay from lr to min_lr in a run of ``total_steps`` steps
        (0-based step indices; training.config.schedule.lr_at)."""
        if self.schedule == "wsd":
            length = self.decay_steps or max(1, round(self.decay_fraction * total_steps))
            return max(self.warmup_steps, total_steps - length), length
        return self.warmup_steps, self.decay_steps or max(1, total_steps - self.warmup_steps)

@dataclass
class CheckpointConfig:
    """The ``[checkpoint]`` section."""

    dir: str = ""  # checkpoint root; saves go to <dir>/step-<N>/. "" = no saves (--resume PATH still works)
    interval_steps: int = 0  # save every this many optimizer steps; 0 = only at the end and on SIGTERM
    keep_last: int = 3  # complete checkpoints kept; older ones are deleted after a newer one completes
    async_save: bool = True  # periodic saves with dcp.async_save (training continues while it writes)
    save_final: bool = True  # save after the last step
    # How an async save copies the state to CPU memory. "auto": on a staging thread beside the loop (which
    # waits for it only before its next optimizer step), into CPU buffers kept across saves, pinned where the
    # device is CUDA; "pinned" / "pageable" force that choice ("pinned" needs CUDA); "inline": inside the
    # save call, into new pageable memory each time (DCP's default, the loop waits for the whole copy). The
    # kept buffers hold one copy of this rank's model and optimizer state in host memory for the whole run.
    staging: str = "auto"
    # The local tier (training/checkpoint/local_tier.py): every local_interval_steps (0 = off) each rank saves
    # its own shard under local_dir (node-local: the launcher sets <scratch>/checkpoints/<job id>) and sends a
    # replica to the same local rank of the next node, so that losing one node loses no shard of that step.
    # The newest local_keep steps complete on every rank are kept.
    local_dir: str = ""
    local_interval_steps: int = 0
    local_keep: int = 2

    def validate(self) -> None:
        if self.staging not in STAGING_MODES:
            raise ConfigError(f"checkpoint.staging={self.staging!r}: allowed: {', '.join(STAGING_MODES)}")
        if not isinstance(self.dir, str):
            raise ConfigError(f"checkpoint.dir={self.dir!r}: allowed: a directory path, or '' for none")
        if not _is_int_at_least(self.interval_steps, minimum=0):
            raise ConfigError(f"checkpoint.interval_steps={self.interval_steps!r}: allowed: an integer >= 0")
        if not _is_int_at_least(self.keep_last, minimum=1):
            raise ConfigError(f"checkpoint.keep_last={self.keep_last!r}: allowed: an integer >= 1")
        if not isinstance(self.local_dir, str):
            raise ConfigError(f"checkpoint.local_dir={self.local_dir!r}: allowed: a node-local directory path, or "
                              "'' for no local tier")
        if not _is_int_at_least(self.local_interval_steps, minimum=0):
            raise ConfigError(f"checkpoint.local_interval_steps={self.local_interval_steps!r}: allowed: an integer "
                              ">= 0 (0: no local tier)")
        if not _is_int_at_least(self.local_keep, minimum=1) or self.local_keep > 8:
            raise ConfigError(f"checkpoint.local_keep={self.local_keep!r}: allowed: an integer 1-8")

    @property
    def local_tier(self) -> bool:
        """Whether this run saves to the local tier (both a directory and an interval are set)."""
        return bool(self.local_dir) and self.local_interval_steps > 0


def _is_int_at_least(value: object, *, minimum: int) -> bool:
    return isinstance(value, int) and not isinstance(value, bool) and value >= minimum
