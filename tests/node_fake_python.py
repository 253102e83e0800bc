"""The DLAMI's PyTorch interpreter on the fake node (/opt/pytorch/bin/python): what the packages step, the
training step and the health gate's FP8 probe ask of it, answered the way the real interpreter answers.

`pip install --target` really writes the locked distributions' metadata into the target (so the versions query
and the .pth that puts the target on sys.path are read from disk, not assumed), but nothing is imported:
tests/node_bootstrap/test_packages_real.py runs the same step against a real interpreter and real pip.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass, field
from pathlib import Path

from node_fakes import SITE_PACKAGES

from node_bootstrap.package_lock import parse_lock

_PTH_DIRECTORY = re.compile(r"len\(sys\.path\)\), '([^']+)'\)")


def good_fp8_report(gpus: int = 8) -> dict:
    """What node_bootstrap/fp8_probe.py prints on a good P5 with torchao."""
    return {"ok": True, "error": None, "torch": "2.13.0+cu130", "backends": {"torchao": "0.18.0"},
            "devices": [{"index": i, "name": "NVIDIA H100 80GB HBM3", "ok": True, "error": None}
                        for i in range(gpus)]}


@dataclass
class FakeAmiPython:
    path: callable  # node path -> host path of the fake root
    torch_version: str = "2.13.0+cu130"
    torch_error: str | None = None  # set: `import torch` fails with this
    pip_error: str | None = None  # set: pip install fails with this on stderr
    fp8_probe: dict = field(default_factory=good_fp8_report)
    pip_installs: int = 0

    def answer(self, argv: list[str]):
        if argv[1].endswith("/node_bootstrap/fp8_probe.py"):
            return (0 if self.fp8_probe["ok"] else 1), json.dumps(self.fp8_probe) + "\n"
        if argv[1:4] == ["-m", "pip", "install"]:
            return self._pip_install(argv)
        code = argv[2]
        if "environment probe" in code:
            report = {"python": "3.12.3", "purelib": SITE_PACKAGES}
            if self.torch_error:
                report["error"] = self.torch_error
            else:
                report.update(torch=self.torch_version, cuda="13.0")
            return 0, json.dumps(report) + "\n"
        if "installed versions" in code:
            directory, names = Path(argv[3]), argv[4:]
            return 0, json.dumps({name: _dist_version(directory, name) for name in names}) + "\n"
        if code.startswith("import importlib, json, sys"):
            return self._import(argv[3:])
        return None

    def _pip_install(self, argv: list[str]):
        if self.pip_error:
            return 1, "", self.pip_error
        target = Path(argv[argv.index("--target") + 1])
        lock = parse_lock(Path(argv[argv.index("-r") + 1]).read_text())
        for package in lock.packages:
            module = package.name.replace("-", "_")
            (target / module).mkdir(parents=True)
            (target / module / "__init__.py").write_text(f"__version__ = {package.version!r}\n")
            info = target / f"{module}-{package.version}.dist-info"
            info.mkdir()
            (info / "METADATA").write_text(f"Name: {package.name}\nVersion: {package.version}\n")
        self.pip_installs += 1
        return 0, "Successfully installed " + " ".join(f"{p.name}-{p.version}" for p in lock.packages) + "\n"

    def _import(self, modules: list[str]):
        pth = Path(self.path(SITE_PACKAGES + "/cluster-training-packages.pth"))
        match = _PTH_DIRECTORY.search(pth.read_text()) if pth.exists() else None
        files = {}
        for module in modules:
            top = module.split(".")[0]
            if match is None or not (Path(match.group(1)) / top).is_dir():
                return 1, "", f"ModuleNotFoundError: No module named '{top}'"
            files[module] = str(Path(match.group(1)) / module.replace(".", "/") / "__init__.py")
        return 0, json.dumps(files) + "\n"


def _dist_version(directory: Path, name: str) -> str | None:
    for info in directory.glob("*.dist-info"):
        fields = dict(line.split(": ", 1) for line in (info / "METADATA").read_text().splitlines() if ": " in line)
        if fields.get("Name") == name:
            return fields.get("Version")
    return None
