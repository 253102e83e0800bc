"""One round's checks: the node's state now, and what is new in its kernel log since the last round.

Each check is ok / warn / fail, as in the boot gate (health.py, whose GPU and EFA checks it reuses); a fail
makes the node unhealthy, a warning is logged and counted in a metric:
- gpu-count, gpu-memory, gpu-ecc (uncorrectable ECC errors), gpu-row-remap (pending or failed): health.py;
- xid: Xid events new since the last round, classified by xid.py (NVIDIA's catalog): a replace- or
  reset-class event fails (a GPU reset would need the node drained, and on EC2 a replacement is the sure
  way back), an application or watch-class event warns;
- efa: the EFA device count (health.py): a device that disappeared fails;
- gpu-throttle: HW slowdown, HW thermal, HW power brake or SW thermal slowdown active on a GPU warns
  (nvidia-smi's clocks_event_reasons; the power cap, normal at full load, is not counted);
- nvlink: on NVSwitch systems a link reported <inactive> fails (DCGM's NVLink health watch treats a link
  down as a failure: NCCL would route around it slowly or not at all); a link below the speed of the
  others warns. Where nvidia-smi reports neither (an older driver, PCIe GPUs) the check is ok and says so.
The round (rounds.py) adds imds-block and imds-block-service (imds_block.py): the job user cannot reach the
instance metadata service, and cluster-imds-block.service did not fail at this boot; either failing fails.
"""

from __future__ import annotations

from dataclasses import dataclass

from node_bootstrap.config import ExpectedHardware
from node_bootstrap.gpu import (
    NVLINK_QUERY,
    THROTTLE_QUERY,
    GpuQueryError,
    parse_nvlink_status,
    parse_throttle_query,
)
from node_bootstrap.health import FAIL, OK, WARN, Check, efa_check, gpu_checks, summarize_xid_events
from node_bootstrap.monitor.kernel_log import KernelLogRead
from node_bootstrap.runner import Runner
from node_bootstrap.xid import IGNORE, UNUSABLE_ACTIONS, XidEvent, parse_xid_lines


@dataclass(frozen=True)
class RoundReport:
    checks: tuple[Check, ...]
    new_xid_events: tuple[XidEvent, ...]

    def with_checks(self, *checks: Check) -> RoundReport:
        return RoundReport(self.checks + checks, self.new_xid_events)

    @property
    def failures(self) -> list[Check]:
        return [c for c in self.checks if c.status == FAIL]

    @property
    def warnings(self) -> list[Check]:
        return [c for c in self.checks if c.status == WARN]

    @property
    def healthy(self) -> bool:
        return not self.failures

    def reason(self) -> str:
        """The failed checks in one line (the tag and the log carry it)."""
        return "; ".join(f"{c.name}: {c.detail}" for c in self.failures)

    def format_table(self) -> str:
        width = max([len("CHECK")] + [len(c.name) for c in self.checks])
        lines = [f"{'CHECK':<{width}}  {'STATUS':<6}  DETAIL"]
        lines += [f"{c.name:<{width}}  {c.status.upper():<6}  {c.detail}" for c in self.checks]
        return "\n".join(lines)


def run_round_checks(expected: ExpectedHardware, runner: Runner, kernel_log: KernelLogRead) -> RoundReport:
    checks = gpu_checks(expected, runner)
    events = parse_xid_lines(kernel_log.text) if kernel_log.ok else []
    checks.append(_xid_check(kernel_log, events))
    checks.append(efa_check(expected, runner))
    if any(c.name == "gpu-count" and c.status == FAIL for c in checks):
        # Already fatal; and nvidia-smi may be hanging on a GPU that fell off the bus until its timeout: asking
        # it twice more would only delay the response to what the round already found.
        skipped = "skipped: the GPU query failed"
        checks += [Check("gpu-throttle", OK, skipped), Check("nvlink", OK, skipped)]
    else:
        checks.append(_throttle_check(runner))
        checks.append(_nvlink_check(expected, runner))
    return RoundReport(tuple(checks), tuple(events))


def _xid_check(kernel_log: KernelLogRead, events: list[XidEvent]) -> Check:
    if not kernel_log.ok:
        return Check("xid", WARN, str(kernel_log.error))
    return xid_check(events)


def xid_check(events: list[XidEvent]) -> Check:
    """The new Xid events' verdict: the round's check, and the follower's (follow.py) on each kernel line."""
    fatal = [e for e in events if e.verdict.action in UNUSABLE_ACTIONS]
    other = [e for e in events if e.verdict.action not in UNUSABLE_ACTIONS and e.verdict.action != IGNORE]
    if fatal:
        return Check("xid", FAIL, "new: " + summarize_xid_events(fatal))
    if other:
        return Check("xid", WARN, "new, not acted on: " + summarize_xid_events(other))
    return Check("xid", OK, "no new Xid events")


def _throttle_check(runner: Runner) -> Check:
    result = runner.run(THROTTLE_QUERY, mutating=False, check=False)
    if not result.ok:
        return Check("gpu-throttle", OK, "not reported by nvidia-smi here: " + result.describe_failure())
    try:
        rows = parse_throttle_query(result.stdout)
    except GpuQueryError as e:
        return Check("gpu-throttle", OK, f"not reported by nvidia-smi here: {e}")
    throttled = [r for r in rows if r.active]
    if throttled:
        return Check("gpu-throttle", WARN, "; ".join(
            f"GPU {r.index} ({r.pci_bus_id}): {', '.join(r.active)}" for r in throttled))
    return Check("gpu-throttle", OK, "no thermal, power-brake or HW slowdown")


def _nvlink_check(expected: ExpectedHardware, runner: Runner) -> Check:
    if not expected.nvswitch:
        return Check("nvlink", OK, "no NVSwitch fabric on this instance type")
    result = runner.run(NVLINK_QUERY, mutating=False, check=False)
    gpus = parse_nvlink_status(result.stdout) if result.ok else []
    if not any(g.speeds_gbps or g.inactive for g in gpus):
        detail = result.describe_failure() if not result.ok else "no link status"
        return Check("nvlink", OK, f"not reported by nvidia-smi here ({detail})")
    down = [g for g in gpus if g.inactive]
    if down:
        return Check("nvlink", FAIL, "; ".join(
            f"GPU {g.gpu}: link {', '.join(str(n) for n in g.inactive)} inactive" for g in down))
    fastest = max(s for g in gpus for s in g.speeds_gbps.values())
    slow = [(g.gpu, link, speed) for g in gpus for link, speed in sorted(g.speeds_gbps.items()) if speed < fastest]
    if slow:
        return Check("nvlink", WARN, "; ".join(
            f"GPU {gpu} link {link} at {speed:g} GB/s (others {fastest:g})" for gpu, link, speed in slow))
    links = sum(len(g.speeds_gbps) for g in gpus)
    return Check("nvlink", OK, f"{links} links active on {len(gpus)} GPUs at {fastest:g} GB/s")

