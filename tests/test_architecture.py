"""The layout as a contract: which package may import which, no import circle, no module over 400 lines.

The packages stand on floors (docs/architecture.md, "Layout"); an import may only point down, to a package
listed for it below. Every import counts: at module level, inside functions, and under TYPE_CHECKING (a
type-only import that runs against the layering is still an arrow up a reader must follow).
"""

from __future__ import annotations

import ast
import subprocess
from graphlib import CycleError, TopologicalSorter
from pathlib import Path

import pytest

from cluster_constructs.bundle import KEEPER_CODE, NODE_BUNDLE, stage_keeper_code

REPO_ROOT = Path(__file__).resolve().parent.parent
MAX_MODULE_LINES = 400

# What each top-level package may import of the project (each package's docstring says the same).
ALLOWED_IMPORTS: dict[str, set[str]] = {
    # bottom floor: shipped to the nodes (Python 3.9, standard library only)
    "instance_catalog": set(),
    "node_bootstrap": set(),
    # the trainer (on the nodes), the settings, the AWS plumbing
    "training": {"instance_catalog"},
    "cluster_spec": {"instance_catalog"},
    "cluster_aws": set(),
    # the job model, shared by the CLI and the keeper
    "cluster_jobs": {"cluster_aws", "instance_catalog", "node_bootstrap", "training"},
    # the keeper (a Lambda function) and the CDK constructs
    "job_keeper": {"cluster_jobs", "cluster_aws"},
    "cluster_constructs": {"cluster_spec", "instance_catalog", "node_bootstrap"},
    # top floor: the operator CLI, the stack and its entry point, repository tools, GPU benchmark scripts
    "clusterctl": {"cluster_jobs", "cluster_aws", "cluster_spec", "instance_catalog", "node_bootstrap", "training"},
    "stacks": {"cluster_constructs", "cluster_spec", "instance_catalog"},
    "app": {"stacks", "cluster_spec"},
    "tools": set(),
    # h100_node_check.py runs the packages step and FP8 check; h100_check_report.py holds a measured peak against
    # clusterctl/plan/memory.py's prediction (torch-free, as the report must be)
    "benchmarks": {"training", "node_bootstrap", "clusterctl"},
}
PACKAGES = sorted(p for p in ALLOWED_IMPORTS if (REPO_ROOT / p / "__init__.py").exists())


def _python_files() -> list[Path]:
    """Every Python file of the repository that git tracks (or would: new files not yet ignored)."""
    listed = subprocess.run(
        ["git", "-C", str(REPO_ROOT), "ls-files", "-z", "--cached", "--others", "--exclude-standard", "--", "*.py"],
        capture_output=True, check=True, timeout=60,
    ).stdout.decode().split("\0")
    return sorted(REPO_ROOT / p for p in listed if p and (REPO_ROOT / p).is_file())


def _module_name(path: Path) -> str:
    parts = path.relative_to(REPO_ROOT).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def _project_modules() -> dict[str, Path]:
    return {
        _module_name(p): p for p in _python_files() if p.relative_to(REPO_ROOT).parts[0] in ALLOWED_IMPORTS
        or p.relative_to(REPO_ROOT).as_posix() == "app.py"
    }


MODULES = _project_modules()


def _resolve(name: str) -> str | None:
    """The project module an import names: the module itself, else its nearest parent package."""
    while name:
        if name in MODULES:
            return name
        name = name.rpartition(".")[0]
    return None


def _imports(module: str, path: Path) -> set[str]:
    """The project modules `module` imports, anywhere in its file."""
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]
        else:
            continue
        for name in names:
            target = _resolve(name)
            if target and target != module:
                found.add(target)
    return found


GRAPH = {module: _imports(module, path) for module, path in MODULES.items()}


def _package(module: str) -> str:
    return module.split(".")[0]


def test_every_import_points_down_to_an_allowed_package():
    arrows_up = sorted(
        f"{module} imports {target}"
        for module, targets in GRAPH.items()
        for target in targets
        if _package(target) != _package(module) and _package(target) not in ALLOWED_IMPORTS[_package(module)]
    )
    assert arrows_up == []


def test_the_packages_stand_on_floors():
    # The allowed arrows themselves form no circle: there is an order in which every package comes after
    # everything it may import.
    try:
        order = list(TopologicalSorter(ALLOWED_IMPORTS).static_order())
    except CycleError as error:  # pragma: no cover - the message names the circle
        pytest.fail(f"the allowed imports form a circle: {error.args[1]}")
    assert order.index("instance_catalog") < order.index("training") < order.index("cluster_jobs")
    assert order.index("cluster_jobs") < order.index("job_keeper") and order.index("cluster_jobs") < order.index(
        "clusterctl")


def test_no_import_circle_between_modules():
    try:
        TopologicalSorter(GRAPH).prepare()
    except CycleError as error:
        pytest.fail(f"import circle: {' -> '.join(error.args[1])}")


def test_no_module_over_400_lines():
    too_long = {
        p.relative_to(REPO_ROOT).as_posix(): n
        for p in _python_files()
        if (n := len(p.read_text().splitlines())) > MAX_MODULE_LINES
    }
    assert too_long == {}, f"split these modules (at most {MAX_MODULE_LINES} lines each): {too_long}"


@pytest.mark.parametrize("package", PACKAGES)
def test_every_package_says_what_lives_there(package):
    doc = ast.get_docstring(ast.parse((REPO_ROOT / package / "__init__.py").read_text()))
    assert doc and len(doc) > 60, f"{package}/__init__.py needs a docstring: what lives there, what it may import"


def _package_closure(*roots: str) -> set[str]:
    """The packages `roots` need whole: an asset ships whole packages, so every module of a package it holds
    must find what it imports there too."""
    packages, todo = set(), list(roots)
    while todo:
        package = todo.pop()
        if package not in packages:
            packages.add(package)
            todo.extend(_package(t) for m, targets in GRAPH.items() if _package(m) == package for t in targets)
    return packages


def _module_closure(entry: str) -> set[str]:
    """`entry`, every module it imports, directly or not, and the packages on their way (importing a.b runs a)."""
    modules, todo = set(), [entry]
    while todo:
        module = todo.pop()
        if module not in modules:
            modules.add(module)
            parts = module.split(".")
            todo.extend(p for p in (".".join(parts[:i]) for i in range(1, len(parts))) if p in MODULES)
            todo.extend(GRAPH[module])
    return modules


def test_the_keeper_asset_holds_exactly_the_modules_the_keeper_imports(tmp_path):
    staged = stage_keeper_code(tmp_path / "keeper")
    files = {p.relative_to(staged).as_posix() for p in staged.rglob("*") if p.is_file()}
    assert {_module_name(REPO_ROOT / f) for f in files} == _module_closure(
        KEEPER_CODE.entry)
    assert all(f.endswith(".py") for f in files)  # no data: the keeper reads no config of the trainer


def test_the_keeper_asset_carries_the_job_contract_and_not_the_nodes_launcher_or_the_trainer():
    closure = _module_closure("job_keeper.handler")
    assert "node_bootstrap.job_contract" in closure and "cluster_jobs.document" in closure
    assert not {m for m in closure if m.startswith(("node_bootstrap.jobs", "training", "clusterctl"))}
    assert "node_bootstrap.jobs" not in closure and "instance_catalog" not in {_package(m) for m in closure}
    # the contract is at the bottom: it imports nothing of the project, so its readers ship it alone
    assert GRAPH["node_bootstrap.job_contract"] == set()


def test_the_node_bundle_holds_everything_the_nodes_import():
    assert _package_closure("node_bootstrap", "training") == set(NODE_BUNDLE.packages)


def test_the_checker_sees_arrows():
    # The graph is real: a known arrow and a known absence.
    assert "cluster_jobs.table" in GRAPH["job_keeper.keeper"]
    assert not any(_package(t) == "clusterctl" for t in GRAPH["job_keeper.handler"])
    assert _resolve("cluster_spec.settings.CapacityMode") == "cluster_spec.settings"
