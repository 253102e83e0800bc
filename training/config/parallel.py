"""The ``[parallel]`` section: the layout's three degrees, FSDP2's dtypes, what is applied to each block, the
process-group timeouts and the loss's chunking.

No torch here, as in every section: clusterctl checks a job's degrees offline (training.parallel.layout).
"""

from __future__ import annotations

from dataclasses import dataclass

from training.errors import ConfigError

# the dtypes FSDP2's MixedPrecisionPolicy may use (training.parallel.fsdp maps them to torch dtypes)
DTYPE_NAMES = ("bfloat16", "float32")
DEFAULT_INIT_TIMEOUT_S = 600  # process-group timeout until the first step: torch's own NCCL default
SHARD_REST = -1  # dp_shard's default: the ranks that dp_replicate and tp leave over


@dataclass
class ParallelConfig:
    """The ``[parallel]`` section."""

    # The layout (torchtitan's data_parallel_replicate_degree, data_parallel_shard_degree and
    # tensor_parallel_degree): world size = dp_replicate x dp_shard x tp. FSDP is dp_shard = world (the
    # default); HSDP replicates dp_replicate groups of dp_shard ranks (each group holds the whole model, one
    # gradient all-reduce per step across groups); tp splits each block's matmuls over tp GPUs of one node.
    # docs/training.md, "Choosing a layout".
    dp_replicate: int = 1  # replica groups (HSDP when > 1); divides the nodes so a group is whole nodes
    dp_shard: int = SHARD_REST  # ranks a group shards the model over; -1: world / (dp_replicate x tp)
    tp: int = 1  # tensor-parallel degree: ranks of one node that share each sample; 1 = none
    activation_checkpointing: bool = False  # recompute each block's activations in backward (less memory)
    compile: bool = False  # torch.compile each transformer block (Inductor; slow to start on a CPU)
    param_dtype: str = "bfloat16"  # FSDP2 MixedPrecisionPolicy: dtype params are gathered in for compute
    reduce_dtype: str = "float32"  # FSDP2 MixedPrecisionPolicy: dtype of the gradient reduce-scatter
    reshard_after_forward: bool = True  # free gathered block params after forward (ZeRO-3); False keeps them
    # Process-group timeouts: a collective not done in this long aborts the rank (NCCL's watchdog tears the
    # process down, TORCH_NCCL_ASYNC_ERROR_HANDLING=3), so a dead peer ends the job in minutes. The start-up
    # value covers NCCL's communicator set-up, the checkpoint load and compiling, until the first step is done;
    # then the shorter one applies (torchtitan's init/train timeouts). docs/operations.md, "When a node fails".
    init_timeout_seconds: int = DEFAULT_INIT_TIMEOUT_S
    train_timeout_seconds: int = 300
    # The loss: 0 = cross-entropy on the full fp32 logits [tokens, vocab]; N > 0 = the output head fused with
    # the cross-entropy over chunks of N tokens (training.loss), so only one chunk's logits exist at a time:
    # less memory for a larger micro-batch at a large vocabulary. Not yet measured on a GPU (docs/benchmarks.md).
    loss_chunk_tokens: int = 0

    def validate(self) -> None:
        """What needs no world size; the layout against the job's ranks and model is training.parallel.layout's."""
        for name in ("dp_replicate", "tp"):
            value = getattr(self, name)
            if not _is_int(value) or value < 1:
                raise ConfigError(f"parallel.{name}={value!r}: allowed: an integer >= 1")
        if not _is_int(self.dp_shard) or (self.dp_shard < 1 and self.dp_shard != SHARD_REST):
            raise ConfigError(f"parallel.dp_shard={self.dp_shard!r}: allowed: an integer >= 1, or -1 (the ranks "
                              "dp_replicate and tp leave over)")
        for name in ("param_dtype", "reduce_dtype"):
            value = getattr(self, name)
            if value not in DTYPE_NAMES:
                raise ConfigError(f"parallel.{name}={value!r}: allowed: {', '.join(DTYPE_NAMES)}")
        for name in ("init_timeout_seconds", "train_timeout_seconds"):
            value = getattr(self, name)
            if not _is_int(value) or not 1 <= value <= 86400:
                raise ConfigError(f"parallel.{name}={value!r}: allowed: an integer number of seconds, 1..86400")
        if not _is_int(self.loss_chunk_tokens) or self.loss_chunk_tokens < 0:
            raise ConfigError(
                f"parallel.loss_chunk_tokens={self.loss_chunk_tokens!r}: allowed: an integer >= 0 (0 = the loss "
                "on the full logits, N = output head and loss fused over chunks of N tokens)"
            )


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)
