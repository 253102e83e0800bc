"""Part 1 of benchmarks/scripts/h100_check.sh: what a node does at boot with the training lock, on this machine.

    python3 benchmarks/scripts/h100_node_check.py --work DIR --device cuda --json OUT/1-node-fp8.json

1. The packages step (node_bootstrap/packages.py, its own plan and execution): this machine's Python with torch
   stands in for the DLAMI's PyTorch (a virtual environment at DIR/ami that sees this interpreter's
   site-packages, torchao left out, so torchao can only come from the lock), the lock is
   training/node-requirements.txt and its wheels build/wheelhouse. The step refuses a torch the lock does not
   fit, checks the wheels' hashes, installs them with pip into DIR/packages/<key>, puts that directory on the
   environment's path with its .pth file, and verifies that a fresh interpreter imports torchao.float8 from
   there (the step's import check).
2. The health gate's FP8 check (node_bootstrap/fp8_check.py): fp8_probe.py run by that interpreter, as the
   gate runs it: the backends imported, then one FP8 matrix multiply on every GPU (--device cpu: on the CPU).

Writes one JSON object with "status" ("ok" or "failed: ..."), both results, and "lock_site": the installed
directory, which the later parts put on PYTHONPATH. Exits 0 when both passed.
"""

from __future__ import annotations

import argparse
import importlib.util
import json
import shutil
import subprocess
import sys
import sysconfig
import time
import types
from pathlib import Path

from node_bootstrap.config import ExpectedHardware, TrainingConfig
from node_bootstrap.errors import StepError
from node_bootstrap.fp8_check import Fp8Probe, check_fp8
from node_bootstrap.host import Host
from node_bootstrap.package_lock import normalize
from node_bootstrap.packages import plan_packages
from node_bootstrap.plan import execute_plan
from node_bootstrap.runner import CommandError, Runner

REPO = Path(__file__).resolve().parents[2]


class KeepingRunner(Runner):
    """The real runner, keeping each result: the probe's own report goes into the JSON too."""

    def __init__(self) -> None:
        super().__init__()
        self.results = []

    def run(self, argv, **kwargs):
        result = super().run(argv, **kwargs)
        self.results.append(result)
        return result


def make_ami(directory: Path) -> Path:
    """A virtual environment that sees this interpreter's site-packages except torchao; its python."""
    subprocess.run([sys.executable, "-m", "venv", "--without-pip", str(directory)], check=True, timeout=120)
    python = directory / "bin" / "python"
    view = directory / "site-without-torchao"
    view.mkdir()
    spec = importlib.util.find_spec("torch")  # where this interpreter's torch is (not imported: seconds)
    sites = dict.fromkeys([Path(sysconfig.get_paths()["purelib"])]
                          + ([Path(spec.origin).resolve().parents[1]] if spec and spec.origin else []))
    for site in sites:
        for entry in site.iterdir():
            if not normalize(entry.name).startswith("torchao") and not (view / entry.name).exists():
                (view / entry.name).symlink_to(entry)
    purelib = subprocess.run([str(python), "-c", "import sysconfig; print(sysconfig.get_paths()['purelib'])"],
                             capture_output=True, text=True, check=True, timeout=60).stdout.strip()
    Path(purelib, "ami-site.pth").write_text(f"{view}\n")
    return python


def training_config(python: Path, work: Path) -> types.SimpleNamespace:
    """The node config's training section for this machine (plan_packages reads nothing else of it)."""
    unused = ""
    return types.SimpleNamespace(training=TrainingConfig(
        bundle_dir=str(REPO), env_file=unused, python=str(python),
        lock_file=str(REPO / "training/node-requirements.txt"), wheelhouse_dir=str(REPO / "build/wheelhouse"),
        packages_dir=str(work / "packages"), fp8_backends=("none", "torchao"), jobs_dir=unused, job_log_dir=unused,
        checkpoint_root=unused, data_root=unused, rendezvous_port=0, job_hang_timeout_seconds=0,
        job_start_timeout_seconds=0))


def packages_step(config, runner: Runner) -> dict:
    began = time.monotonic()
    try:
        plan = plan_packages(config, Host("/"), runner)
        execute_plan(plan, runner, dry_run=False, print_fn=lambda line: None)  # verify: the import check
    except (StepError, CommandError, OSError) as e:
        return {"ok": False, "error": str(e), "seconds": time.monotonic() - began}
    packages = Path(config.training.packages_dir)
    [site] = [p for p in packages.iterdir() if p.is_dir() and not p.name.endswith(".partial")]
    marker = json.loads((site / "installed.json").read_text())
    return {"ok": True, "error": None, "seconds": time.monotonic() - began, "notes": plan.notes,
            "lock_site": str(site), "installed": marker["packages"], "torch": marker["torch"],
            "cuda": marker["cuda"], "python": marker["python"]}


def fp8_health_check(python: Path, device: str, runner: KeepingRunner) -> dict:
    probe = Fp8Probe(python=str(python), script=str(REPO / "node_bootstrap/fp8_probe.py"), backends=("torchao",),
                     device=device)
    gpus = gpu_count() if device == "cuda" else 1  # the probe's CPU mode reports one device, "cpu"
    expected = ExpectedHardware(gpu_count=gpus, gpu_memory_gib=0, efa_interface_count=0, nvme_device_count=0,
                                nvswitch=False, fp8=True)
    began = time.monotonic()
    check = check_fp8(expected, probe, runner)
    seconds = time.monotonic() - began
    try:
        report = json.loads(runner.results[-1].stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        report = None
    return {"ok": check.status == "ok", "status": check.status, "detail": check.detail, "seconds": seconds,
            "command": list(probe.command()), "probe_report": report}


def gpu_count() -> int:
    out = subprocess.run(["nvidia-smi", "-L"], capture_output=True, text=True, timeout=60)
    return sum(1 for line in out.stdout.splitlines() if line.startswith("GPU "))


def main(argv: list[str] | None = None) -> int:
    parser = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    parser.add_argument("--work", type=Path, required=True, help="scratch directory (created; emptied first)")
    parser.add_argument("--device", choices=("cuda", "cpu"), default="cuda", help="where the FP8 multiply runs")
    parser.add_argument("--json", type=Path, required=True, help="the part's result")
    args = parser.parse_args(argv)
    shutil.rmtree(args.work, ignore_errors=True)  # a fresh environment each time, as on a new node
    args.work.mkdir(parents=True)
    result: dict = {"part": "node-fp8", "device": args.device}
    runner = KeepingRunner()
    try:
        python = make_ami(args.work / "ami")
        result["packages_step"] = packages_step(training_config(python, args.work), runner)
        result["lock_site"] = result["packages_step"].get("lock_site")
        result["fp8_check"] = fp8_health_check(python, args.device, runner)
    except Exception as e:  # the JSON is the record: a bug here must still leave one
        result["error"] = f"{type(e).__name__}: {e}"
    failed = [f"{name}: {result[name].get('error') or result[name].get('detail')}"
              for name in ("packages_step", "fp8_check") if name in result and not result[name]["ok"]]
    if result.get("error"):
        failed.append(result["error"])
    result["status"] = "ok" if not failed and "fp8_check" in result else "failed: " + "; ".join(failed)
    args.json.write_text(json.dumps(result, indent=2) + "\n")
    print(f"node-fp8: {result['status']}")
    return 0 if result["status"] == "ok" else 1


if __name__ == "__main__":
    sys.exit(main())
