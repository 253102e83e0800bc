"""What the health monitor counts as a fault and what as a warning, end to end (node_monitor_support): an
application Xid, a lost EFA device, throttling, NVLink, ECC and row remaps, a hanging nvidia-smi, and tools too
old to report some of it."""

from __future__ import annotations

import json

import pytest
from node_monitor_support import group_health, instance_tags, published, run_json


def test_an_application_xid_is_a_warning_only(monitored, kit):
    node = monitored
    assert node.round() == 0
    node.journal.append(*kit.fixture_text("journal-kernel-app-xid.txt").splitlines()[1:])  # the Xid 31
    assert node.round() == 0
    assert published(node, "NodeHealthWarnings") == [1] and published(node, "NodeUnhealthy") == [0]
    assert instance_tags(node.instance_id) == {} and group_health(node.instance_id) == "Healthy"
    assert [c for c in node.runner.commands(mutating=True) if "put-metric-data" not in c] == []
    log = (node.root / "var/log/cluster/health-monitor.log").read_text()
    assert "WARNING monitor: WARN xid: new, not acted on: Xid 31 on 0000:75:00: GPU memory page fault" in log


def test_an_efa_device_that_disappears_makes_the_node_unhealthy(monitored):
    node = monitored
    assert node.round() == 0
    node.fi_info_txt = "fi_info-efa-rdm.31-devices.txt"
    assert node.round() == 1
    assert instance_tags(node.instance_id)["cluster:health-reason"] == (
        "health monitor: efa: 31 EFA devices, expected 32")
    assert group_health(node.instance_id) == "Unhealthy"


@pytest.mark.parametrize("setup, status, detail", [
    (dict(throttle_csv="nvidia-smi-query-throttle.thermal.csv"), "warn",
     "GPU 2 (00000000:75:00.0): HW thermal slowdown; GPU 6 (00000000:B9:00.0): HW slowdown, HW thermal slowdown"),
    (dict(nvlink_txt="nvidia-smi-nvlink-status.link-down.txt"), "fail", "GPU 5: link 7, 8 inactive"),
    (dict(nvlink_txt="nvidia-smi-nvlink-status.degraded.txt"), "warn",
     "GPU 3 link 4 at 1.562 GB/s (others 26.562)"),
    (dict(gpu_csv="nvidia-smi-query-gpu.ecc-error.csv"), "fail",
     "GPU 3 (00000000:86:00.0): 2 uncorrectable ECC errors"),
    (dict(remap_csv="nvidia-smi-query-remapped-rows.pending.csv"), "fail",
     "row remap pending (needs a GPU reset) on 00000000:A8:00.0"),
])
def test_throttling_nvlink_ecc_and_row_remaps(monitored, setup, status, detail):
    node = monitored
    for key, value in setup.items():
        setattr(node, key, value)
    report = json.loads(run_json(node))
    found = [c for c in report["checks"] if c["status"] != "ok"]
    assert [(c["status"], c["detail"]) for c in found] == [(status, detail)]
    assert report["healthy"] is (status == "warn")


def test_healthy_p5_report_names_every_check(monitored):
    report = json.loads(run_json(monitored))
    assert {c["name"]: c["status"] for c in report["checks"]} == {
        "gpu-count": "ok", "gpu-memory": "ok", "gpu-ecc": "ok", "gpu-row-remap": "ok", "xid": "ok", "efa": "ok",
        "gpu-throttle": "ok", "nvlink": "ok", "imds-block": "ok", "imds-block-service": "ok"}
    nvlink = {c["name"]: c["detail"] for c in report["checks"]}["nvlink"]
    assert nvlink == "144 links active on 8 GPUs at 26.562 GB/s"


def test_tools_that_do_not_report_throttling_or_nvlink_are_not_a_warning(monitored):
    node = monitored
    original = node.runner.handlers["nvidia-smi"]

    def old_driver(argv):
        if "clocks_event_reasons" in argv[1] or argv[1] == "nvlink":
            return 2, "", 'Field "clocks_event_reasons.hw_slowdown" is not a valid field to query.'
        return original(argv)
    node.runner.on("nvidia-smi", old_driver)
    report = json.loads(run_json(node))
    details = {c["name"]: (c["status"], c["detail"]) for c in report["checks"]}
    assert details["gpu-throttle"][0] == "ok" and details["gpu-throttle"][1].startswith("not reported")
    assert details["nvlink"][0] == "ok" and details["nvlink"][1].startswith("not reported")


def test_a_hanging_nvidia_smi_is_fatal_and_not_asked_again(monitored):
    node = monitored
    calls = []

    def hanging(argv):
        calls.append(argv)
        return 124, "", "timed out after 120 s; still not gone 5 s after SIGKILL (stuck in the kernel?)"
    node.runner.on("nvidia-smi", hanging)
    assert node.round() == 1
    assert len(calls) == 1  # the GPU query; not the throttle and NVLink queries after it
    assert instance_tags(node.instance_id)["cluster:health-reason"].startswith("health monitor: gpu-count: ")
    assert group_health(node.instance_id) == "Unhealthy"
