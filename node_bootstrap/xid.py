"""NVIDIA Xid events from the kernel log, and what each means for the node: one table, shared by the boot
gate (health.py) and the node health monitor.

The driver logs `NVRM: Xid (PCI:0000:53:00): 79, pid=..., name=..., GPU has fallen off the bus.`

Sources, read in this order of authority:
- NVIDIA's Xid catalog for Ampere and newer GPUs, "Resolution Bucket (Immediate Action)" column
  (https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html): RESTART_APP, IGNORE, RESET_GPU,
  RESTART_BM, WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR, ... and the Xid 154 "recovery action" linkage.
- aws-samples/awsome-distributed-training, 4.validation_and_observability/2.gpu-cluster-healthcheck/checks/
  0-nvidia-smi-check.sh ("aligned with NVIDIA XID Errors r590 catalog"): 63/92/43 informational, 94/13/31
  restart the application, 64/95/119/120 reset, 79 bare-metal restart, 154 read for its derived action.
- aws/eks-node-monitoring-agent's DCGM policy list (46, 48, 54, 62, 64, 74, 79, 95, 109, 110, 119, 120,
  136, 140, 143, 151, 155, 156, 158 are fatal there), which quotes the same catalog buckets.

What the actions mean here (EC2: a GPU cannot be serviced in place; "replace" is a new instance on other
hardware, "reset" is `nvidia-smi -r` or a reboot of this one):
- replace: the node must be replaced (the catalog's RESTART_BM or CHECK_MECHANICALS, or a failure that leaves
  no repair path such as a row remap failure);
- reset:   a GPU reset or reboot clears it (RESET_GPU, WORKFLOW_XID_48, WORKFLOW_NVLINK_ERR, RESTART_VM);
  the node is not usable until then;
- app:     the application's fault (RESTART_APP with CHECK_APP/CUDA, or the channel clean-up after it);
  the GPU stays healthy;
- watch:   warn and record (informational in the catalog but a trend worth seeing, or a code we do not know);
- ignore:  nothing to do (Xid 154 reporting that the recovery action went back to None).

Unknown codes are "watch", never "ignore": a new driver's code must not pass silently.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

REPLACE = "replace"
RESET = "reset"
APP = "app"
WATCH = "watch"
IGNORE = "ignore"
# From least to most severe; the monitor and the gate compare actions by this order.
ACTIONS = (IGNORE, APP, WATCH, RESET, REPLACE)
# A node whose kernel log holds one of these since boot does not take jobs.
UNUSABLE_ACTIONS = frozenset({RESET, REPLACE})

CATALOG_URL = "https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html"


@dataclass(frozen=True)
class XidVerdict:
    code: int
    action: str  # one of ACTIONS
    reason: str  # one line: the catalog's meaning and why this action

    @property
    def severity(self) -> int:
        """Position in ACTIONS: higher is worse."""
        return ACTIONS.index(self.action)


@dataclass(frozen=True)
class _Entry:
    action: str
    meaning: str  # the catalog's description
    bucket: str  # the catalog's immediate action, quoted


# code -> (our action, the catalog's description, the catalog's immediate-action bucket).
_TABLE: dict[int, _Entry] = {
    # The application's fault; the GPU stays usable.
    8: _Entry(APP, "GPU stopped processing (channel idle timeout)", "RESTART_APP"),
    11: _Entry(APP, "invalid or corrupted push buffer stream", "RESTART_APP, investigate CHECK_APP/CUDA"),
    13: _Entry(APP, "graphics engine exception (out-of-range address, illegal instruction in a kernel)",
               "RESTART_APP"),
    31: _Entry(APP, "GPU memory page fault (illegal address from a kernel)", "RESTART_APP"),
    32: _Entry(APP, "invalid or corrupted push buffer stream", "RESTART_APP, investigate CHECK_APP/CUDA"),
    43: _Entry(APP, "GPU stopped processing: a user process faulted and its channel was reset", "IGNORE"),
    45: _Entry(APP, "preemptive cleanup after a previous error (killed process or an earlier Xid)",
               "WORKFLOW_XID_45: look at the Xid before it"),
    137: _Entry(APP, "NVLink privilege error: an illegal peer-to-peer access reported by the remote MMU",
                "IGNORE, investigate XID_137_FLOW"),
    # Memory. 63, 92 and 94 are informational or contained in the catalog: not a reason to replace a node.
    48: _Entry(RESET, "double-bit (uncorrectable) ECC error", "WORKFLOW_XID_48: solo RESET_GPU, "
               "with 63/64 DRAIN_AND_RESET"),
    63: _Entry(WATCH, "row remapping event: a bad row was recorded for remapping, active after a GPU reset",
               "IGNORE"),
    64: _Entry(REPLACE, "row remapping failure: the GPU could not remap a bad row (no spare rows left)",
               "RESET_GPU; AWS: remap failure needs a stop/start onto healthy hardware"),
    92: _Entry(WATCH, "high single-bit ECC error rate", "IGNORE; watch for 48/64"),
    94: _Entry(WATCH, "contained ECC error: only the application that touched the memory was stopped",
               "RESTART_APP"),
    95: _Entry(RESET, "uncontained ECC error: every application on the GPU is affected", "RESET_GPU"),
    140: _Entry(RESET, "unrecovered ECC error", "RESET_GPU"),
    156: _Entry(RESET, "resource retirement event", "RESET_GPU"),
    157: _Entry(REPLACE, "resource retirement failure: no repair is possible for lack of spare resources",
                "IGNORE, investigate CONTACT_SUPPORT; on EC2 the path off the hardware is a new instance"),
    # Driver, firmware and the GPU System Processor.
    46: _Entry(RESET, "GPU stopped processing", "RESET_GPU"),
    61: _Entry(RESET, "internal micro-controller breakpoint/warning", "treated like 62 (RESET_GPU): the "
               "micro-controller stopped; sources differ, see module docstring"),
    62: _Entry(RESET, "internal micro-controller halt", "RESET_GPU"),
    109: _Entry(RESET, "context switch timeout", "RESET_GPU"),
    110: _Entry(RESET, "security fault", "RESET_GPU"),
    119: _Entry(RESET, "GSP RPC timeout (the GPU System Processor did not answer the driver)", "RESET_GPU"),
    120: _Entry(RESET, "GSP error (the GPU System Processor reported an error)", "RESET_GPU"),
    143: _Entry(RESET, "GPU initialization error", "RESET_GPU"),
    151: _Entry(RESET, "key rotation error", "RESTART_VM"),
    158: _Entry(RESET, "GPU fatal timeout", "RESET_GPU"),
    # Interconnect.
    74: _Entry(RESET, "NVLink error (this GPU's link or the device at its far end)",
               "WORKFLOW_NVLINK_ERR: reset the GPU or reboot; replace if it recurs"),
    136: _Entry(RESET, "NVLink link training failed", "RESET_GPU"),
    155: _Entry(RESET, "NVLink software-defined error", "RESET_GPU"),
    # Board and bus: nothing on the node can bring the GPU back.
    54: _Entry(REPLACE, "auxiliary power not connected", "CHECK_MECHANICALS"),
    79: _Entry(REPLACE, "GPU has fallen off the bus (no longer reachable over PCIe)", "RESTART_BM"),
}
# NVLink 5 (Blackwell: p6) codes need the catalog's intrInfo/errorStatus decode table before they have a verdict.
for _code in range(144, 151):
    _TABLE[_code] = _Entry(WATCH, "NVLink 5 error (Blackwell)", "WORKFLOW_NVLINK5_ERR: decode intrInfo/errorStatus")
# Qualifiers the driver logs next to an Xid 48 (which memory faulted); the 48 itself carries the verdict.
_TABLE[171] = _Entry(WATCH, "uncorrectable DRAM error (qualifies an Xid 48)", "follow Xid 48")
_TABLE[172] = _Entry(WATCH, "uncorrectable SRAM error (qualifies an Xid 48)", "follow Xid 48; check SRAM threshold")
del _code

# Xid 154: "GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)". The catalog's
# "Xid 154 linkage" column names the action the driver now requires; the text after "to" is what counts.
_RECOVERY_TARGET = re.compile(r"\bto\s+(?:0x[0-9A-Fa-f]+\s*)?\(([^)]*)\)")
_RECOVERY_ACTIONS = {
    "none": IGNORE,
    "gpu reset required": RESET,
    "node reboot required": RESET,
    "drain and reset": RESET,
    "drain p2p": RESET,
}


def classify_xid(code: int, message: str = "") -> XidVerdict:
    """What Xid `code` (with the driver's message, needed for 154) means for the node."""
    if code == 154:
        return _classify_recovery_action(message)
    entry = _TABLE.get(code)
    if entry is None:
        return XidVerdict(code, WATCH, f"Xid {code} is not in our table: recorded for a human ({CATALOG_URL})")
    return XidVerdict(code, entry.action, f"Xid {code}: {entry.meaning} (NVIDIA: {entry.bucket})")


def _classify_recovery_action(message: str) -> XidVerdict:
    match = _RECOVERY_TARGET.search(message)
    target = match.group(1).strip() if match else ""
    action = _RECOVERY_ACTIONS.get(target.lower())
    if action is None:
        shown = target or message.strip() or "no action text"
        return XidVerdict(154, WATCH, f"Xid 154: GPU recovery action changed to an unrecognised value ({shown})")
    return XidVerdict(154, action, f"Xid 154: the driver now requires: {target}")


@dataclass(frozen=True)
class XidEvent:
    code: int
    pci_bus_id: str  # as the driver prints it: 0000:53:00, or 0000:53:00.0 with the function
    message: str  # the driver's text after the code (pid, name, description)
    raw: str  # the whole log line, with its timestamp

    @property
    def verdict(self) -> XidVerdict:
        return classify_xid(self.code, self.message)

    def describe(self) -> str:
        """`Xid 79 on 0000:b9:00: GPU has fallen off the bus (...)`, for check details and logs."""
        reason = self.verdict.reason
        prefix = f"Xid {self.code}: "
        if reason.startswith(prefix):
            reason = reason[len(prefix):]
        return f"Xid {self.code} on {self.pci_bus_id}: {reason}"


# "NVRM: Xid (PCI:0000:53:00): 79, pid=1234, name=python, GPU has fallen off the bus."
# The bus id sometimes carries a function (".0"); older drivers print "Xid (0000:53:00)" without "PCI:".
# NVSwitch "SXid" lines come from nvidia-nvswitch, not NVRM, and do not match.
_XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)\): (\d+),?\s*(.*)$")


def parse_xid_lines(text: str) -> list[XidEvent]:
    """Every Xid line in dmesg or journalctl output, in order (timestamps and prefixes are ignored)."""
    events = []
    for line in text.splitlines():
        match = _XID_LINE.search(line)
        if match:
            events.append(XidEvent(int(match.group(2)), match.group(1).rstrip(":."), match.group(3).strip(),
                                   line.rstrip()))
    return events


def worst(verdicts) -> XidVerdict | None:
    """The most severe verdict (the first one among equals), or None for none."""
    result = None
    for verdict in verdicts:
        if result is None or verdict.severity > result.severity:
            result = verdict
    return result
