"""NVIDIA Xid events from the kernel log, and what each means for the node.

The driver logs `NVRM: Xid (PCI:0000:53:00): 79, pid=..., GPU has fallen off the bus.` Codes and meanings
follow NVIDIA's "Xid Errors" catalog (docs.nvidia.com/deploy/xid-errors). The split decides a node's
fate: hardware codes mean the node must be replaced; application codes are a job's bug (an illegal address, a
kernel exception) and leave the node usable; anything else is reported for a human to judge.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

REPLACE_NODE = "replace-node"
APPLICATION = "application"
UNCLASSIFIED = "unclassified"

XID_MEANINGS = {
    13: "graphics engine exception",
    31: "GPU memory page fault",
    43: "GPU stopped processing (channel reset)",
    48: "double-bit ECC error",
    63: "ECC page retirement or row remapping event",
    64: "ECC page retirement or row remapping failure",
    74: "NVLink error",
    79: "GPU has fallen off the bus",
    94: "contained ECC error",
    95: "uncontained ECC error",
}
REPLACE_NODE_XIDS = frozenset({48, 63, 64, 74, 79, 94, 95})
APPLICATION_XIDS = frozenset({13, 31, 43})

# "NVRM: Xid (PCI:0000:53:00): 79, pid=1234, name=python, GPU has fallen off the bus."
# The bus id sometimes carries a function (".0"); some drivers print "Xid (0000:53:00)" without "PCI:".
_XID_LINE = re.compile(r"NVRM: Xid \((?:PCI:)?([0-9A-Fa-f:.]+)\): (\d+),?\s*(.*)$")


@dataclass(frozen=True)
class XidEvent:
    xid: int
    pci_bus_id: str  # e.g. 0000:53:00
    message: str  # the rest of the driver's line

    @property
    def severity(self) -> str:
        return classify_xid(self.xid)

    @property
    def meaning(self) -> str:
        return XID_MEANINGS.get(self.xid, "see NVIDIA's Xid catalog")

    def describe(self) -> str:
        return f"Xid {self.xid} on {self.pci_bus_id} ({self.meaning})"


def classify_xid(xid: int) -> str:
    if xid in REPLACE_NODE_XIDS:
        return REPLACE_NODE
    if xid in APPLICATION_XIDS:
        return APPLICATION
    return UNCLASSIFIED


def parse_xid_events(kernel_log: str) -> list[XidEvent]:
    """Every Xid line in dmesg or journalctl output, in order (timestamps and prefixes are ignored)."""
    events = []
    for line in kernel_log.splitlines():
        match = _XID_LINE.search(line)
        if match:
            events.append(XidEvent(int(match.group(2)), match.group(1).rstrip(":."), match.group(3).strip()))
    return events
