"""Step 4, packages: the training lock installed into a layer on the DLAMI's PyTorch, verified, once per lock.

The trainer needs more than the AMI's torch (torchao for FP8, at least), and a node cannot fetch it: with
natGateway=false it reaches only VPC endpoints. So the node bundle carries the wheels of the lock
(training/node-requirements.txt, package_lock.py) in its `wheelhouse/`, and this step installs exactly those:

1. probe the AMI's interpreter (training.python): its Python, its torch and CUDA, its site-packages; refuse a
   torch the lock does not fit (the stack resolves the AMI at deploy time, so a later deploy can bring a newer
   torch: wheels are never loaded into a torch they were not chosen for);
2. check every wheel of the lock is in the wheelhouse with a hash the lock accepts (one line naming the package
   and the reason otherwise);
3. `pip install --no-index --no-deps --require-hashes --target` into `<packagesDir>/<key>.partial`, where the
   key hashes the lock with the Python, torch and CUDA it is installed for; check the installed versions
   against the lock, write the completion marker, then rename the directory to `<key>`: a half-installed
   environment never has the final name, and a crash leaves only a `.partial` that the next boot replaces;
4. point the interpreter at it with a `.pth` file in its site-packages (the same mechanism that puts the bundle
   on its path, training_env.py), so every process of that interpreter, torchrun's workers included, imports
   the locked packages, and torch stays the AMI's (pip never installs one: --no-deps, and the lock holds none);
5. remove the directories of earlier keys.

A second boot with the same lock and AMI finds `<key>/installed.json` and the `.pth` in place: nothing to do.
The health gate then runs an FP8 matrix multiply on every GPU with these packages imported (fp8_check.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import re

from node_bootstrap.config import NodeConfig
from node_bootstrap.errors import StepError
from node_bootstrap.host import Host
from node_bootstrap.package_lock import Lock, LockError, parse_lock, select_wheels
from node_bootstrap.plan import StepPlan
from node_bootstrap.runner import Runner

PTH_FILE_NAME = "cluster-training-packages.pth"
MARKER_NAME = "installed.json"
PIP_TIMEOUT_S = 600.0  # a few wheels from local disk take seconds; a hung pip is cut here (and by the deadline)
PROBE_TIMEOUT_S = 120.0  # importing torch cold from the AMI's EBS volume can take tens of seconds
_KEY = re.compile(r"^[0-9a-f]{16}(\.partial)?$")

# Run by the AMI's interpreter: what it is, and the torch it has. The first line names it in process lists.
PROBE_CODE = """\
# node_bootstrap packages: environment probe
import json, sys, sysconfig
out = {"python": "%d.%d.%d" % tuple(sys.version_info[:3]), "purelib": sysconfig.get_paths()["purelib"]}
try:
    import torch
    out["torch"] = torch.__version__
    out["cuda"] = torch.version.cuda
except Exception as e:
    out["error"] = "%s: %s" % (type(e).__name__, e)
print(json.dumps(out))
"""
# Run by the AMI's interpreter with argv [directory, name...]: the version of each distribution found there.
VERSIONS_CODE = """\
# node_bootstrap packages: installed versions
import json, sys
from importlib import metadata
found = {}
for name in sys.argv[2:]:
    dists = list(metadata.distributions(name=name, path=[sys.argv[1]]))
    found[name] = dists[0].version if dists else None
print(json.dumps(found))
"""


def plan_packages(config: NodeConfig, host: Host, runner: Runner) -> StepPlan:
    training = config.training
    plan = StepPlan("packages")
    lock_text = host.read_text(training.lock_file, default="")
    if not lock_text:
        raise StepError(f"the training lock {training.lock_file} is missing from the bundle")
    try:
        lock = parse_lock(lock_text, training.lock_file)
    except LockError as e:
        raise StepError(str(e)) from None
    if not host.exists(training.python):
        raise StepError(f"training.python={training.python} does not exist: "
                        "is this the Deep Learning AMI with PyTorch?")
    env = probe_environment(host, runner, training.python)
    if not lock.torch_fits(env["torch"]):
        raise StepError(f"torch {env['torch']} in {training.python} does not fit the lock {training.lock_file} "
                        f"(fits-torch: {lock.fits_torch_text}): update the lock for this AMI "
                        "(docs/node-bootstrap.md, 'Changing the training lock')")
    key = environment_key(lock_text, env)
    target = f"{training.packages_dir}/{key}"
    plan.note(f"Python {env['python']}, torch {env['torch']} (CUDA {env.get('cuda') or 'none'}) in "
              f"{training.python}; lock {', '.join(p.pin() for p in lock.packages)} -> {target}")
    if not _installed(host, target, lock):
        wheels = find_wheels(host, training.wheelhouse_dir, lock)
        plan.add(f"install {', '.join(p.pin() for p in lock.packages)} from {training.wheelhouse_dir} "
                 f"into {target}",
                 apply=lambda: install(host, runner, training.python, training.lock_file,
                                       training.wheelhouse_dir, target, lock, env, wheels))
    pth_node = host.node_path(env["purelib"].rstrip("/") + "/" + PTH_FILE_NAME)
    pth_text = pth_line(host.path(target))  # the interpreter runs here: the path it opens (the node path on a node)
    if host.read_text(pth_node, default="") != pth_text:
        plan.add(f"put {target} on {training.python}'s sys.path with {pth_node}",
                 apply=lambda: host.write_text(pth_node, pth_text))
    stale = _stale_entries(host, training.packages_dir, key)
    if stale:
        plan.add(f"remove earlier environments from {training.packages_dir}: {', '.join(stale)}",
                 apply=lambda: [host.remove_tree(f"{training.packages_dir}/{name}") for name in stale])
    plan.verify = lambda: verify_import(host, runner, training.python, lock, host.path(target))
    return plan


def pth_line(directory: str) -> str:
    """The .pth line that puts `directory` on sys.path just before the first site-packages directory.

    A plain path line would be appended after site-packages, so a torchao the AMI ships would shadow the lock's;
    `site` executes .pth lines that start with `import` (Python docs, the site module), and this one inserts
    the lock's directory ahead of the AMI's packages but behind the standard library. torch is not in the lock,
    so the AMI's torch is still the one imported.
    """
    return ("import sys; sys.path.insert(next((i for i, p in enumerate(sys.path) if p.rstrip('/').endswith("
            f"('site-packages', 'dist-packages'))), len(sys.path)), {directory!r})\n")


def probe_environment(host: Host, runner: Runner, python: str) -> dict:
    result = runner.run([host.path(python), "-c", PROBE_CODE], mutating=False, check=False,
                        timeout=PROBE_TIMEOUT_S)
    try:
        env = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise StepError(f"cannot probe {python}: {result.describe_failure()}") from None
    if env.get("error"):
        raise StepError(f"torch does not import in {python}: {env['error']}")
    return env


def environment_key(lock_text: str, env: dict) -> str:
    """What the installed environment depends on: the lock, and the interpreter and torch it is installed for."""
    material = "\n".join([lock_text, env["python"], env["torch"], str(env.get("cuda"))])
    return hashlib.sha256(material.encode()).hexdigest()[:16]


def find_wheels(host: Host, wheelhouse: str, lock: Lock) -> list[str]:
    """The wheel file of each locked package, checked against the lock's hashes; StepError names what is wrong."""
    try:
        return select_wheels(lock, host.path(wheelhouse),
                             "the bundle was built without it (run `make setup` before `cdk deploy`)")
    except LockError as e:
        raise StepError(str(e).replace(host.path(wheelhouse), wheelhouse)) from None


def install(host: Host, runner: Runner, python: str, lock_file: str, wheelhouse: str, target: str,
            lock: Lock, env: dict, wheels: list[str]) -> None:
    partial = target + ".partial"
    host.remove_tree(partial)
    result = runner.run(
        [host.path(python), "-m", "pip", "install", "--no-index", "--no-deps", "--require-hashes",
         "--only-binary=:all:", "--disable-pip-version-check", "--no-warn-script-location",
         "--find-links", host.path(wheelhouse), "--target", host.path(partial), "-r", host.path(lock_file)],
        mutating=True, check=False, timeout=PIP_TIMEOUT_S)
    if not result.ok:
        host.remove_tree(partial)
        raise StepError(f"pip could not install the lock {lock_file}: {_last_error_line(result)}")
    found = installed_versions(host, runner, python, partial, lock)
    wrong = [f"{p.pin()}: found {found.get(p.name) or 'nothing'}" for p in lock.packages
             if found.get(p.name) != p.version]
    if wrong:
        host.remove_tree(partial)
        raise StepError(f"the installed environment does not match the lock {lock_file}: {'; '.join(wrong)}")
    marker = {"lock": hashlib.sha256(host.read_text(lock_file).encode()).hexdigest(), "wheels": wheels,
              "python": env["python"], "torch": env["torch"], "cuda": env.get("cuda"), "packages": found}
    host.write_text(f"{partial}/{MARKER_NAME}", json.dumps(marker, indent=1, sort_keys=True) + "\n")
    host.remove_tree(target)  # a directory without its marker (an older crash): never used, replaced
    host.rename(partial, target)


def installed_versions(host: Host, runner: Runner, python: str, directory: str, lock: Lock) -> dict:
    result = runner.run([host.path(python), "-c", VERSIONS_CODE, host.path(directory),
                         *[p.name for p in lock.packages]], mutating=False, check=False, timeout=PROBE_TIMEOUT_S)
    try:
        return json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise StepError(f"cannot read the installed versions in {directory}: {result.describe_failure()}") from None


def verify_import(host: Host, runner: Runner, python: str, lock: Lock, directory: str) -> None:
    """A fresh interpreter, through the .pth alone, imports each FP8 backend the lock provides from `directory`."""
    modules = [backend_module(b) for b in lock.fp8_backends() if b != "none"]
    if not modules:
        return
    code = ("import importlib, json, sys\n"
            "print(json.dumps({m: importlib.import_module(m).__file__ for m in sys.argv[1:]}))")
    result = runner.run([host.path(python), "-c", code, *modules], mutating=False, check=False,
                        timeout=PROBE_TIMEOUT_S)
    try:
        files = json.loads(result.stdout.strip().splitlines()[-1])
    except (ValueError, IndexError):
        raise StepError(f"{', '.join(modules)} does not import in {python} after the install: "
                        f"{_last_error_line(result)}") from None
    elsewhere = [f"{m} from {f}" for m, f in files.items() if not str(f).startswith(directory.rstrip("/") + "/")]
    if elsewhere:
        raise StepError(f"{python} imports {', '.join(elsewhere)}, not the lock's environment {directory}")


def backend_module(backend: str) -> str:
    """The module a job imports for an fp8.backend value."""
    return {"torchao": "torchao.float8", "te": "transformer_engine.pytorch"}[backend]


def _installed(host: Host, target: str, lock: Lock) -> bool:
    try:
        marker = json.loads(host.read_text(f"{target}/{MARKER_NAME}", default="{}"))
    except ValueError:
        return False
    return marker.get("packages") == {p.name: p.version for p in lock.packages}


def _stale_entries(host: Host, packages_dir: str, key: str) -> list[str]:
    try:
        names = os.listdir(host.path(packages_dir))
    except OSError:
        return []
    # Only what this step creates (16 hex digits, maybe .partial); the current key's .partial is install's.
    return sorted(n for n in names if _KEY.fullmatch(n) and n.split(".")[0] != key)


def _last_error_line(result) -> str:
    lines = [line.strip() for line in (result.stderr + "\n" + result.stdout).splitlines() if line.strip()]
    errors = [line for line in lines if line.startswith("ERROR")]
    return (errors or lines or [f"exit code {result.returncode}"])[-1]
