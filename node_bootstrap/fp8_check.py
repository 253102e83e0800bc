"""Health check `fp8`: the environment jobs run in imports its FP8 backends, and FP8 works on every GPU.

The gate's other checks run node_bootstrap's own interpreter; this one runs the interpreter jobs use (the DLAMI's
PyTorch with the training lock's packages, packages.py) on fp8_probe.py, by path, so what it proves is what a
job will meet: the backend imports (torchao.float8, transformer_engine.pytorch) and one FP8 matrix multiply per
GPU. On instance types without FP8 tensor cores (A100: node config expected.fp8 false) the multiply is skipped
and the imports are still checked: fp8.emulate jobs need them.
"""

from __future__ import annotations

import json
from dataclasses import dataclass

from node_bootstrap.checks import FAIL, OK, Check
from node_bootstrap.config import ExpectedHardware, NodeConfig
from node_bootstrap.host import Host
from node_bootstrap.runner import TIMED_OUT, Runner

PROBE_TIMEOUT_S = 300.0  # importing torch and the backends cold, then a context and a matmul on 8 GPUs


@dataclass(frozen=True)
class Fp8Probe:
    """How to run the probe on this machine: host paths, and the backends the node provides."""

    python: str
    script: str
    backends: tuple[str, ...]
    device: str = "cuda"

    @classmethod
    def for_node(cls, config: NodeConfig, host: Host) -> Fp8Probe:
        return cls(python=host.path(config.training.python),
                   script=host.path(config.training.bundle_dir + "/node_bootstrap/fp8_probe.py"),
                   backends=tuple(b for b in config.training.fp8_backends if b != "none"),
                   device="cuda" if config.expected.fp8 else "none")

    def command(self) -> tuple[str, ...]:
        return (self.python, self.script, "--backends", ",".join(self.backends), "--device", self.device)


def check_fp8(expected: ExpectedHardware, probe: Fp8Probe, runner: Runner) -> Check:
    result = runner.run(probe.command(), mutating=False, check=False, timeout=PROBE_TIMEOUT_S)
    if result.returncode == TIMED_OUT:
        return Check("fp8", FAIL, f"the FP8 probe did not finish: {result.stderr.strip()}")
    try:
        report = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        return Check("fp8", FAIL, "the FP8 probe printed no report: " + result.describe_failure())
    if report.get("error"):
        return Check("fp8", FAIL, report["error"])
    failed = [d for d in report.get("devices", []) if not d.get("ok")]
    if failed:
        return Check("fp8", FAIL, "; ".join(f"GPU {d['index']} ({d.get('name', '?')}): FP8 matmul failed: "
                                            f"{d['error']}" for d in failed))
    versions = ", ".join(f"{name} {version}" for name, version in sorted(report.get("backends", {}).items()))
    imported = f"{versions or 'no FP8 backend'} imports with torch {report.get('torch')}"
    if not expected.fp8:
        return Check("fp8", OK, f"{imported}; no FP8 tensor cores on this instance type: FP8 matmul skipped")
    count = len(report.get("devices", []))
    if count != expected.gpu_count:
        return Check("fp8", FAIL, f"the FP8 probe ran on {count} GPUs, expected {expected.gpu_count}")
    return Check("fp8", OK, f"{imported}; an FP8 matmul (torch._scaled_mm, e4m3) on each of the {count} GPUs")
