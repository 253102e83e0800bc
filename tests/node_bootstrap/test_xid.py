"""The shared Xid table: each class of NVIDIA's catalog, Xid 154's action text, and the kernel-log parser."""

from __future__ import annotations

import pytest

from node_bootstrap.xid import (
    ACTIONS,
    APP,
    IGNORE,
    REPLACE,
    RESET,
    UNUSABLE_ACTIONS,
    WATCH,
    XidVerdict,
    classify_xid,
    parse_xid_lines,
    worst,
)


@pytest.mark.parametrize("code, action", [
    (79, REPLACE),  # fell off the bus: RESTART_BM
    (54, REPLACE),  # auxiliary power: CHECK_MECHANICALS
    (64, REPLACE),  # row remap failure: no spare rows left
    (48, RESET),  # double-bit ECC: WORKFLOW_XID_48
    (95, RESET),  # uncontained ECC: RESET_GPU
    (63, WATCH),  # row remap recorded: catalog IGNORE, not a replacement
    (94, WATCH),  # contained ECC: catalog RESTART_APP, not a replacement
    (92, WATCH),  # high single-bit rate: catalog IGNORE
    (119, RESET), (120, RESET),  # GSP: RESET_GPU
    (61, RESET), (62, RESET),  # micro-controller breakpoint / halt
    (74, RESET),  # NVLink: WORKFLOW_NVLINK_ERR
    (13, APP), (31, APP), (43, APP), (45, APP),
    (147, WATCH),  # NVLink 5 needs its decode table
])
def test_each_catalog_class(code, action):
    verdict = classify_xid(code)
    assert verdict == XidVerdict(code, action, verdict.reason)
    assert verdict.reason.startswith(f"Xid {code}: ") and "\n" not in verdict.reason


def test_reasons_quote_the_catalog_bucket():
    assert classify_xid(79).reason == (
        "Xid 79: GPU has fallen off the bus (no longer reachable over PCIe) (NVIDIA: RESTART_BM)")
    assert "NVIDIA: IGNORE" in classify_xid(63).reason
    assert "NVIDIA: RESTART_APP" in classify_xid(94).reason


def test_unknown_codes_are_watched_not_ignored():
    verdict = classify_xid(999, "something new")
    assert verdict.action == WATCH
    assert verdict.reason == ("Xid 999 is not in our table: recorded for a human "
                              "(https://docs.nvidia.com/deploy/xid-errors/analyzing-xid-catalog.html)")


@pytest.mark.parametrize("message, action, shown", [
    ("GPU recovery action changed from 0x0 (None) to 0x1 (GPU Reset Required)", RESET, "GPU Reset Required"),
    ("GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot Required)", RESET, "Node Reboot Required"),
    ("GPU recovery action changed from 0x0 (None) to 0x4 (Drain P2P)", RESET, "Drain P2P"),
    ("GPU recovery action changed from 0x0 (None) to 0x5 (Drain and Reset)", RESET, "Drain and Reset"),
    # The action went back to None: the "from" text must not be read as the requirement.
    ("GPU recovery action changed from 0x1 (GPU Reset Required) to 0x0 (None)", IGNORE, "None"),
])
def test_xid_154_reads_the_action_it_changed_to(message, action, shown):
    verdict = classify_xid(154, message)
    assert verdict.action == action
    assert verdict.reason == f"Xid 154: the driver now requires: {shown}"


def test_xid_154_with_unreadable_text_is_watched():
    assert classify_xid(154, "GPU recovery action changed to 0x9 (Reticulate Splines)") == XidVerdict(
        154, WATCH, "Xid 154: GPU recovery action changed to an unrecognised value (Reticulate Splines)")
    assert classify_xid(154).action == WATCH


def test_parse_journal_dmesg_and_old_driver_lines():
    text = "\n".join([
        "2025-03-11T12:03:19+00:00 ip-10-0-12-34 kernel: NVRM: Xid (PCI:0000:b9:00): 79, pid='<unknown>', "
        "name=<unknown>, GPU has fallen off the bus.",
        "[ 1204.118832] NVRM: Xid (0000:64:00): 94, pid=3012, name=python3, Contained: SM (0x1). RST: No, D-RST: No",
        "[ 1300.5] NVRM: Xid (PCI:0000:97:00.0): 154, GPU recovery action changed from 0x0 (None) to 0x1 "
        "(GPU Reset Required)",
        # NVSwitch errors are SXids from another driver: not GPU Xids.
        "[ 1400.1] nvidia-nvswitch2: SXid (PCI:0000:07:00.0): 12028, Non-fatal, Link 32 egress non-posted PRIV error",
        "[ 1500.2] NVRM: GPU at PCI:0000:b9:00: GPU-1d2e3f40-0000-0000-0000-000000000000",
    ])
    events = parse_xid_lines(text)
    assert [(e.code, e.pci_bus_id) for e in events] == [(79, "0000:b9:00"), (94, "0000:64:00"), (154, "0000:97:00.0")]
    assert events[0].message == "pid='<unknown>', name=<unknown>, GPU has fallen off the bus."
    assert events[0].raw.startswith("2025-03-11T12:03:19+00:00 ")
    assert [e.verdict.action for e in events] == [REPLACE, WATCH, RESET]
    assert events[2].describe() == "Xid 154 on 0000:97:00.0: the driver now requires: GPU Reset Required"
    assert parse_xid_lines("") == []


def test_worst_orders_by_severity():
    verdicts = [classify_xid(13), classify_xid(63), classify_xid(48), classify_xid(31)]
    assert worst(verdicts).code == 48
    assert worst([]) is None
    assert ACTIONS.index(REPLACE) > ACTIONS.index(RESET) > ACTIONS.index(WATCH) > ACTIONS.index(APP)
    assert UNUSABLE_ACTIONS == {RESET, REPLACE}
