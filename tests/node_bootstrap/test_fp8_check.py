"""The health gate's fp8 check: the jobs' interpreter imports the node's FP8 backends and multiplies in FP8 on
every GPU (fake node), and the probe itself run for real on the CPU."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import pytest

from node_bootstrap.config import parse_node_config
from node_bootstrap.fp8_check import Fp8Probe, check_fp8
from node_bootstrap.health import FAIL, OK, HealthGateFailed, plan_health, run_health_checks

PROBE = Path(__file__).resolve().parents[2] / "node_bootstrap" / "fp8_probe.py"


def fp8_of(node, config):
    report = run_health_checks(config.expected, config.instance_type, node.runner, probe_of(node, config))
    return {c.name: c for c in report.checks}.get("fp8")


def probe_of(node, config):
    return Fp8Probe.for_node(config, node.host())


def test_a_good_p5_passes_and_says_what_it_proved(fake_node, config):
    check = fp8_of(fake_node, config)
    assert (check.status, check.detail) == (OK, "torchao 0.18.0 imports with torch 2.13.0+cu130; an FP8 matmul "
                                                "(torch._scaled_mm, e4m3) on each of the 8 GPUs")
    (probe,) = [c for c in fake_node.runner.commands() if "fp8_probe.py" in c]
    assert probe == (f"{fake_node.path('/opt/pytorch/bin/python')} "
                     f"{fake_node.path('/opt/cluster/bundle/node_bootstrap/fp8_probe.py')} --backends torchao "
                     "--device cuda")


def test_one_gpu_that_cannot_multiply_fails_the_gate_naming_it(fake_node, config):
    report = fake_node.ami_python.fp8_probe
    report["ok"] = False
    report["devices"][3].update(ok=False, error="RuntimeError: CUDA error: an illegal memory access was encountered")
    with pytest.raises(HealthGateFailed) as err:
        plan_health(config.expected, config.instance_type, fake_node.runner, probe_of(fake_node, config))
    assert str(err.value) == ("health gate failed: fp8: GPU 3 (NVIDIA H100 80GB HBM3): FP8 matmul failed: "
                              "RuntimeError: CUDA error: an illegal memory access was encountered")


def test_a_backend_that_does_not_import_fails(fake_node, config):
    fake_node.ami_python.fp8_probe = {
        "ok": False, "torch": "2.13.0+cu130", "backends": {}, "devices": [],
        "error": "torchao.float8 (fp8.backend=torchao) does not import: ModuleNotFoundError: No module named "
                 "'torchao'"}
    check = fp8_of(fake_node, config)
    assert check.status == FAIL and check.detail.startswith("torchao.float8 (fp8.backend=torchao) does not import")


def test_a_probe_on_fewer_gpus_than_expected_fails(fake_node, config):
    fake_node.ami_python.fp8_probe["devices"].pop()
    check = fp8_of(fake_node, config)
    assert (check.status, check.detail) == (FAIL, "the FP8 probe ran on 7 GPUs, expected 8")


def test_no_fp8_without_a_cuda_context(fake_node, config):
    fake_node.cuda_probe = {"ok": False, "error": "cuInit: CUDA_ERROR_SYSTEM_NOT_READY (802)", "count": 0,
                            "devices": []}
    assert fp8_of(fake_node, config) is None  # one failure, named once: cuda-init's
    assert not [c for c in fake_node.runner.commands() if "fp8_probe.py" in c]


def test_an_a100_only_imports(fake_node, kit):
    config = parse_node_config(kit.node_config_dict(**{"expected": {
        "gpuCount": 8, "gpuMemoryGiB": 40, "efaInterfaceCount": 4, "nvmeDeviceCount": 8, "nvswitch": True,
        "fp8": False}}))
    assert Fp8Probe.for_node(config, fake_node.host()).command()[-2:] == ("--device", "none")
    fake_node.ami_python.fp8_probe["devices"] = []
    result = check_fp8(config.expected, probe_of(fake_node, config), fake_node.runner)
    assert (result.status, result.detail) == (OK, "torchao 0.18.0 imports with torch 2.13.0+cu130; no FP8 tensor "
                                                  "cores on this instance type: FP8 matmul skipped")


# --- the probe, for real, on this machine's CPU ------------------------------------------------------------


def run_probe(*args):
    result = subprocess.run([sys.executable, str(PROBE), *args], capture_output=True, text=True, timeout=120)
    return result.returncode, result.stdout.strip().splitlines()[-1] if result.stdout.strip() else "", result.stderr


def test_the_probe_multiplies_in_fp8_on_the_cpu():
    code, out, _ = run_probe("--backends", "none,torchao", "--device", "cpu")
    report = json.loads(out)
    assert code == 0 and report["ok"] is True and report["error"] is None
    assert report["backends"] == {"torchao": "0.18.0"} and report["torch"].startswith("2.13.0")
    assert report["devices"] == [{"index": "cpu", "name": "cpu", "ok": True, "error": None}]


def test_the_probe_names_a_missing_backend_and_an_unknown_one():
    code, out, _ = run_probe("--backends", "te", "--device", "cpu")
    report = json.loads(out)
    assert code == 1 and report["error"] == ("transformer_engine.pytorch (fp8.backend=te) does not import: "
                                             "ModuleNotFoundError: No module named 'transformer_engine'")
    code, _, err = run_probe("--backends", "fp4")
    assert code == 2 and "--backends fp4: allowed: torchao, te" in err


def test_without_cuda_the_probe_says_so():
    code, out, _ = run_probe("--backends", "torchao")
    report = json.loads(out)
    assert code == 1 and report["error"].startswith("torch.cuda.is_available() is False: torch 2.13.0")
