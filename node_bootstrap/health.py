"""Step 3, health: the gate a node passes before it takes jobs, and `python3 -m node_bootstrap check`.

Checks, each ok / warn / fail (only a fail makes the node unhealthy):
- gpu-count: nvidia-smi lists the catalog's GPU count;  gpu-memory: each GPU has the catalog's memory;
- gpu-ecc: no uncorrectable ECC errors since the driver loaded; gpu-row-remap: no pending or failed row remap;
- fabric-manager, cuda-init, dcgm-diag: what breaks every job while nvidia-smi looks fine (gpu_runtime.py);
- fp8: the jobs' interpreter imports the node's FP8 backends and runs an FP8 matmul on every GPU (fp8_check.py);
- xid: no Xid whose verdict in xid.py is reset or replace (application and watch Xids only warn), from the
  journal or, when it is empty, the kernel ring buffer (kernel_log.py), the source named in the detail;
- efa: `fi_info -p efa` lists the catalog's EFA device count;
- imds-block: the job user cannot open a connection to the instance metadata service (imds_block.py), so no
  job can take the node role's credentials. Before step jobuser has created the user, there is nothing to
  block, and step imdsblock runs this check itself once it has set the block.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from node_bootstrap import gpu_runtime
from node_bootstrap.checks import FAIL, OK, WARN, Check
from node_bootstrap.config import ExpectedHardware
from node_bootstrap.efa import FI_INFO_ARGS, efa_rdm_domains
from node_bootstrap.errors import StepError
from node_bootstrap.fp8_check import Fp8Probe, check_fp8
from node_bootstrap.gpu import (
    GPU_QUERY,
    REMAP_QUERY,
    GpuInfo,
    GpuQueryError,
    parse_gpu_query,
    parse_remapped_rows,
)
from node_bootstrap.imds_block import MetadataProbe, check_metadata_blocked
from node_bootstrap.kernel_log import probe_command as kernel_log_command
from node_bootstrap.kernel_log import read_kernel_log
from node_bootstrap.plan import StepPlan
from node_bootstrap.runner import Runner
from node_bootstrap.xid import APP, IGNORE, UNUSABLE_ACTIONS, XidEvent, parse_xid_lines

__all__ = ["FAIL", "OK", "WARN", "Check", "HealthGateFailed", "HealthReport", "plan_health", "run_health_checks"]
GPU_MEMORY_TOLERANCE = 0.95  # nvidia-smi reports slightly less than the marketing size (H100 80GB: 81559 MiB)


@dataclass(frozen=True)
class HealthReport:
    instance_type: str
    checks: tuple[Check, ...]
    xid_events: tuple[XidEvent, ...]

    @property
    def healthy(self) -> bool:
        return all(c.status != FAIL for c in self.checks)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    def reason(self) -> str:
        """One line naming every failed check, for the log and the instance tag."""
        return "health gate failed: " + "; ".join(f"{c.name}: {c.detail}" for c in self.failures)

    def to_json(self) -> str:
        return json.dumps({
            "healthy": self.healthy,
            "instanceType": self.instance_type,
            "checks": [{"name": c.name, "status": c.status, "detail": c.detail} for c in self.checks],
            "xidEvents": [
                {"code": e.code, "pciBusId": e.pci_bus_id, "action": e.verdict.action,
                 "reason": e.verdict.reason, "message": e.message}
                for e in self.xid_events
            ],
        }, indent=2)

    def format_table(self) -> str:
        width = max([len("CHECK")] + [len(c.name) for c in self.checks])
        lines = [f"{'CHECK':<{width}}  {'STATUS':<6}  DETAIL"]
        lines += [f"{c.name:<{width}}  {c.status.upper():<6}  {c.detail}" for c in self.checks]
        lines.append("")
        lines.append("{}: {}".format(self.instance_type, "HEALTHY" if self.healthy else "UNHEALTHY"))
        return "\n".join(lines)


class HealthGateFailed(StepError):
    def __init__(self, report: HealthReport) -> None:
        super().__init__(report.reason())
        self.report = report


def probe_commands(runner: Runner, fp8: Fp8Probe, metadata: MetadataProbe | None = None) -> list[tuple[str, ...]]:
    """The read-only commands the checks run, for `check --dry-run`."""
    fi_info = (_fi_info(runner) or "fi_info",) + FI_INFO_ARGS
    commands = [GPU_QUERY, REMAP_QUERY, gpu_runtime.fabric_manager_command(), gpu_runtime.cuda_probe_command(),
                fp8.command(), gpu_runtime.DCGM_DIAG, kernel_log_command(runner), fi_info]
    metadata_command = metadata.command_for_job_user() if metadata is not None else None
    return commands + ([metadata_command] if metadata_command else [])


def run_health_checks(expected: ExpectedHardware, instance_type: str, runner: Runner,
                      fp8: Fp8Probe, metadata: MetadataProbe | None = None) -> HealthReport:
    """Every check; `metadata` None leaves out imds-block (the hardware checks' own tests)."""
    checks: list[Check] = []
    gpus = _gpu_state_checks(expected, runner, checks)
    checks.append(gpu_runtime.check_fabric_manager(expected, runner))
    if gpus is not None:  # without a working driver there is nothing to make a context on
        cuda = gpu_runtime.check_cuda(expected, runner)
        checks.append(cuda)
        if cuda.status != FAIL:  # no FP8 without a CUDA context: one failure, named once
            checks.append(check_fp8(expected, fp8, runner))
        checks.append(gpu_runtime.check_dcgm(runner))
    events = _check_xids(runner, checks)
    checks.append(efa_check(expected, runner))
    if metadata is not None:
        checks.append(check_metadata_blocked(metadata, runner))
    return HealthReport(instance_type, tuple(checks), tuple(events))


def gpu_checks(expected: ExpectedHardware, runner: Runner) -> list[Check]:
    """gpu-count, gpu-memory, gpu-ecc and gpu-row-remap: the GPUs' state now (the gate and the monitor)."""
    checks: list[Check] = []
    _gpu_state_checks(expected, runner, checks)
    return checks


def _gpu_state_checks(expected: ExpectedHardware, runner: Runner, checks: list[Check]) -> list[GpuInfo] | None:
    gpus = _check_gpus(expected, runner, checks)
    if gpus is not None:
        _check_row_remap(runner, checks)
    return gpus


def efa_check(expected: ExpectedHardware, runner: Runner) -> Check:
    """efa: the EFA devices libfabric sees now, against the catalog's count (the gate and the monitor)."""
    checks: list[Check] = []
    _check_efa(expected, runner, checks)
    return checks[0]


def plan_health(expected: ExpectedHardware, instance_type: str, runner: Runner, fp8: Fp8Probe,
                metadata: MetadataProbe | None = None) -> StepPlan:
    """The gate: raises HealthGateFailed (naming every failed check) when the node is unhealthy."""
    report = run_health_checks(expected, instance_type, runner, fp8, metadata)
    plan = StepPlan("health")
    for check in report.checks:
        plan.note(f"{check.status.upper()} {check.name}: {check.detail}")
    if not report.healthy:
        raise HealthGateFailed(report)
    return plan


def _check_gpus(expected: ExpectedHardware, runner: Runner, checks: list[Check]) -> list[GpuInfo] | None:
    if runner.which("nvidia-smi") is None:
        checks.append(Check("gpu-count", FAIL, "nvidia-smi not found: is the NVIDIA driver installed?"))
        return None
    result = runner.run(GPU_QUERY, mutating=False, check=False)
    if not result.ok:
        checks.append(Check("gpu-count", FAIL, result.describe_failure()))
        return None
    try:
        gpus = parse_gpu_query(result.stdout)
    except GpuQueryError as e:
        checks.append(Check("gpu-count", FAIL, str(e)))
        return None
    names = sorted({g.name for g in gpus})
    count_ok = len(gpus) == expected.gpu_count
    detail = f"{len(gpus)} GPUs ({', '.join(names) or 'none'}), expected {expected.gpu_count}"
    checks.append(Check("gpu-count", OK if count_ok else FAIL, detail))

    floor_mib = expected.gpu_memory_gib * 1024 * GPU_MEMORY_TOLERANCE
    small = [g for g in gpus if g.memory_total_mib is not None and g.memory_total_mib < floor_mib]
    unknown = [g for g in gpus if g.memory_total_mib is None]
    if small:
        checks.append(Check("gpu-memory", FAIL, "; ".join(
            f"GPU {g.index} has {g.memory_total_mib} MiB, expected about {expected.gpu_memory_gib} GiB"
            for g in small)))
    elif unknown:
        checks.append(Check("gpu-memory", WARN, f"memory not reported for GPU {_indexes(unknown)}"))
    elif gpus:
        checks.append(Check("gpu-memory", OK, f"every GPU has at least {int(floor_mib / 1024)} GiB"))

    bad = [g for g in gpus if g.ecc_uncorrected_volatile]
    no_counters = [g for g in gpus if g.ecc_uncorrected_volatile is None]
    if bad:
        checks.append(Check("gpu-ecc", FAIL, "; ".join(
            f"GPU {g.index} ({g.pci_bus_id}): {g.ecc_uncorrected_volatile} uncorrectable ECC errors"
            for g in bad)))
    elif no_counters:
        checks.append(Check("gpu-ecc", WARN,
                            f"ECC counters not available for GPU {_indexes(no_counters)} (ECC disabled?)"))
    elif gpus:
        checks.append(Check("gpu-ecc", OK, "no uncorrectable ECC errors"))
    return gpus


def _check_row_remap(runner: Runner, checks: list[Check]) -> None:
    result = runner.run(REMAP_QUERY, mutating=False, check=False)
    if not result.ok:
        detail = f"row remapping not queryable: {result.describe_failure()}"
        checks.append(Check("gpu-row-remap", WARN, detail))
        return
    try:
        rows = parse_remapped_rows(result.stdout)
    except GpuQueryError as e:
        checks.append(Check("gpu-row-remap", WARN, str(e)))
        return
    failed = [r.pci_bus_id for r in rows if r.failure]
    pending = [r.pci_bus_id for r in rows if r.pending]
    if failed or pending:
        detail = []
        if failed:
            detail.append("row remapping failed (no spare rows) on {}".format(", ".join(failed)))
        if pending:
            detail.append("row remap pending (needs a GPU reset) on {}".format(", ".join(pending)))
        checks.append(Check("gpu-row-remap", FAIL, "; ".join(detail)))
    else:
        checks.append(Check("gpu-row-remap", OK, "no pending or failed row remapping"))


def _check_xids(runner: Runner, checks: list[Check]) -> list[XidEvent]:
    log = read_kernel_log(runner)
    if not log.result.ok:
        checks.append(Check("xid", WARN, f"kernel log not readable ({log.source}): "
                                         + log.result.describe_failure()))
        return []
    events = parse_xid_lines(log.text)
    # The table in xid.py decides: a reset- or replace-class Xid since boot means the node cannot take jobs.
    unusable = [e for e in events if e.verdict.action in UNUSABLE_ACTIONS]
    app = [e for e in events if e.verdict.action == APP]
    watch = [e for e in events if e.verdict.action not in UNUSABLE_ACTIONS and e.verdict.action != APP
             and e.verdict.action != IGNORE]
    source = f" (read: {log.source})"
    if unusable:
        checks.append(Check("xid", FAIL, "node unusable: " + summarize_xid_events(unusable) + source))
    elif app or watch:
        parts = (["application faults: " + summarize_xid_events(app)] if app else []) + (
            ["recorded: " + summarize_xid_events(watch)] if watch else [])
        checks.append(Check("xid", WARN, "; ".join(parts) + source))
    else:
        checks.append(Check("xid", OK, "no Xid events since boot" + source))
    return events


def _check_efa(expected: ExpectedHardware, runner: Runner, checks: list[Check]) -> None:
    if expected.efa_interface_count == 0:
        checks.append(Check("efa", OK, "no EFA devices expected"))
        return
    fi_info = _fi_info(runner)
    if fi_info is None:
        checks.append(Check("efa", FAIL, "fi_info not found (EFA software not installed?); "
                                         f"expected {expected.efa_interface_count} devices"))
        return
    result = runner.run((fi_info,) + FI_INFO_ARGS, mutating=False, check=False)
    # fi_info exits non-zero with "fi_getinfo: -61 (No data available)" when it finds no EFA device.
    domains = efa_rdm_domains(result.stdout) if result.ok else []
    status = OK if len(domains) == expected.efa_interface_count else FAIL
    detail = f"{len(domains)} EFA devices, expected {expected.efa_interface_count}"
    if not result.ok:
        detail += f" ({result.describe_failure()})"
    checks.append(Check("efa", status, detail))


def _fi_info(runner: Runner) -> str | None:
    return runner.which("fi_info")  # the EFA installer puts it in /opt/amazon/efa/bin (in EXTRA_TOOL_DIRS)


def summarize_xid_events(events: list[XidEvent]) -> str:
    """Each distinct event once, in order, for a check's detail."""
    seen = []
    for e in events:
        text = e.describe()
        if text not in seen:
            seen.append(text)
    more = f" ({len(events)} events)" if len(events) > len(seen) else ""
    return ", ".join(seen) + more


def _indexes(gpus: list[GpuInfo]) -> str:
    return ", ".join(str(g.index) for g in gpus)
