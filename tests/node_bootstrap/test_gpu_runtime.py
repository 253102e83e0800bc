"""What breaks every job while nvidia-smi looks fine: Fabric Manager, a CUDA context per GPU, DCGM's short
diagnostic; and the kernel log source the Xid check reads."""

from __future__ import annotations

import ctypes
import json

import pytest

from node_bootstrap import cuda_probe
from node_bootstrap.fp8_check import Fp8Probe
from node_bootstrap.gpu_runtime import parse_dcgm_diag
from node_bootstrap.health import FAIL, OK, WARN, HealthGateFailed, plan_health, run_health_checks

NOT_READY = ("cuDevicePrimaryCtxRetain: CUDA_ERROR_SYSTEM_NOT_READY (802)")


def _fp8(node, config):
    return Fp8Probe.for_node(config, node.host())


def checks_of(node, config):
    report = run_health_checks(config.expected, config.instance_type, node.runner, _fp8(node, config))
    return {c.name: c for c in report.checks}


def test_fabric_manager_down_makes_the_node_unhealthy(fake_node, config):
    fake_node.units["nvidia-fabricmanager"] = "failed"
    fabric = checks_of(fake_node, config)["fabric-manager"]
    assert (fabric.status, fabric.detail) == (FAIL, (
        "nvidia-fabricmanager is failed: on NVSwitch GPUs every CUDA job fails with error 802 (system not ready) "
        "until it runs; see `systemctl status nvidia-fabricmanager`"))
    with pytest.raises(HealthGateFailed, match="fabric-manager: nvidia-fabricmanager is failed"):
        plan_health(config.expected, config.instance_type, fake_node.runner, _fp8(fake_node, config))
    assert "systemctl is-active nvidia-fabricmanager" in fake_node.runner.commands(mutating=False)


def test_fabric_manager_is_not_asked_for_without_nvswitch(fake_node, kit):
    from node_bootstrap.config import parse_node_config

    expected = {"gpuCount": 8, "gpuMemoryGiB": 80, "efaInterfaceCount": 32, "nvmeDeviceCount": 8, "nvswitch": False,
                "fp8": True}
    config = parse_node_config(kit.node_config_dict(expected=expected))
    fake_node.units["nvidia-fabricmanager"] = "inactive"
    assert checks_of(fake_node, config)["fabric-manager"].status == OK


def test_cuda_error_802_on_every_gpu_fails_the_gate(fake_node, config):
    fake_node.cuda_probe = {"ok": False, "error": None, "count": 8,
                            "devices": [{"index": i, "ok": False, "error": NOT_READY} for i in range(8)]}
    cuda = checks_of(fake_node, config)["cuda-init"]
    assert cuda.status == FAIL
    assert cuda.detail.startswith(f"GPU 0: {NOT_READY}; GPU 1: {NOT_READY}")


@pytest.mark.parametrize("probe, detail", [
    ({"ok": False, "error": "cuInit: CUDA_ERROR_NO_DEVICE (100)", "count": 0, "devices": []},
     "cuInit: CUDA_ERROR_NO_DEVICE (100)"),
    ({"ok": True, "error": None, "count": 7, "devices": [{"index": i, "ok": True, "error": None} for i in range(7)]},
     "CUDA sees 7 GPUs, expected 8"),
])
def test_cuda_init_failures_name_the_cause(fake_node, config, probe, detail):
    fake_node.cuda_probe = probe
    assert checks_of(fake_node, config)["cuda-init"].detail == detail


def test_a_hung_cuda_probe_fails_instead_of_hanging(fake_node, config):
    import os
    import sys

    fake_node.runner.on(os.path.basename(sys.executable),
                        lambda argv: (124, "", "timed out after 180 s and was killed"), on_path=False)
    cuda = checks_of(fake_node, config)["cuda-init"]
    assert (cuda.status, cuda.detail) == (
        FAIL, "creating CUDA contexts did not finish: timed out after 180 s and was killed")


class FakeLibCuda:
    """libcuda's driver API as ctypes calls it: results are CUresult ints, outputs written through pointers."""

    def __init__(self, count, retain_results):
        self.count, self.retain_results, self.released = count, retain_results, []

    def cuInit(self, flags):  # noqa: N802 (the driver API's names)
        return 0

    def cuDeviceGetCount(self, count_ref):  # noqa: N802
        count_ref._obj.value = self.count
        return 0

    def cuDeviceGet(self, device_ref, ordinal):  # noqa: N802
        device_ref._obj.value = ordinal
        return 0

    def cuDevicePrimaryCtxRetain(self, context_ref, device):  # noqa: N802
        return self.retain_results[device.value]

    def cuDevicePrimaryCtxRelease_v2(self, device):  # noqa: N802
        self.released.append(device.value)
        return 0

    def cuGetErrorName(self, code, name_ref):  # noqa: N802
        names = {802: b"CUDA_ERROR_SYSTEM_NOT_READY"}
        if code not in names:
            return 1
        name_ref._obj.value = names[code]
        return 0


def test_the_probe_makes_and_releases_a_context_per_device_and_names_errors():
    lib = FakeLibCuda(3, [0, 802, 0])
    report = cuda_probe.probe(lib)
    assert report == {"ok": False, "error": None, "count": 3, "devices": [
        {"index": 0, "ok": True, "error": None},
        {"index": 1, "ok": False, "error": "cuDevicePrimaryCtxRetain: CUDA_ERROR_SYSTEM_NOT_READY (802)"},
        {"index": 2, "ok": True, "error": None}]}
    assert lib.released == [0, 2]
    assert json.loads(json.dumps(report)) == report
    assert isinstance(ctypes.c_int(0).value, int)


def test_the_probe_without_a_driver_says_so(monkeypatch, capsys):
    def no_driver(name):
        raise OSError(f"{name}: cannot open shared object file: No such file or directory")

    monkeypatch.setattr(cuda_probe.ctypes, "CDLL", no_driver)
    assert cuda_probe.main() == 1
    report = json.loads(capsys.readouterr().out)
    assert report["error"].startswith("cannot load libcuda.so.1 (is the NVIDIA driver installed?)")


def test_dcgm_short_diagnostic_passes_and_fails(fake_node, config, kit):
    fake_node.runner.on("dcgmi", lambda argv: (0, kit.fixture_text("dcgmi-diag-r1.pass.json")))
    dcgm = checks_of(fake_node, config)["dcgm-diag"]
    assert (dcgm.status, dcgm.detail) == (OK, "dcgmi diag -r 1: 9 tests, none failed")
    assert "dcgmi diag -r 1 -j" in fake_node.runner.commands(mutating=False)
    fake_node.runner.on("dcgmi", lambda argv: (226, kit.fixture_text("dcgmi-diag-r1.fail.json")))
    dcgm = checks_of(fake_node, config)["dcgm-diag"]
    assert (dcgm.status, dcgm.detail) == (FAIL, (
        "dcgmi diag -r 1: Page Retirement/Row Remap failed on GPU 3: GPU 3 had uncorrectable memory errors and row "
        "remapping failed. Run a field diagnostic on the GPU."))


def test_dcgm_without_its_host_engine_only_warns_and_without_dcgm_is_skipped(fake_node, config):
    fake_node.runner.on("dcgmi", lambda argv: (
        255, "", "Error: unable to establish a connection to the specified host: localhost\n"
                 "Error: Unable to connect to host engine. Host engine connection invalid/disconnected.\n"))
    assert checks_of(fake_node, config)["dcgm-diag"].status == WARN
    fake_node.runner.on_path.discard("dcgmi")
    skipped = checks_of(fake_node, config)["dcgm-diag"]
    assert (skipped.status, skipped.detail) == (OK, "dcgmi is not installed on this AMI: skipped")


def test_dcgm_4_reports_parse_too():
    text = json.dumps({"DCGM Diagnostic": {"test_categories": [{"category": "Hardware", "tests": [
        {"name": "memory", "results": [{"entity_id": 5, "status": "Fail",
                                         "warnings": [{"message": "Memory test failed"}]}]}]}]}})
    (test,) = parse_dcgm_diag(text)
    assert test.describe() == "memory failed on GPU 5: Memory test failed"
    assert parse_dcgm_diag("Error: no GPUs") is None


def test_an_empty_journal_falls_back_to_the_ring_buffer_and_says_so(fake_node, config, kit):
    fake_node.kernel_log = "journal-kernel-empty.txt"
    fake_node.runner.on("dmesg", lambda argv: (0, kit.fixture_text("dmesg-xid.txt")))
    xid = checks_of(fake_node, config)["xid"]
    commands = fake_node.runner.commands(mutating=False)
    assert commands.index("dmesg") > commands.index("journalctl -k -b 0 --no-pager -o short-iso")
    assert xid.status == FAIL
    assert xid.detail.endswith(
        "(read: dmesg, the kernel ring buffer (the journal had no kernel messages for this boot))")
    assert "Xid 48 on 0000:53:00" in xid.detail


def test_a_clean_ring_buffer_read_after_an_empty_journal_names_its_source(fake_node, config, kit):
    fake_node.kernel_log = "journal-kernel-empty.txt"
    fake_node.runner.on("dmesg", lambda argv: (0, kit.fixture_text("dmesg-clean.txt")))
    xid = checks_of(fake_node, config)["xid"]
    assert (xid.status, xid.detail) == (OK, "no Xid events since boot (read: dmesg, the kernel ring buffer "
                                            "(the journal had no kernel messages for this boot))")
