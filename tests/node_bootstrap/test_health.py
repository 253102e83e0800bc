"""The health gate and its parsers, fed with recorded nvidia-smi, fi_info and kernel-log output."""

from __future__ import annotations

import json

import pytest

from node_bootstrap.efa import efa_rdm_domains
from node_bootstrap.fp8_check import Fp8Probe
from node_bootstrap.gpu import GpuQueryError, parse_gpu_query, parse_remapped_rows
from node_bootstrap.health import FAIL, OK, WARN, HealthGateFailed, plan_health, run_health_checks
from node_bootstrap.xid import RESET, WATCH, parse_xid_lines


def _fp8(node, config):
    return Fp8Probe.for_node(config, node.host())


def report_for(node, config):
    return run_health_checks(config.expected, config.instance_type, node.runner, _fp8(node, config))


def statuses(report):
    return {c.name: c.status for c in report.checks}


def test_xid_fixtures_parse_and_classify(kit):
    journal = parse_xid_lines(kit.fixture_text("journal-kernel-xid.txt"))
    assert [(e.code, e.pci_bus_id) for e in journal] == [
        (13, "0000:75:00"), (13, "0000:75:00"), (79, "0000:b9:00")]
    assert journal[2].message.endswith("GPU has fallen off the bus.")
    dmesg = parse_xid_lines(kit.fixture_text("dmesg-xid.txt"))
    assert [(e.code, e.pci_bus_id, e.verdict.action) for e in dmesg] == [
        (48, "0000:53:00", RESET), (63, "0000:53:00", WATCH), (94, "0000:64:00", WATCH),
        (119, "0000:97:00", RESET)]
    assert parse_xid_lines(kit.fixture_text("journal-kernel-clean.txt")) == []


def test_gpu_and_remap_parsers(kit):
    gpus = parse_gpu_query(kit.fixture_text("nvidia-smi-query-gpu.p5.csv"))
    assert len(gpus) == 8
    assert gpus[7].index == 7 and gpus[7].pci_bus_id == "00000000:CA:00.0"
    assert gpus[0].name == "NVIDIA H100 80GB HBM3" and gpus[0].memory_total_mib == 81559
    no_ecc = parse_gpu_query(kit.fixture_text("nvidia-smi-query-gpu.ecc-na.csv"))
    assert no_ecc[0].ecc_uncorrected_volatile is None
    rows = parse_remapped_rows(kit.fixture_text("nvidia-smi-query-remapped-rows.pending.csv"))
    assert [r.pci_bus_id for r in rows if r.pending] == ["00000000:A8:00.0"]
    with pytest.raises(GpuQueryError, match="3 fields, expected 5"):
        parse_gpu_query("0, NVIDIA H100, 00000000:53:00.0\n")


def test_efa_devices_are_counted_once_per_domain(kit):
    assert len(efa_rdm_domains(kit.fixture_text("fi_info-efa-rdm.p5.txt"))) == 32  # 64 blocks, 32 devices
    assert len(efa_rdm_domains(kit.fixture_text("fi_info-efa-rdm.31-devices.txt"))) == 31


def test_a_healthy_p5_passes_every_check(fake_node, config):
    report = report_for(fake_node, config)
    assert statuses(report) == {"gpu-count": OK, "gpu-memory": OK, "gpu-ecc": OK, "gpu-row-remap": OK,
                                "fabric-manager": OK, "cuda-init": OK, "fp8": OK, "dcgm-diag": OK, "xid": OK,
                                "efa": OK}
    assert report.healthy
    assert fake_node.runner.mutating_calls == []
    plan = plan_health(config.expected, config.instance_type, fake_node.runner, _fp8(fake_node, config))
    assert plan.actions == [] and "OK efa: 32 EFA devices, expected 32" in plan.notes


@pytest.mark.parametrize("setup, check, detail", [
    (dict(gpu_csv="nvidia-smi-query-gpu.seven-gpus.csv"), "gpu-count",
     "7 GPUs (NVIDIA H100 80GB HBM3), expected 8"),
    (dict(gpu_csv="nvidia-smi-query-gpu.ecc-error.csv"), "gpu-ecc",
     "GPU 3 (00000000:86:00.0): 2 uncorrectable ECC errors"),
    (dict(remap_csv="nvidia-smi-query-remapped-rows.pending.csv"), "gpu-row-remap",
     "row remap pending (needs a GPU reset) on 00000000:A8:00.0"),
    (dict(kernel_log="journal-kernel-xid.txt"), "xid",
     "node unusable: Xid 79 on 0000:b9:00: GPU has fallen off the bus (no longer reachable over PCIe) "
     "(NVIDIA: RESTART_BM) (read: journalctl -k -b 0)"),
    (dict(fi_info_txt="fi_info-efa-rdm.31-devices.txt"), "efa", "31 EFA devices, expected 32"),
])
def test_each_hardware_fault_fails_the_gate(fake_node, config, setup, check, detail):
    for key, value in setup.items():
        setattr(fake_node, key, value)
    report = report_for(fake_node, config)
    failed = {c.name: c.detail for c in report.checks if c.status == FAIL}
    assert failed == {check: detail}
    with pytest.raises(HealthGateFailed) as err:
        plan_health(config.expected, config.instance_type, fake_node.runner, _fp8(fake_node, config))
    assert str(err.value) == f"health gate failed: {check}: {detail}"


def test_application_xids_only_warn(fake_node, config):
    fake_node.kernel_log = "journal-kernel-app-xid.txt"
    report = report_for(fake_node, config)
    assert report.healthy
    xid = next(c for c in report.checks if c.name == "xid")
    assert xid.status == WARN
    assert xid.detail == ("application faults: Xid 31 on 0000:75:00: GPU memory page fault "
                          "(illegal address from a kernel) (NVIDIA: RESTART_APP) (read: journalctl -k -b 0)")


def test_missing_ecc_counters_warn(fake_node, config):
    fake_node.gpu_csv = "nvidia-smi-query-gpu.ecc-na.csv"
    report = report_for(fake_node, config)
    assert statuses(report)["gpu-ecc"] == WARN and report.healthy


def test_missing_driver_and_efa_software_fail_with_reasons(fake_node, config):
    fake_node.runner.on_path -= {"nvidia-smi", "fi_info"}
    report = report_for(fake_node, config)
    failed = {c.name: c.detail for c in report.checks if c.status == FAIL}
    assert failed == {
        "gpu-count": "nvidia-smi not found: is the NVIDIA driver installed?",
        "efa": "fi_info not found (EFA software not installed?); expected 32 devices",
    }


def test_nvidia_smi_failing_is_a_failure_with_its_message(fake_node, config):
    fake_node.runner.on("nvidia-smi", lambda argv: (
        9, "NVIDIA-SMI has failed because it couldn't communicate with the NVIDIA driver.\n"))
    failed = {c.name: c.detail for c in report_for(fake_node, config).checks if c.status == FAIL}
    assert "couldn't communicate with the NVIDIA driver" in failed["gpu-count"]


def test_dmesg_is_the_fallback_kernel_log(fake_node, config, kit):
    fake_node.runner.on_path.discard("journalctl")
    fake_node.runner.on("dmesg", lambda argv: (0, kit.fixture_text("dmesg-xid.txt")))
    report = report_for(fake_node, config)
    assert "dmesg" in fake_node.runner.commands()
    assert [e.code for e in report.xid_events] == [48, 63, 94, 119]
    assert not report.healthy


def test_json_and_table_output(fake_node, config):
    fake_node.kernel_log = "journal-kernel-xid.txt"
    report = report_for(fake_node, config)
    data = json.loads(report.to_json())
    assert data["healthy"] is False and data["instanceType"] == "p5.48xlarge"
    assert [c["name"] for c in data["checks"]] == [
        "gpu-count", "gpu-memory", "gpu-ecc", "gpu-row-remap", "fabric-manager", "cuda-init", "fp8", "dcgm-diag",
        "xid", "efa"]
    assert data["xidEvents"][-1] == {
        "code": 79, "pciBusId": "0000:b9:00", "action": "replace",
        "reason": "Xid 79: GPU has fallen off the bus (no longer reachable over PCIe) (NVIDIA: RESTART_BM)",
        "message": "pid='<unknown>', name=<unknown>, GPU has fallen off the bus."}
    table = report.format_table().splitlines()
    assert table[0].split() == ["CHECK", "STATUS", "DETAIL"]
    assert table[9].startswith("xid             FAIL    node unusable")
    assert table[-1] == "p5.48xlarge: UNHEALTHY"


@pytest.mark.parametrize("lines, status, detail_start", [
    # Catalog IGNORE / RESTART_APP memory events: recorded, the node stays in service.
    (["NVRM: Xid (PCI:0000:53:00): 63, pid=2241, name=python3, Row Remapper: New row (0x40a1) was marked for "
      "remapping, reset gpu to activate.",
      "NVRM: Xid (PCI:0000:64:00): 94, pid=3012, name=python3, Contained: SM (0x1). RST: No, D-RST: No"],
     WARN, "recorded: Xid 63 on 0000:53:00"),
    (["NVRM: Xid (PCI:0000:97:00): 119, pid=3012, name=python3, Timeout after 6s of waiting for RPC response "
      "from GPU0 GSP!"], FAIL, "node unusable: Xid 119 on 0000:97:00: GSP RPC timeout"),
    (["NVRM: Xid (PCI:0000:97:00): 154, GPU recovery action changed from 0x0 (None) to 0x2 (Node Reboot "
      "Required)"], FAIL, "node unusable: Xid 154 on 0000:97:00: the driver now requires: Node Reboot Required"),
    (["NVRM: Xid (PCI:0000:97:00): 92, pid=1, name=x, High single-bit ECC error rate"], WARN,
     "recorded: Xid 92 on 0000:97:00: high single-bit ECC error rate"),
    (["NVRM: Xid (PCI:0000:97:00): 62, pid=1, name=x, 0000(0000) 00000000 00000000"], FAIL,
     "node unusable: Xid 62 on 0000:97:00: internal micro-controller halt"),
])
def test_the_gate_follows_the_xid_table(fake_node, config, lines, status, detail_start):
    log = "".join(f"2025-03-11T11:42:55+00:00 ip-10-0-12-34 kernel: {line}\n" for line in lines)
    fake_node.runner.on("journalctl", lambda argv: (0, log))
    xid = next(c for c in report_for(fake_node, config).checks if c.name == "xid")
    assert xid.status == status
    assert xid.detail.startswith(detail_start)
