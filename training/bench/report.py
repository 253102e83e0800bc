"""What a bench run reports: the human-readable table (``format_table``) and the software versions recorded in
the JSON (``software_versions``)."""

from __future__ import annotations

import math
import sys

import torch

from training.bench.torchtitan_model import torchtitan_version
from training.bench.variants import BenchResult


def format_table(header: dict, results: list[BenchResult]) -> str:
    """The human-readable report: one line of context, one row per backend, then the skip/fail reasons."""
    lines = [
        f"device {header['device']} | preset {header['preset']} ({header['n_layers']} layers, "
        f"{header['params'] / 1e6:.1f}M params)"
        + f" | seq {header['seq_len']} x micro-batch {header['micro_batch_size']}"
        + f" | {header['flops_per_token'] / 1e9:.3f} GFLOP/token"
        + f" | AC {'on' if header['parallel']['activation_checkpointing'] else 'off'}"
        + f" | compile {'on' if header['parallel']['compile'] else 'off'}"
        + f" | loss {_loss_label(header['parallel'].get('loss_chunk_tokens', 0))}",
        f"{'backend':<26} {'status':<8} {'tokens/s':>12} {'TFLOP/s':>9} {'MFU':>7} {'step ms':>9} "
        f"{'peak GiB':>9} {'loss':>8} {'vs titan':>9}",
    ]
    for r in results:
        lines.append(
            f"{r.backend:<26} {r.status:<8} {format_number(r.tokens_per_s, '.1f'):>12} "
            f"{format_number(r.tflops, '.3f'):>9} {format_number(r.mfu and 100 * r.mfu, '.1f', '%'):>7} "
            f"{format_number(r.step_time_ms, '.1f'):>9} {format_number(r.peak_memory_gib, '.2f'):>9} "
            f"{format_number(r.final_loss, '.4f'):>8} {format_number(r.vs_torchtitan, '.3f', 'x'):>9}"
        )
    lines += [f"{r.backend}: {r.status}: {r.reason}" for r in results if r.reason]
    if header["peak_bf16_tflops"] is None:
        lines.append("MFU: not reported (no GPU peak known for this device)")
    return "\n".join(lines)


def _loss_label(loss_chunk_tokens: int) -> str:
    """How our rows compute the loss (torchtitan's rows always use the full logits)."""
    if loss_chunk_tokens > 0:
        return f"fused over {loss_chunk_tokens}-token chunks (titan: full logits)"
    return "full logits"


def format_number(value: float | None, spec: str, suffix: str = "") -> str:
    """``value`` in ``spec`` with ``suffix``; "-" for a value not measured (None or NaN)."""
    if value is None or (isinstance(value, float) and math.isnan(value)):
        return "-"
    return f"{value:{spec}}{suffix}"


def software_versions() -> dict[str, str | None]:
    """The JSON's ``versions``: Python, torch, CUDA, cuDNN, the driver, and the FP8 and torchtitan packages the
    run imported (None where one was not)."""
    versions: dict[str, str | None] = {"python": sys.version.split()[0], "torch": torch.__version__}
    versions["cuda"] = torch.version.cuda
    versions["cudnn"] = str(torch.backends.cudnn.version()) if torch.cuda.is_available() else None
    versions["driver"] = _nvidia_driver()
    for module in ("torchao", "transformer_engine"):
        mod = sys.modules.get(module)
        versions[module] = getattr(mod, "__version__", None) if mod else None
    versions["torchtitan"] = torchtitan_version() if "torchtitan" in sys.modules else None
    return versions


def _nvidia_driver() -> str | None:
    """The driver version nvidia-smi reports, or None (no GPU, no nvidia-smi)."""
    import shutil
    import subprocess

    if not torch.cuda.is_available() or shutil.which("nvidia-smi") is None:
        return None
    try:
        out = subprocess.run(
            ["nvidia-smi", "--query-gpu=driver_version", "--format=csv,noheader"],
            capture_output=True, text=True, timeout=30, check=True,
        ).stdout
    except (OSError, subprocess.SubprocessError):
        return None
    return out.strip().splitlines()[0] if out.strip() else None

