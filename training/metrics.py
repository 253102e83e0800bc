"""Per-step metrics: a JSON line on rank 0's stdout, a progress line and a CloudWatch EMF line on its stderr.

The JSON line is the trainer's progress contract with the jobs launcher (docs/architecture.md, "Jobs"):
``{"event": "step", "step": N, "loss": L, ...}``; N counts completed optimizer steps (1-based). Local rank 0
of every other node prints a short ``{"event": "step", "step": N, "rank": R}`` at the same steps, so the job
supervisor on each node sees progress in its own node's log (its hang detection reads these lines). A step
after which the held-out loss was evaluated (``[validation]``, training/validation.py) is always logged, and its
record adds ``val_loss``, ``val_perplexity`` (exp of it) and ``val_time_s``.

Before the first step, one resume line says where the run started (``log_resume``):
``{"event": "resume", "step": N, "path": "..."}``, the checkpoint's step and directory, or step 0 and path
null for a fresh start; the launcher's status reports it as ``resumedFromStep``.

On the cluster, rank 0 also writes the step record in CloudWatch Embedded Metric Format (EMF) to stderr, the
job log. That line is not shipped as printed (issue 42: a job could name any metric, namespace or dimension):
the job supervisor (root) keeps it in the job log behind a prefix and re-emits only this record's metric names
(_EMF_METRICS, node_bootstrap/jobs/job_metrics.py TRAINER_METRICS: tests hold the two lists equal), under the
node's namespace (the node config's metrics.namespace) and the dimensions {Cluster, JobId} and {Cluster} it
sets itself, to a metrics log of its own that the CloudWatch agent ships; CloudWatch Logs turns that into
metrics with no API call from the training loop (CloudWatch User Guide, "Specification: Embedded metric
format"). So on the cluster the namespace and dimension values this line carries (``metrics.cloudwatch_namespace``,
CLUSTER_STACK_NAME, CLUSTER_JOB_ID) have no effect; the metric names and values are what counts. It is the only
way: a job has no AWS credentials to call CloudWatch with (the node's metadata service is closed to the job
user: node_bootstrap/imds_block.py), so ``metrics.cloudwatch=true`` is refused.

With ``[metrics] tensorboard`` rank 0 also appends the record's scalars to a TensorBoard event file next to the
checkpoints (training/tensorboard.py).

Step times are averaged over the steps since the last logged step on each rank (after a device synchronize)
and all-gathered, so a straggler shows up as ``step_time_s_max`` with ``slowest_rank`` naming it. Throughput
and MFU use the slowest rank's time: that is the pace of the synchronous job.
"""

from __future__ import annotations

import json
import logging
import math
import os
import resource
import statistics
import sys
import time
from dataclasses import dataclass
from typing import Any, TextIO

import torch
import torch.distributed as dist

from training.config.metrics import MetricsConfig
from training.config.sections import JOB_ID_ENV
from training.goodput_line import TrainerGoodput
from training.tensorboard import EventFileWriter, scalars_of
from training.validation import ValidationResult

log = logging.getLogger(__name__)

CLUSTER_ENV = "CLUSTER_STACK_NAME"  # from the training environment file (node_bootstrap/training_env.py)


@dataclass(frozen=True)
class ThroughputModel:
    """What turns a step time into tokens/s, TFLOP/s and MFU."""

    tokens_per_step: int  # tokens one optimizer step consumes across all ranks
    world_size: int  # ranks sharing those tokens (GPUs)
    flops_per_token: float  # model training FLOPs per token (training.model.flops_per_token)
    peak_tflops_per_gpu: float | None  # dense BF16 peak of one GPU (training.hardware); None on CPU


def median_step_time(step_times_s: list[float]) -> float:
    """The median rank's step time: what the slowest rank is compared against."""
    return float(statistics.median(step_times_s))


def summarize_ranks(step_times_s: list[float]) -> dict[str, Any]:
    """min/max of the per-rank step times and the rank with the max (the straggler)."""
    slowest = max(range(len(step_times_s)), key=lambda r: step_times_s[r])
    return {"step_time_s_min": min(step_times_s), "step_time_s_max": step_times_s[slowest],
            "slowest_rank": slowest}


def throughput(step_time_s: float, model: ThroughputModel) -> dict[str, float | None]:
    tokens_per_s = model.tokens_per_step / step_time_s
    tflops = tokens_per_s * model.flops_per_token / model.world_size / 1e12  # model TFLOP/s per GPU
    mfu = tflops / model.peak_tflops_per_gpu if model.peak_tflops_per_gpu else None
    return {"tokens_per_s": tokens_per_s, "tflops": tflops, "mfu": mfu}


def peak_memory_gib(device: torch.device) -> float:
    """Peak memory of this process: CUDA's max allocated on a GPU, the process's peak RSS on a CPU."""
    if device.type == "cuda":
        return torch.cuda.max_memory_allocated(device) / 2**30
    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss * 1024 / 2**30  # ru_maxrss is KiB on Linux


class GpuSampler:
    """GPU utilization, temperature, power and SM clock through torch.cuda's NVML wrappers (they need
    pynvml / nvidia-ml-py). Turns itself off after the first failure, so a missing NVML costs one try."""

    def __init__(self, device: torch.device, enabled: bool):
        self.device = device
        self.enabled = enabled and device.type == "cuda"

    def sample(self) -> dict[str, float]:
        if not self.enabled:
            return {}
        try:
            return {
                "gpu_util_pct": float(torch.cuda.utilization(self.device)),
                "gpu_temp_c": float(torch.cuda.temperature(self.device)),
                "gpu_power_w": torch.cuda.power_draw(self.device) / 1000.0,  # NVML reports milliwatts
                "gpu_clock_mhz": float(torch.cuda.clock_rate(self.device)),
            }
        except Exception as exc:  # ModuleNotFoundError (no pynvml), NVML errors: metrics are optional
            log.info("GPU metrics through NVML unavailable (%s); not sampling them", exc)
            self.enabled = False
            return {}


# EMF: metric name, how to get it from the step record (and the extras below), unit. Names are what
# cluster_spec/metrics.py (the dashboard, the alarms, clusterctl top) reads.
_EMF_METRICS = (
    ("Step", lambda r: r["step"], "Count"),
    ("RunSteps", lambda r: r["run_steps"], "Count"),
    ("EtaSeconds", lambda r: (r["run_steps"] - r["step"]) * r["step_time_s_max"], "Seconds"),
    ("Loss", lambda r: r["loss"], "None"),
    ("LearningRate", lambda r: r["lr"], "None"),
    ("GradNorm", lambda r: r["grad_norm"], "None"),
    ("TokensPerSecond", lambda r: r["tokens_per_s"], "Count/Second"),
    ("TFLOPSPerGPU", lambda r: r["tflops"], "None"),
    ("MFU", lambda r: None if r["mfu"] is None else 100.0 * r["mfu"], "Percent"),
    ("StepTimeMax", lambda r: r["step_time_s_max"], "Seconds"),
    ("StepTimeMedian", lambda r: r["step_time_s_median"], "Seconds"),
    ("StepTimeMin", lambda r: r["step_time_s_min"], "Seconds"),
    ("StragglerRatio", lambda r: r["step_time_s_max"] / r["step_time_s_median"]
     if r["step_time_s_median"] > 0 else None, "None"),
    ("SlowestRank", lambda r: r["slowest_rank"], "None"),
    ("PeakMemoryGiB", lambda r: r["mem_gib"], "None"),  # GiB; CloudWatch's "Gigabytes" does not say 2**30
    # the held-out loss ([validation]), in the records of the steps that evaluated it
    ("ValidationLoss", lambda r: r.get("val_loss"), "None"),
    ("ValidationPerplexity", lambda r: r.get("val_perplexity"), "None"),
    # this process's step seconds / its wall time so far (training/goodput_line.py); the job's: clusterctl status
    ("Goodput", lambda r: r.get("goodput_pct"), "Percent"),
)
# Also published per cluster, whatever the job: alarms need fixed dimensions, and one job runs at a time.
_EMF_CLUSTER_METRICS = ("TokensPerSecond", "MFU", "StragglerRatio")


def build_emf_record(record: dict[str, Any], *, namespace: str, cluster: str, job_id: str,
                     timestamp_ms: int) -> dict[str, Any]:
    """The EMF document for one step record. ``record`` is the JSON step record plus ``run_steps`` and
    ``step_time_s_median``. Non-finite values (a diverged loss) and absent ones (MFU on a CPU) are left out:
    an EMF metric value must be a number."""
    values: dict[str, float] = {}
    units: dict[str, str] = {}
    for name, get, unit in _EMF_METRICS:
        try:
            value = get(record)
        except KeyError:  # the step-0 validation record holds no training step's fields
            continue
        if value is None or isinstance(value, bool) or not math.isfinite(value):
            continue
        values[name], units[name] = float(value), unit
    directives = [{"Namespace": namespace, "Dimensions": [["Cluster", "JobId"]],
                   "Metrics": [{"Name": n, "Unit": units[n]} for n in values]}]
    cluster_metrics = [n for n in _EMF_CLUSTER_METRICS if n in values]
    if cluster_metrics:
        directives.append({"Namespace": namespace, "Dimensions": [["Cluster"]],
                           "Metrics": [{"Name": n, "Unit": units[n]} for n in cluster_metrics]})
    return {"_aws": {"Timestamp": timestamp_ms, "CloudWatchMetrics": directives},
            "Cluster": cluster, "JobId": job_id, **values}


def phase_time() -> str:
    """The wall-clock time of a restart phase as the resume and first step lines carry it ("phases"): UTC, to the
    millisecond, so the job supervisor, the job keeper and the drills lay a restart's phases on one timeline."""
    now = time.time()
    return time.strftime("%Y-%m-%dT%H:%M:%S", time.gmtime(now)) + f".{int(now * 1000) % 1000:03d}Z"


def log_resume(cfg: MetricsConfig, *, rank: int, local_rank: int, step: int, path: str | os.PathLike[str] | None,
               stdout: TextIO | None = None, tier: str | None = None, fetched: int | None = None,
               phases: dict[str, str] | None = None, compile_cache: str | None = None) -> None:
    """The resume line, printed right after the run resumed from the checkpoint at ``path`` (``step`` its
    completed steps) or decided to start fresh (step 0, path None). Global rank 0 prints it, and local rank 0
    of every other node with its ``rank`` as the step lines do, so the status on every node of the job says
    which step this attempt started from (the job keeper's steps lost to a restart: the step reached minus
    this one). Every rank agreed on the checkpoint (checkpoint.resume.agree_on_resume), so the nodes print the same.
    ``tier``: "durable" (checkpoint.dir) or "local" (the local tier, ``fetched`` shards of it from another
    node); None for a fresh start. ``path`` of a local resume is this node's shard of rank ``rank``. ``phases``:
    when this start's process group was up ("rendezvous_done") and its checkpoint loaded ("checkpoint_loaded").
    ``compile_cache`` (with torch.compile): "snapshot" when this node's Inductor directory holds the job's
    snapshot before the first compile (a warm compile, training/compile_cache.py), "cold" when there was none."""
    if not cfg.json_lines or local_rank != 0:
        return
    record: dict[str, Any] = {"event": "resume", "step": step, "path": None if path is None else str(path)}
    if tier is not None:
        record["tier"] = tier
    if fetched is not None:
        record["fetched"] = fetched
    if phases:
        record["phases"] = phases
    if compile_cache is not None:
        record["compile_cache"] = compile_cache
    if rank != 0:
        record["rank"] = rank
    out = stdout or sys.stdout
    out.write(json.dumps(record) + "\n")
    out.flush()


class MetricsLogger:
    """Collects per-rank step timings and, on rank 0, writes the step record. ``log_step`` is collective."""

    def __init__(self, cfg: MetricsConfig, *, rank: int, world_size: int, device: torch.device,
                 model: ThroughputModel, stdout: TextIO | None = None, stderr: TextIO | None = None,
                 local_rank: int = 0, tensorboard: EventFileWriter | None = None,
                 layout: dict[str, int] | None = None):
        self.cfg = cfg
        self.rank = rank
        self.local_rank = local_rank  # rank on this node: 0 prints the node's progress line
        self.world_size = world_size
        self.device = device
        self.model = model
        self.stdout = stdout or sys.stdout
        self.stderr = stderr or sys.stderr
        self.gpu = GpuSampler(device, cfg.nvml)
        self.emf = cfg.emf_enabled() and rank == 0
        self.emf_cluster = os.environ.get(CLUSTER_ENV) or "local"
        self.emf_job_id = os.environ.get(JOB_ID_ENV) or "local"
        self.tensorboard = tensorboard  # rank 0's event file writer (training.tensorboard.open_tensorboard)
        self.layout = layout  # the job's [parallel] degrees (Layout.settings()), carried in every step record
        self.goodput = TrainerGoodput()  # rank 0's: counted step seconds against the process's wall time

    def log_step(self, *, step: int, total_steps: int, loss: torch.Tensor, lr: float, grad_norm: torch.Tensor,
                 step_time_s: float, validation: ValidationResult | None = None,
                 phases: dict[str, str] | None = None) -> dict[str, Any] | None:
        """Gather ``[step_time_s, loss]`` from every rank; rank 0 emits and returns the record. ``loss`` is
        this rank's mean loss of the step, ``step_time_s`` its mean step time since the last logged step.
        ``validation``: the held-out loss evaluated after this step (the same on every rank), or None.
        ``phases``: the first step of a start only, when its model was compiled and the step done."""
        local = torch.tensor([step_time_s, float(loss)], dtype=torch.float64, device=self.device)
        if dist.is_available() and dist.is_initialized() and self.world_size > 1:
            gathered = [torch.empty_like(local) for _ in range(self.world_size)]
            dist.all_gather(gathered, local)
        else:
            gathered = [local]
        if self.rank != 0:
            if self.local_rank == 0 and self.cfg.json_lines:  # this node's progress, for its job supervisor
                line = {"event": "step", "step": step, "rank": self.rank, **({"phases": phases} if phases else {})}
                self.stdout.write(json.dumps(line) + "\n")
                self.stdout.flush()
            return None
        rows = torch.stack(gathered).cpu().tolist()
        times = [row[0] for row in rows]
        mean_loss = sum(row[1] for row in rows) / len(rows)
        # the mean over every rank: the ranks of a tp group hold the same loss of the same samples, so each
        # data-parallel rank's loss counts tp times, and the mean is still the one over the step's samples
        record: dict[str, Any] = {"event": "step", "step": step, "loss": mean_loss, "lr": lr}
        if self.layout is not None:
            record["layout"] = self.layout
        if phases:
            record["phases"] = phases
        ranks = summarize_ranks(times)
        record.update(throughput(ranks["step_time_s_max"], self.model))
        record.update(ranks)
        record["grad_norm"] = float(grad_norm)
        record["mem_gib"] = peak_memory_gib(self.device)
        self.goodput.add(step, ranks["step_time_s_max"], first_of_start=bool(phases))  # phases: a start's first
        record["goodput_pct"] = self.goodput.pct()
        if validation is not None:
            record.update(val_loss=validation.loss, val_perplexity=validation.perplexity,
                          val_time_s=validation.time_s)
        record.update(self.gpu.sample())
        self._emit(record, total_steps)
        if self.emf:
            self._emit_emf({**record, "run_steps": total_steps, "step_time_s_median": median_step_time(times)})
        if self.tensorboard is not None:
            self.tensorboard.add_scalars(step, scalars_of(record))
        return record

    def log_validation(self, validation: ValidationResult, *, total_steps: int) -> dict[str, Any] | None:
        """The held-out loss evaluated before the first step (``[validation] at_start``), as step 0: a
        ``{"event": "validation", "step": 0, ...}`` line (not a "step" line: no step ran, and the jobs launcher
        counts progress by those), its progress line, EMF and TensorBoard. Rank 0 emits and returns the record;
        not collective (every rank holds the same result)."""
        if self.rank != 0:
            return None
        record = {"event": "validation", "step": validation.step, "val_loss": validation.loss,
                  "val_perplexity": validation.perplexity, "val_time_s": validation.time_s}
        if self.cfg.json_lines:
            self.stdout.write(json.dumps(_json_safe(record), allow_nan=False) + "\n")
            self.stdout.flush()
        if self.cfg.progress:
            self.stderr.write(f"step {validation.step}/{total_steps} val_loss {validation.loss:.4f} (perplexity "
                              f"{validation.perplexity:.2f}), before the first step\n")
            self.stderr.flush()
        if self.emf:
            self._emit_emf({**record, "run_steps": total_steps})
        if self.tensorboard is not None:
            self.tensorboard.add_scalars(validation.step, scalars_of(record))
        return record

    def _emit_emf(self, record: dict[str, Any]) -> None:
        document = build_emf_record(record, namespace=self.cfg.cloudwatch_namespace, cluster=self.emf_cluster,
                                    job_id=self.emf_job_id, timestamp_ms=int(time.time() * 1000))
        # one line, one write: the JSON object alone on its line, as EMF requires
        self.stderr.write(json.dumps(document, allow_nan=False, separators=(",", ":")) + "\n")
        self.stderr.flush()

    def _emit(self, record: dict[str, Any], total_steps: int) -> None:
        if self.cfg.json_lines:
            # strict JSON has no NaN/Infinity: a diverged loss is written as null (the stderr line shows nan)
            self.stdout.write(json.dumps(_json_safe(record), allow_nan=False) + "\n")
            self.stdout.flush()
        if self.cfg.progress:
            mfu = f" mfu {record['mfu']:.1%}" if record["mfu"] is not None else ""
            held_out = (f" val_loss {record['val_loss']:.4f} (perplexity {record['val_perplexity']:.2f})"
                        if "val_loss" in record else "")
            self.stderr.write(
                f"step {record['step']}/{total_steps} loss {record['loss']:.4f} lr {record['lr']:.2e} "
                f"{record['tokens_per_s']:,.0f} tok/s {record['tflops']:.2f} TFLOP/s{mfu} "
                f"step {record['step_time_s_max'] * 1000:.0f} ms (slowest rank {record['slowest_rank']}) "
                f"mem {record['mem_gib']:.2f} GiB{held_out}"
                + (f" {self.goodput.line()}" if record["step"] == total_steps else "") + "\n"
            )
            self.stderr.flush()


def _json_safe(record: dict[str, Any]) -> dict[str, Any]:
    return {k: None if isinstance(v, float) and not math.isfinite(v) else v for k, v in record.items()}
