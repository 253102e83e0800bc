"""The time of one training step under a layout: compute, plus the communication that compute cannot hide.

Per micro-batch on one GPU (every GPU does the same work; the layout is clusterctl.plan.layouts.Layout):
- compute: the micro-batch's model FLOPs (training.shapes.flops_per_token) times the recomputation factor
  (full activation checkpointing redoes each block's forward: + 1/3; torchtitan's selective "op" checkpointing
  redoes every second matmul of the forward: + the blocks' parameters x 1 FLOP per token), split over the TP
  group, at the GPU's dense BF16 peak x the compute efficiency (clusterctl.plan.efficiency).
- FSDP, per block, over the shard group: the forward's all-gather of the block's bf16 parameters (1 byte for
  the Float8 linears' weights with torchao's FP8 all-gather: block_gather_bytes) against the previous block's
  forward (FSDP2 prefetches one block ahead); in backward the all-gather again
  (reshard_after_forward) and the fp32 gradient reduce-scatter against the block's backward. What exceeds the
  compute it overlaps is exposed. The first block's all-gather and the last reduce-scatter have nothing to hide
  behind, and neither do the root group's (embeddings, final norm, output head; one embedding matrix when they
  are tied): all exposed. The trainer reduce-scatters after every micro-batch, so this repeats per micro-batch.
- HSDP: each block's gradient shard is all-reduced across the replicas after its reduce-scatter, in the same
  backward window (FSDP2's HSDP), so it competes with the reduce-scatter for the block's backward time; the
  last block's and the root group's all-reduces come after the last compute: exposed.
- TP with sequence parallelism, on NVLink, not hidden: per block, the forward's two all-gathers and two
  reduce-scatters of the micro-batch's activations (attention and MLP; each of tokens x dim x 2 bytes gathered,
  a tp-th of it per rank), the same four in backward, and four more when activation checkpointing recomputes
  the forward; outside the blocks, the embedding's output reduce-scatter and the output head's input all-gather
  (training/parallel/tp.py), each once forward and once backward.
Collective times are the instance type's network model (instance_catalog.network: alpha-beta from nccl-tests).
Groups that share a node's NICs (a shard group with fewer ranks on a node than the node has GPUs runs beside the
node's other groups) get the node's bus bandwidth in proportion to their ranks on it.

Left out (docs/benchmarks.md says what each would change): the optimizer step on each rank's shard (about 11 ms
per billion parameters per GPU on an H100), the loss, kernel launch gaps, smaller GEMMs' lower efficiency under
TP, stragglers, collectives slowing compute they overlap (SM and memory contention), NCCL's low-latency protocols
for small messages, asynchronous TP (torchtitan's 876 against 829 tokens/s/GPU), torchao's Float8 TP styles
all-gathering activations in FP8, and FP8 all-gather's one all-reduce of the weights' scales per step.
"""

from __future__ import annotations

from dataclasses import dataclass

from clusterctl.plan.layouts import Layout
from instance_catalog.instance_types import InstanceType
from instance_catalog.network import NetworkModel, ring_steps
from training.shapes import ModelConfig, count_params, flops_per_token

FULL_RECOMPUTE = "full"
SELECTIVE_OP_RECOMPUTE = "selective-op"  # torchtitan's activation_checkpoint mode "selective", option "op"
NO_RECOMPUTE = "none"
PARAM_GATHER_BYTES = 2  # bf16 parameters all-gathered (MixedPrecisionPolicy param_dtype)
FP8_GATHER_BYTES = 1  # a Float8 linear's weight under FP8 all-gather: cast to float8 on its shard, then gathered
FP8_DIM_MULTIPLE = 16  # training.fp8.FP8_DIM_MULTIPLE: linears with other dimensions stay bf16 (not imported: torch)
GRAD_REDUCE_BYTES = 4  # fp32 gradient reduction (reduce_dtype), as the trainer and torchtitan run it
ACTIVATION_BYTES = 2  # bf16 activations between TP ranks
TP_COLLECTIVES_PER_BLOCK = 4  # with sequence parallelism: AG + RS around attention, AG + RS around the MLP
TP_ROOT_COLLECTIVES = 4  # embedding output RS (AG in backward), output head input AG (RS in backward)


@dataclass(frozen=True)
class StepTime:
    """One optimizer step on one GPU, seconds, and what it is made of."""

    layout: Layout
    grad_accum_steps: int
    compute_s: float  # FLOPs over peak x efficiency, recomputation included
    fsdp_exposed_s: float  # all-gathers and reduce-scatters compute did not hide
    replica_exposed_s: float  # HSDP's gradient all-reduce beyond the backward window
    tp_s: float  # TP's collectives on NVLink (not hidden)
    tokens_per_gpu: float  # the global batch over the GPUs
    model_flops_per_token: float
    peak_flops: float  # one GPU's dense BF16 peak, FLOP/s
    terms: tuple[str, ...]  # the per-block arithmetic, for --explain

    @property
    def total_s(self) -> float:
        return self.compute_s + self.exposed_s

    @property
    def exposed_s(self) -> float:
        return self.fsdp_exposed_s + self.replica_exposed_s + self.tp_s

    @property
    def tokens_per_s_per_gpu(self) -> float:
        return self.tokens_per_gpu / self.total_s

    @property
    def mfu(self) -> float:
        """Model FLOPs per second over the dense BF16 peak: the trainer's MFU, as a run would log it."""
        return self.tokens_per_s_per_gpu * self.model_flops_per_token / self.peak_flops


def recompute_extra_flops_per_token(cfg: ModelConfig, seq_len: int, mode: str) -> float:
    """FLOPs per token that activation checkpointing adds to the model FLOPs."""
    if mode == FULL_RECOMPUTE:
        return (flops_per_token(cfg, seq_len) - 6 * cfg.vocab_size * cfg.dim) / 3  # the blocks' forward again
    if mode == SELECTIVE_OP_RECOMPUTE:  # every second matmul of the forward: half of 2 FLOPs per block parameter
        return float(count_params(cfg, include_embedding=False) - cfg.vocab_size * cfg.dim - cfg.dim)
    if mode == NO_RECOMPUTE:
        return 0.0
    raise ValueError(f"activation checkpointing {mode!r}: allowed: {NO_RECOMPUTE}, {FULL_RECOMPUTE}, "
                     f"{SELECTIVE_OP_RECOMPUTE}")


def root_group_params(cfg: ModelConfig) -> int:
    """Parameters of FSDP's root group: the embedding, the final norm and the output head (one matrix when tied)."""
    return (1 if cfg.tie_embeddings else 2) * cfg.vocab_size * cfg.dim + cfg.dim


def fp8_all_gather_applies(fp8_backend: str, torchao_recipe: str, fsdp_float8_all_gather: bool) -> bool:
    """Whether FSDP all-gathers the Float8 linears' weights in FP8, as training.fp8.TorchaoFp8 decides: torchao
    with tensorwise scaling and fp8.fsdp_float8_all_gather on (its default); rowwise scaling, TE and bf16 gather
    bf16. `fp8_backend` is the one the run uses on its GPU ("none" on an A100)."""
    return fp8_backend == "torchao" and torchao_recipe == "tensorwise" and fsdp_float8_all_gather


def block_gather_bytes(cfg: ModelConfig, fp8_all_gather: bool) -> int:
    """Bytes FSDP all-gathers for one whole block (before TP splits it): 2 B a parameter, 1 B for the weight of
    each linear torchao converts (both dimensions multiples of 16: training.fp8.fp8_eligible) when FP8 all-gather
    is on; the two norms stay bf16."""
    kv_width = cfg.n_kv_heads * cfg.head_dim
    linears = ((cfg.dim, cfg.dim), (cfg.dim, kv_width), (cfg.dim, kv_width), (cfg.dim, cfg.dim),  # wq wk wv wo
               (cfg.dim, cfg.ffn_dim), (cfg.dim, cfg.ffn_dim), (cfg.ffn_dim, cfg.dim))  # w1 w3 w2
    total = PARAM_GATHER_BYTES * (count_params(cfg) - root_group_params(cfg)) // cfg.n_layers
    if not fp8_all_gather:
        return total
    fp8 = sum(a * b for a, b in linears if a % FP8_DIM_MULTIPLE == 0 and b % FP8_DIM_MULTIPLE == 0)
    return total - (PARAM_GATHER_BYTES - FP8_GATHER_BYTES) * fp8


def shared_busbw_share(ranks_per_node: int, gpus_per_node: int) -> float:
    """The part of a node's bus bandwidth one group gets when gpus_per_node / ranks_per_node groups share it."""
    return min(1.0, ranks_per_node / gpus_per_node)


def step_time(
    cfg: ModelConfig,
    *,
    seq_len: int,
    micro_batch_size: int,
    global_batch_tokens: int,
    layout: Layout,
    instance: InstanceType,
    network: NetworkModel,
    efficiency: float,
    recompute: str,
    reshard_after_forward: bool = True,
    fp8_all_gather: bool = False,
) -> StepTime:
    """The step of `cfg` under `layout` on `layout.gpus // gpus_per_node` nodes of `instance`."""
    gpn = instance.gpu_count
    gpus, tp, shard, replicas = layout.gpus, layout.tp, layout.dp_shard, layout.dp_replicate
    tokens_mb = micro_batch_size * seq_len  # one data-parallel rank's micro-batch, shared by its TP group
    accum = max(1, global_batch_tokens // (tokens_mb * layout.dp))
    model_flops = flops_per_token(cfg, seq_len)
    head_flops = 6 * cfg.vocab_size * cfg.dim  # the output head: outside the blocks
    rate = tp * instance.peak_bf16_tflops_per_gpu * 1e12 * efficiency  # one TP group's FLOP/s
    extra = recompute_extra_flops_per_token(cfg, seq_len, recompute)
    block_fwd_s = tokens_mb * (model_flops - head_flops) / 3 / cfg.n_layers / rate
    block_bwd_s = tokens_mb * ((model_flops - head_flops) * 2 / 3 + extra) / cfg.n_layers / rate
    compute_mb_s = tokens_mb * (model_flops + extra) / rate

    root_params = root_group_params(cfg) / tp
    block_params = (count_params(cfg) - root_group_params(cfg)) / cfg.n_layers / tp
    # shard group: `shard` ranks spaced tp apart, node by node; fewer ranks on a node than GPUs: shared NICs
    shard_nodes = max(1, shard * tp // gpn)
    shard_share = shared_busbw_share(min(shard, gpn // tp), gpn) if shard_nodes > 1 else 1.0

    def sharded(kind: str, message_bytes: float) -> float:
        return _shared(network, kind, message_bytes, shard, shard_nodes, shard_share)

    ag_s = sharded("all_gather", block_gather_bytes(cfg, fp8_all_gather) / tp)
    rs_s = sharded("reduce_scatter", GRAD_REDUCE_BYTES * block_params)
    # HSDP: replicas of a rank are on different nodes when a replica fills a node or more, else spread over all
    replica_nodes = replicas if shard * tp >= gpn else gpus // gpn
    replica_share = shared_busbw_share(max(1, replicas // replica_nodes), gpn) if replica_nodes > 1 else 1.0

    def replicated(message_bytes: float) -> float:
        return _shared(network, "all_reduce", message_bytes, replicas, replica_nodes, replica_share)

    ar_s = replicated(GRAD_REDUCE_BYTES * block_params / shard)  # one rank's shard of a block's gradients
    backward_comm_s = (ag_s if reshard_after_forward else 0.0) + rs_s
    fsdp_mb_s = (cfg.n_layers - 1) * (max(0.0, ag_s - block_fwd_s) + max(0.0, backward_comm_s - block_bwd_s))
    fsdp_mb_s += ag_s + rs_s  # the first block's gather and the last block's reduce-scatter
    fsdp_mb_s += sharded("all_gather", PARAM_GATHER_BYTES * root_params) + sharded(
        "reduce_scatter", GRAD_REDUCE_BYTES * root_params)
    # the all-reduce shares the backward window with what FSDP already put in it; the last block's and the root
    # group's come after the last compute of the backward
    replica_mb_s = ((cfg.n_layers - 1) * max(0.0, ar_s - max(0.0, block_bwd_s - backward_comm_s)) + ar_s
                    + replicated(GRAD_REDUCE_BYTES * root_params / shard)) if replicas > 1 else 0.0

    activation_bytes = ACTIVATION_BYTES * tokens_mb * cfg.dim
    tp_op_s = (network.collective_s("all_gather", activation_bytes, tp, 1)
               + network.collective_s("reduce_scatter", activation_bytes, tp, 1)) / 2
    tp_ops = TP_COLLECTIVES_PER_BLOCK * (3 if recompute == FULL_RECOMPUTE else 2)
    tp_mb_s = (cfg.n_layers * tp_ops + TP_ROOT_COLLECTIVES) * tp_op_s if tp > 1 else 0.0

    terms = (
        f"per micro-batch ({tokens_mb:,} tokens per data-parallel rank, {accum} a step): block forward "
        f"{block_fwd_s * 1e3:.2f} ms, backward {block_bwd_s * 1e3:.2f} ms (recompute {recompute}); compute "
        f"{compute_mb_s * 1e3:.1f} ms",
        f"FSDP over {shard} ranks on {shard_nodes} node(s) ({'NVLink' if shard_nodes == 1 else 'EFA'}): block "
        f"all-gather{' (FP8 linears)' if fp8_all_gather else ''} {ag_s * 1e3:.2f} ms, reduce-scatter "
        f"{rs_s * 1e3:.2f} ms; exposed {fsdp_mb_s * 1e3:.1f} ms",
        f"HSDP all-reduce over {replicas} replicas on {replica_nodes} node(s): {ar_s * 1e3:.2f} ms a block; "
        f"exposed {replica_mb_s * 1e3:.1f} ms" if replicas > 1 else "no replicas: no gradient all-reduce",
        f"TP {tp} on NVLink: ({cfg.n_layers} blocks x {tp_ops} + {TP_ROOT_COLLECTIVES} outside them) collectives "
        f"x {tp_op_s * 1e3:.3f} ms = {tp_mb_s * 1e3:.1f} ms"
        if tp > 1 else "no TP",
    )
    return StepTime(
        layout=layout, grad_accum_steps=accum, compute_s=accum * compute_mb_s, fsdp_exposed_s=accum * fsdp_mb_s,
        replica_exposed_s=accum * replica_mb_s, tp_s=accum * tp_mb_s,
        tokens_per_gpu=accum * tokens_mb * layout.dp / gpus, model_flops_per_token=model_flops,
        peak_flops=instance.peak_bf16_tflops_per_gpu * 1e12, terms=terms,
    )


def _shared(network: NetworkModel, kind: str, message_bytes: float, ranks: int, nodes: int, share: float) -> float:
    """A collective whose bandwidth term runs at `share` of the node's bus bandwidth (latency unchanged)."""
    if ranks <= 1:
        return 0.0
    full = network.collective_s(kind, message_bytes, ranks, nodes)
    steps_s = network.step_latency_s(nodes) * ring_steps(kind, ranks)
    return steps_s + (full - steps_s) / share
