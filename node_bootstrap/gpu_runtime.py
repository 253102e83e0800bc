"""Health checks for what breaks every job although nvidia-smi looks fine: NVIDIA Fabric Manager on NVSwitch
systems, a CUDA context on every GPU, and DCGM's short diagnostic where the AMI ships DCGM.

- fabric-manager: on HGX baseboards (every instance type in the catalog: `expected.nvswitch`), Fabric Manager
  configures the NVSwitches; until it runs, CUDA work fails with CUDA_ERROR_SYSTEM_NOT_READY (802) (NVIDIA
  Fabric Manager User Guide). `systemctl is-active nvidia-fabricmanager` must print `active`; the same check
  awsome-distributed-training's gpu-cluster-healthcheck (checks/3-topology-check.sh) makes.
- cuda-init: cuda_probe.py in a child process makes a context on every GPU.
- dcgm-diag: `dcgmi diag -r 1 -j`, DCGM's quick level (seconds: deployment and software checks, DCGM
  Diagnostics user guide, "Run levels"), when dcgmi is installed; a test that fails fails the gate, a host
  engine that does not answer only warns. Longer levels (2: minutes, 3-4: up to hours) are not for a boot gate.
"""

from __future__ import annotations

import json
import sys

from node_bootstrap.checks import FAIL, OK, WARN, Check
from node_bootstrap.config import ExpectedHardware
from node_bootstrap.runner import TIMED_OUT, Runner

FABRIC_MANAGER_UNIT = "nvidia-fabricmanager"
CUDA_PROBE_TIMEOUT_S = 180.0  # 8 contexts take seconds; a driver that hangs is killed at this
DCGM_DIAG = ("dcgmi", "diag", "-r", "1", "-j")
DCGM_TIMEOUT_S = 300.0


def fabric_manager_command() -> tuple[str, ...]:
    return ("systemctl", "is-active", FABRIC_MANAGER_UNIT)


def cuda_probe_command() -> tuple[str, ...]:
    # The interpreter running node_bootstrap, with the same sys.path (PYTHONPATH is inherited).
    return (sys.executable, "-m", "node_bootstrap.cuda_probe")


def check_fabric_manager(expected: ExpectedHardware, runner: Runner) -> Check:
    if not expected.nvswitch:
        return Check("fabric-manager", OK, "no NVSwitch on this instance type: not needed")
    if runner.which("systemctl") is None:
        return Check("fabric-manager", WARN, "systemctl not found: cannot tell whether Fabric Manager runs")
    result = runner.run(fabric_manager_command(), mutating=False, check=False)
    state = (result.stdout.strip().splitlines() or ["unknown"])[-1]
    if state == "active":
        return Check("fabric-manager", OK, f"{FABRIC_MANAGER_UNIT} is active")
    return Check("fabric-manager", FAIL,
                 f"{FABRIC_MANAGER_UNIT} is {state}: on NVSwitch GPUs every CUDA job fails with error 802 "
                 f"(system not ready) until it runs; see `systemctl status {FABRIC_MANAGER_UNIT}`")


def check_cuda(expected: ExpectedHardware, runner: Runner) -> Check:
    result = runner.run(cuda_probe_command(), mutating=False, check=False, timeout=CUDA_PROBE_TIMEOUT_S)
    if result.returncode == TIMED_OUT:
        return Check("cuda-init", FAIL, f"creating CUDA contexts did not finish: {result.stderr.strip()}")
    try:
        report = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return Check("cuda-init", FAIL, "the CUDA probe printed no report: " + result.describe_failure())
    if report.get("error"):
        return Check("cuda-init", FAIL, report["error"])
    failed = [d for d in report.get("devices", []) if not d.get("ok")]
    count = report.get("count", 0)
    if failed:
        return Check("cuda-init", FAIL, "; ".join(f"GPU {d['index']}: {d['error']}" for d in failed))
    if count != expected.gpu_count:
        return Check("cuda-init", FAIL, f"CUDA sees {count} GPUs, expected {expected.gpu_count}")
    return Check("cuda-init", OK, f"a CUDA context on each of the {count} GPUs")


def check_dcgm(runner: Runner) -> Check:
    if runner.which("dcgmi") is None:
        return Check("dcgm-diag", OK, "dcgmi is not installed on this AMI: skipped")
    result = runner.run(DCGM_DIAG, mutating=False, check=False, timeout=DCGM_TIMEOUT_S)
    if result.returncode == TIMED_OUT:
        return Check("dcgm-diag", WARN, f"`dcgmi diag -r 1` did not finish: {result.stderr.strip()}")
    tests = parse_dcgm_diag(result.stdout)
    if tests is None:
        text = (result.stdout + result.stderr).lower()
        if "host engine" in text or "connect" in text:
            return Check("dcgm-diag", WARN, "DCGM's host engine (nv-hostengine) does not answer: diagnostics "
                                            "skipped; " + result.describe_failure())
        return Check("dcgm-diag", WARN, "no diagnostic report: " + result.describe_failure())
    failed = [t for t in tests if t.status == "fail"]
    if failed:
        return Check("dcgm-diag", FAIL, "dcgmi diag -r 1: " + "; ".join(t.describe() for t in failed))
    return Check("dcgm-diag", OK, f"dcgmi diag -r 1: {len(tests)} tests, none failed")


class DiagTest:
    def __init__(self, category: str, name: str, status: str, gpus: list, warnings: list) -> None:
        self.category, self.name, self.status, self.gpus, self.warnings = category, name, status, gpus, warnings

    def describe(self) -> str:
        where = f" on GPU {', '.join(str(g) for g in self.gpus)}" if self.gpus else ""
        why = f": {' | '.join(self.warnings)}" if self.warnings else ""
        return f"{self.name} failed{where}{why}"


def parse_dcgm_diag(text: str) -> list[DiagTest] | None:
    """The tests of `dcgmi diag -j` output, or None when it holds no report.

    DCGM 3 writes {"DCGM GPU Diagnostic": {"test_categories": [{"category", "tests": [{"name", "results":
    [{"status", "gpu_id" | "gpu_ids", "warnings" | "warning"}]}]}]}}; DCGM 4 names the root "DCGM Diagnostic"
    and results carry "entity_id". Text may precede the JSON.
    """
    start = text.find("{")
    if start < 0:
        return None
    try:
        data = json.loads(text[start:])
    except ValueError:
        return None
    if not isinstance(data, dict):
        return None
    root = data.get("DCGM GPU Diagnostic") or data.get("DCGM Diagnostic")
    if not isinstance(root, dict) or not isinstance(root.get("test_categories"), list):
        return None
    tests = []
    for category in root["test_categories"]:
        for test in category.get("tests", []) if isinstance(category, dict) else []:
            results = [r for r in test.get("results", []) if isinstance(r, dict)]
            statuses = {str(r.get("status", "")).lower() for r in results}
            status = "fail" if "fail" in statuses else ("warn" if "warn" in statuses else "pass")
            bad = [r for r in results if str(r.get("status", "")).lower() == "fail"]
            gpus = [g for r in bad for g in _gpu_ids(r)]
            warnings = [w for r in bad for w in _warnings(r)]
            tests.append(DiagTest(str(category.get("category", "")), str(test.get("name", "?")), status,
                                  gpus, warnings))
    return tests


def _gpu_ids(result: dict) -> list:
    for key in ("gpu_id", "entity_id"):
        if key in result:
            return [result[key]]
    ids = result.get("gpu_ids")
    if isinstance(ids, str):  # DCGM 3 writes "0,1,2"
        return [i.strip() for i in ids.split(",") if i.strip()]
    return list(ids) if isinstance(ids, list) else []


def _warnings(result: dict) -> list[str]:
    found = result.get("warnings", result.get("warning", []))
    if isinstance(found, str):
        return [found] if found else []
    texts = []
    for item in found if isinstance(found, list) else []:
        text = item.get("warning") or item.get("message") if isinstance(item, dict) else item
        if text:
            texts.append(" ".join(str(text).split()))
    return texts
