"""`clusterctl plan --explain`: the FLOP, time and cost arithmetic of each option, one line per step (the memory
arithmetic is clusterctl.plan.memory.explain)."""

from __future__ import annotations

from clusterctl.plan.options import HOURS_PER_DAY, Option, format_tokens
from clusterctl.plan.workload import Workload
from instance_catalog.network import get_network
from training.shapes import count_params, flops_per_token


def flops_explain(workload: Workload, tokens: float) -> list[str]:
    cfg = workload.model
    non_embedding = count_params(cfg, include_embedding=False)
    per_token = flops_per_token(cfg, workload.seq_len)
    return [
        f"  FLOPs per token = 6 x {non_embedding:,} (parameters outside the embedding) + 12 x {cfg.n_layers} "
        f"layers x {cfg.dim} dim x {workload.seq_len} seq = {per_token:.4g} (training.shapes.flops_per_token, "
        "the trainer's MFU count)",
        f"  total = {per_token:.4g} x {tokens:.4g} tokens ({format_tokens(tokens)}) = {per_token * tokens:.4g} FLOPs",
    ]


def time_cost_explain(option: Option) -> list[str]:
    it = option.instance_type
    if option.hours is None:
        return []
    rate = option.gpus * it.peak_bf16_tflops_per_gpu * 1e12 * option.mfu_effective
    recompute = " (x 3/4: activation checkpointing recomputes the forward)" if (
        option.activation_checkpointing and not option.mfu.activation_checkpointing) else ""
    if option.choice is not None:
        return _step_explain(option) + _cost_explain(option)
    return [
        f"  throughput = {option.nodes} nodes x {it.gpu_count} GPUs x {it.peak_bf16_tflops_per_gpu:g} TFLOP/s "
        f"(dense BF16) x MFU {option.mfu_effective:.3f}{recompute} = {rate:.4g} FLOP/s",
        f"  time = {option.total_flops:.4g} / {rate:.4g} = {option.hours:,.1f} h "
        f"({option.hours / HOURS_PER_DAY:.1f} days); GPU-hours = {option.gpus} x {option.hours:,.1f} = "
        f"{option.gpu_hours:,.0f}",
    ] + _cost_explain(option)


def _cost_explain(option: Option) -> list[str]:
    it = option.instance_type
    return [
        f"  cost = {_group(option)} x {option.hours:,.1f} h x ${it.on_demand_usd_per_hour:,.2f}/h (catalog on-demand, "
        f"us-east-1) = ${option.instances_usd:,.0f}, + FSx for Lustre {option.hours:,.1f} h x "
        f"${option.fsx_usd_per_hour:,.2f}/h = ${option.fsx_usd:,.0f}: ${option.cost_usd:,.0f}; per million tokens "
        f"${option.usd_per_million_tokens:,.4f}",
    ]


def _group(option: Option) -> str:
    return f"({option.nodes} + {option.spare_nodes} spare)" if option.spare_nodes else str(option.nodes)


def _step_explain(option: Option) -> list[str]:
    """The step model's terms (clusterctl.plan.step_time) and the network model's figures behind them."""
    step, it = option.choice.step, option.instance_type
    network = get_network(it.name)
    efa = ", ".join(f"{n} nodes {b:.0f} GB/s" for n, b in network.efa_all_gather_busbw_gbps)
    latency = ", ".join(f"{n} nodes {s * 1e6:.1f} us" for n, s in network.efa_step_latency_s)
    return [
        f"  layout {step.layout.name} ({step.layout.gpus} GPUs), compute efficiency {option.efficiency:.3f} of "
        f"{it.peak_bf16_tflops_per_gpu:g} TFLOP/s (clusterctl.plan.efficiency)",
        *(f"  {term}" for term in step.terms),
        f"  network ({'estimate' if network.estimate else 'published'}; instance_catalog/network.py): NVLink "
        f"{network.nvlink_busbw_gbps:.0f} GB/s busbw, {network.nvlink_step_latency_s * 1e6:.0f} us a ring step; "
        f"EFA all-gather busbw {efa}; latency a ring step {latency}",
        f"  step = compute {step.compute_s:.3f} s + FSDP {step.fsdp_exposed_s:.3f} + HSDP "
        f"{step.replica_exposed_s:.3f} + TP {step.tp_s:.3f} = {step.total_s:.3f} s for {step.tokens_per_gpu:,.0f} "
        f"tokens per GPU: {step.tokens_per_s_per_gpu:,.0f} tokens/s per GPU, MFU {step.mfu:.3f}",
        f"  time = {option.tokens:.4g} tokens / ({option.gpus} GPUs x {step.tokens_per_s_per_gpu:,.0f}) = "
        f"{option.hours:,.1f} h ({option.hours / HOURS_PER_DAY:.1f} days); GPU-hours = {option.gpus} x "
        f"{option.hours:,.1f} = {option.gpu_hours:,.0f}",
    ]
