"""Peak memory per GPU of one training step with FSDP2 full sharding, AdamW and bf16 mixed precision: the
arithmetic behind `clusterctl plan`'s "does it fit".

The model follows the trainer as built (training/train.py, training/parallel/): fp32 sharded parameters
with a bf16 MixedPrecisionPolicy, fp32 gradient reduce-scatter, `fully_shard` per transformer block and then
the root (embeddings, final norm, output head), the last block not resharded after forward, optional full
activation checkpointing per block, cross-entropy on the full fp32 logits, `zero_grad(set_to_none=True)`.
The loss is the trainer's default on the full logits (`parallel.loss_chunk_tokens = 0`: 12 B x vocab per token
at its peak). The fused loss (`parallel.loss_chunk_tokens > 0`, training/loss.py) holds about 6 B x vocab per
chunk token plus the output head's gradient instead: less whenever a micro-batch has at least dim + chunk tokens,
so the estimate stays on the safe side there; with fewer tokens per micro-batch it can need more than estimated.

Three kinds of memory, per GPU (G GPUs in the job, P parameters):
- sharded state, divided by G: fp32 parameters (4 B), fp32 gradients (4 B), AdamW's two fp32 moments (8 B):
  16 B x P / G, the ZeRO paper's "mixed-precision Adam, 16 bytes per parameter" at stage 3 (Rajbhandari et
  al. 2020, section 3 and figure 1).
- FSDP2's unsharded working set, not divided by G: parameters all-gathered in bf16 for the block being
  computed and the one being prefetched, and in backward each group's bf16 gradients plus the fp32
  reduce-scatter input FSDP2 copies them into (torch fsdp/_fully_shard/_fsdp_collectives.py foreach_reduce).
- activations: the tensors autograd saves per token, counted for this model's code and checked against
  torch's own memory tracker on the CPU (tests/clusterctl/test_plan_memory_measured.py); with activation
  checkpointing each block keeps only its bf16 input and recomputes the rest in backward.

The step's peak is the largest of four moments (phases below). Around it: a fixed reserve for what PyTorch's
allocator does not see (CUDA context, cuBLAS workspaces, NCCL's buffers) and a margin for the caching
allocator's fragmentation. The figures are for bf16 activations: FP8 linears save some activations in 8
bits (less) and Transformer Engine keeps FP8 weight copies (more); treat FP8 runs as approximate.
"""

from __future__ import annotations

from dataclasses import dataclass

from training.shapes import ModelConfig, count_params

GIB = 2**30
# Not seen by PyTorch's allocator: the CUDA context (~0.5 GiB on an H100), cuBLAS/cuDNN workspaces and
# NCCL's per-channel communication buffers (NCCL_BUFFSIZE, 4 MiB per channel and peer by default), which grow
# with the number of channels and peers. 3 GiB is this project's allowance, not a measured figure.
RUNTIME_RESERVE_GIB = 3.0
# PyTorch's caching allocator reserves more than it hands out (block rounding, fragmentation); keep 5% of the
# GPU free for it. torchtitan's reported memory is the allocator's max reserved, a few percent above max
# allocated.
ALLOCATOR_MARGIN = 0.05

# Bytes per token that autograd keeps for one transformer block of training.model in bf16, as the code saves
# them (SDPA's fused kernels keep q, k, v, the output and a float32 logsumexp per head, never T x T scores):
# 24 x dim: the RMSNorm inputs in fp32 (2 x 4), their bf16 outputs (2 x 2), the attention linears' input,
#   RoPE's fp32 q and its rotated half (2 x 4), the bf16 rotated q and the repeated k and v, the attention
#   output, the feed-forward input;
# 8 x ffn_dim: w1's and w3's outputs, silu(w1 x), and their product (w2's input), bf16;
# 4 x n_heads: SDPA's fp32 logsumexp; 8: the two RMSNorm fp32 reciprocal RMS.
# Fitted term by term to torch's MemTracker on CPU runs of this model (the test above), not assumed.
BLOCK_ACTIVATION_DIM_BYTES = 24
BLOCK_ACTIVATION_FFN_BYTES = 8
BLOCK_ACTIVATION_HEAD_BYTES = 4
BLOCK_ACTIVATION_TOKEN_BYTES = 8
# With activation checkpointing a block keeps only its input: bf16, dim values per token.
CHECKPOINT_DIM_BYTES = 2
# The loss on the full logits (parallel.loss_chunk_tokens = 0, training.loss.cross_entropy_loss): the bf16
# logits (2 x vocab per token) and their fp32 copy exist together while log-softmax runs; the training loop then
# drops the bf16 logits (training.step.forward_backward) and autograd keeps only log-softmax's fp32 output
# (4 x vocab). The peak is the start of backward: that output and the fp32 gradients of log-softmax's output
# and of its input (4 + 4 + 4 x vocab): 12 x vocab bytes per token, plus the final RMSNorm (8 x dim + 4).
# Measured: exactly 12 B per vocab entry and token (tests/clusterctl/test_plan_memory_measured.py).
LOSS_VOCAB_BYTES = 12
LOSS_DIM_BYTES = 8
LOSS_TOKEN_BYTES = 4
# Backward through a block holds a few activation gradients at once: SwiGLU's three [tokens, ffn_dim] bf16
# gradients and two [tokens, dim] ones. An upper bound drawn from the CPU measurements, where the exact
# figure depends on the kernels.
BACKWARD_DIM_BYTES = 4
BACKWARD_FFN_BYTES = 6
# RoPE's cos and sin tables: fp32 [seq_len, head_dim] each, once per micro-batch.
ROPE_BYTES = 8
# The micro-batch's token ids on the GPU: int64 inputs and targets.
TOKEN_ID_BYTES = 2 * 8

# FSDP2 with a bf16 MixedPrecisionPolicy and fp32 reduction.
SHARDED_BYTES_PER_PARAM = {"params": 4, "grads": 4, "optimizer": 8}  # fp32 param, fp32 grad, AdamW m and v
GATHERED_BYTES = 2  # an all-gathered bf16 parameter
UNSHARDED_GRAD_BYTES = 2 + 4  # a bf16 gradient and its fp32 copy in the reduce-scatter input
ADAMW_STEP_TEMP_BYTES = 4  # foreach AdamW's per-parameter fp32 temporaries during optimizer.step()


@dataclass(frozen=True)
class RunShape:
    """What sets the memory of one step, apart from the model."""

    micro_batch_size: int  # samples per GPU per forward/backward
    seq_len: int  # tokens per sample
    grad_accum_steps: int = 1  # > 1 keeps the sharded gradients alive through the forward passes
    activation_checkpointing: bool = False  # full recomputation of every block in backward
    reshard_after_forward: bool = True  # False keeps every block gathered from forward to backward


@dataclass(frozen=True)
class Phase:
    """One moment of the step and what is in memory then (bytes per GPU)."""

    name: str
    parts: tuple[tuple[str, float], ...]  # (what, bytes)

    @property
    def total_bytes(self) -> float:
        return sum(b for _, b in self.parts)


@dataclass(frozen=True)
class MemoryEstimate:
    gpus: int  # GPUs the model is sharded over
    params: int
    phases: tuple[Phase, ...]
    gpu_memory_gib: float  # the GPU's memory (instance catalog)

    @property
    def peak(self) -> Phase:
        return max(self.phases, key=lambda p: p.total_bytes)

    @property
    def peak_bytes(self) -> float:
        return self.peak.total_bytes

    @property
    def usable_bytes(self) -> float:
        return usable_bytes(self.gpu_memory_gib)

    @property
    def fits(self) -> bool:
        return self.peak_bytes <= self.usable_bytes


def usable_bytes(gpu_memory_gib: float) -> float:
    """What a step may allocate on one GPU: its memory less the allocator margin and the runtime reserve."""
    return gpu_memory_gib * GIB * (1 - ALLOCATOR_MARGIN) - RUNTIME_RESERVE_GIB * GIB


@dataclass(frozen=True)
class ModelSizes:
    """Parameter counts of the FSDP2 groups: one per transformer block, and the root."""

    total: int
    root: int  # token embedding + output head + final norm (the root fully_shard group)
    block: int  # one transformer block
    output_head: int  # the output head alone: its gradient exists from the start of backward to the end

    @classmethod
    def of(cls, cfg: ModelConfig) -> ModelSizes:
        total = count_params(cfg)
        root = 2 * cfg.vocab_size * cfg.dim + cfg.dim
        return cls(total=total, root=root, block=(total - root) // cfg.n_layers,
                   output_head=cfg.vocab_size * cfg.dim)


def block_activation_bytes_per_token(cfg: ModelConfig) -> int:
    """Bytes autograd keeps per token for one block without activation checkpointing."""
    return (
        BLOCK_ACTIVATION_DIM_BYTES * cfg.dim
        + BLOCK_ACTIVATION_FFN_BYTES * cfg.ffn_dim
        + BLOCK_ACTIVATION_HEAD_BYTES * cfg.n_heads
        + BLOCK_ACTIVATION_TOKEN_BYTES
    )


def loss_peak_bytes_per_token(cfg: ModelConfig) -> int:
    """The loss on the full logits, at its peak (the start of backward), per token."""
    return LOSS_VOCAB_BYTES * cfg.vocab_size + LOSS_DIM_BYTES * cfg.dim + LOSS_TOKEN_BYTES


def estimate_memory(cfg: ModelConfig, run: RunShape, gpus: int, gpu_memory_gib: float, *, tp: int = 1,
                    replicas: int = 1) -> MemoryEstimate:
    """The per-GPU memory of one training step of `cfg` on `gpus` GPUs, phase by phase: FSDP (the defaults), or a
    layout of `replicas` (HSDP: each replica holds the whole sharded state) x shard x `tp` (tensor parallelism
    with sequence parallelism and a vocabulary-parallel loss: the gathered blocks, the activations and the logits
    are split `tp` ways; the token ids are not)."""
    if gpus < 1 or tp < 1 or replicas < 1 or gpus % (tp * replicas):
        raise ValueError(f"gpus={gpus}, tp={tp}, replicas={replicas}: allowed: gpus >= 1, a multiple of tp x replicas")
    whole = ModelSizes.of(cfg)
    sizes = ModelSizes(total=whole.total // tp, root=whole.root // tp, block=whole.block // tp,
                       output_head=whole.output_head // tp)
    all_tokens = run.micro_batch_size * run.seq_len
    tokens = all_tokens // tp  # one TP rank's share of the micro-batch's activations
    per_gpu = whole.total / (gpus // replicas)
    params = ("sharded fp32 parameters", SHARDED_BYTES_PER_PARAM["params"] * per_gpu)
    grads = ("sharded fp32 gradients", SHARDED_BYTES_PER_PARAM["grads"] * per_gpu)
    optimizer = ("AdamW moments (fp32 m and v)", SHARDED_BYTES_PER_PARAM["optimizer"] * per_gpu)
    block = block_activation_bytes_per_token(cfg)
    saved_per_token = cfg.n_layers * (CHECKPOINT_DIM_BYTES * cfg.dim if run.activation_checkpointing else block)
    saved = (
        f"saved activations: {cfg.n_layers} blocks x "
        + (f"{CHECKPOINT_DIM_BYTES * cfg.dim:,} B (checkpointed inputs)" if run.activation_checkpointing
           else f"{block:,} B")
        + f" x {tokens:,} tokens",
        saved_per_token * tokens,
    )
    # once a block's backward is done its own saved activations are freed (checkpointed inputs: a few bytes)
    saved_after_block = (
        saved
        if run.activation_checkpointing
        else (f"saved activations of the other {cfg.n_layers - 1} blocks",
              (cfg.n_layers - 1) * block * tokens)
    )
    rope = ("RoPE cos/sin tables", ROPE_BYTES * cfg.head_dim * run.seq_len)
    batch = ("token ids (int64 inputs and targets)", TOKEN_ID_BYTES * all_tokens)
    # up to the first reduce-scatter of backward the sharded gradients do not exist (the loop zeroes them with
    # set_to_none), unless gradient accumulation keeps them from the previous micro-batch
    forward_state = [params, optimizer] + ([grads] if run.grad_accum_steps > 1 else [])
    gathered_forward = (
        ("all parameters gathered in bf16 (reshard_after_forward=false)", GATHERED_BYTES * sizes.total)
        if not run.reshard_after_forward
        else ("gathered bf16: the last block (not resharded after forward)", GATHERED_BYTES * sizes.block)
    )
    forward = Phase("forward into the loss", (
        *forward_state,
        gathered_forward,
        saved,
        (f"loss on the full logits: {LOSS_VOCAB_BYTES} B x vocab + final norm, per token",
         loss_peak_bytes_per_token(cfg) * tokens),
        rope,
        batch,
    ))
    # backward through the last block (the first one backward reaches): every block's saved activations are
    # still live (with checkpointing:
    # the inputs, plus the block being recomputed); the root is gathered again and the output head's gradient
    # is held until the root's reduce-scatter at the very end of backward
    recomputed = (
        [(f"recomputed block: {block:,} B x tokens", block * tokens)] if run.activation_checkpointing else []
    )
    gathered_root = ("gathered bf16: the root group", GATHERED_BYTES * sizes.root)
    head_grad = ("output head's bf16 gradient (held until the root's reduce-scatter)",
                 GATHERED_BYTES * sizes.output_head)
    backward_block = Phase("backward through a block", (
        *forward_state,
        gathered_root,
        ("gathered bf16: the block and the one prefetched", 2 * GATHERED_BYTES * sizes.block),
        head_grad,
        ("the block's bf16 weight gradients", GATHERED_BYTES * sizes.block),
        saved,
        *recomputed,
        ("activation gradients in flight",
         (BACKWARD_DIM_BYTES * cfg.dim + BACKWARD_FFN_BYTES * cfg.ffn_dim) * tokens),
        rope,
        batch,
    ))
    # backward through the next block while the previous block's reduce-scatter is still in flight on its own
    # stream: that block's activations are freed, its fp32 reduce-scatter input is not yet (with activation
    # checkpointing, where little is freed, this is the peak)
    backward_overlap = Phase("backward through the next block, a reduce-scatter in flight", (
        params, grads, optimizer,
        gathered_root,
        ("gathered bf16: the block and the one prefetched", 2 * GATHERED_BYTES * sizes.block),
        head_grad,
        ("the block's bf16 weight gradients", GATHERED_BYTES * sizes.block),
        ("the previous block's fp32 reduce-scatter input", (UNSHARDED_GRAD_BYTES - GATHERED_BYTES) * sizes.block),
        saved_after_block,
        *recomputed,
        ("activation gradients in flight",
         (BACKWARD_DIM_BYTES * cfg.dim + BACKWARD_FFN_BYTES * cfg.ffn_dim) * tokens),
        rope,
        batch,
    ))
    # the block's post-backward: its activations are freed, its gradients go into the fp32 reduce-scatter input
    backward_reduce = Phase("a block's reduce-scatter", (
        params, grads, optimizer,
        gathered_root,
        ("gathered bf16: the block prefetched", GATHERED_BYTES * sizes.block),
        head_grad,
        ("the block's bf16 gradients and fp32 reduce-scatter input", UNSHARDED_GRAD_BYTES * sizes.block),
        saved_after_block,
        rope,
        batch,
    ))
    # the end of backward: the root group (embeddings, output head) reduce-scatters its gradients
    backward_root = Phase("root reduce-scatter (end of backward)", (
        params, grads, optimizer,
        ("root's bf16 gradients and fp32 reduce-scatter input", UNSHARDED_GRAD_BYTES * sizes.root),
        batch,
    ))
    step = Phase("optimizer step", (
        params, grads, optimizer,
        ("AdamW foreach temporaries", ADAMW_STEP_TEMP_BYTES * per_gpu),
    ))
    return MemoryEstimate(
        gpus=gpus,
        params=whole.total,
        phases=(forward, backward_block, backward_overlap, backward_reduce, backward_root, step),
        gpu_memory_gib=gpu_memory_gib,
    )


def explain(estimate: MemoryEstimate) -> list[str]:
    """The arithmetic, one line per part, for --explain."""
    lines = []
    for phase in estimate.phases:
        marker = "  <- peak" if phase is estimate.peak else ""
        lines.append(f"  {phase.name}: {phase.total_bytes / GIB:.2f} GiB{marker}")
        lines += [f"    {what}: {amount / GIB:.2f} GiB" for what, amount in phase.parts]
    lines.append(
        f"  usable per GPU: {estimate.gpu_memory_gib:g} GiB x (1 - {ALLOCATOR_MARGIN:g} allocator margin) - "
        f"{RUNTIME_RESERVE_GIB:g} GiB runtime reserve = {estimate.usable_bytes / GIB:.2f} GiB"
    )
    return lines
