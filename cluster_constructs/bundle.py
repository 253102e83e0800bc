"""The stack's two code assets, staged from the repository by the same rules.

- The node bundle (NODE_BUNDLE): node_bootstrap, the training package and the instance catalog, one S3 asset,
  with the wheels of the training lock (training/node-requirements.txt) in `wheelhouse/`. User-data downloads
  it and unpacks it at /opt/cluster/bundle (docs/architecture.md section 1); node_bootstrap's packages step
  installs the wheels, so a node needs no package index, and no NAT gateway, to get them.
- The job keeper's code (KEEPER_CODE): the modules the keeper's handler imports, directly or not, and nothing
  else (import_closure: the job model in cluster_jobs that clusterctl shares, the job contract with the nodes
  in node_bootstrap/job_contract.py, not the nodes' launcher and supervisor nor the trainer's config loader),
  the Lambda function's asset (cluster_constructs/job_keeper.py). boto3 comes from the Lambda runtime;
  clusterctl is not shipped. tests/test_architecture.py checks the asset against the imports.

An asset's hash names its object and is baked into the template (the launch template, the function's code), so
each asset must be a pure function of the committed code: the same checkout gives the same hash whatever tools
ran in it before.

So staging copies only source files: in a git checkout, the files git tracks under the bundled packages (a new
module reaches the nodes once it is `git add`ed); elsewhere (an unpacked source archive), every file under
them. In both cases caches and tool state never ship: no hidden files or directories (`.ruff_cache`,
`.pytest_cache`, `.mypy_cache`, editor files), no `__pycache__`, no `*.pyc`, and not the packages' lint config.
A README or test edit does not change the hash either: only the bundled packages are staged. The keeper's code
is narrower still: of those files, the modules its handler imports (a module it imports that git does not
track yet ships too: without it the function would fail on its import).

The wheels are not committed: `make setup` downloads them into build/wheelhouse, and staging copies exactly the
wheel of each locked package whose sha256 the lock names (node_bootstrap/package_lock.py), so the wheelhouse is
as much a function of the committed lock as the code is of the commit. A missing or different wheel stops the
synthesis with the package's name, never a bundle without it.
"""

from __future__ import annotations

import ast
import shutil
import subprocess
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

from node_bootstrap.package_lock import Lock, parse_lock, select_wheels

REPO_ROOT = Path(__file__).resolve().parent.parent
NODE_LOCK = "training/node-requirements.txt"  # the training lock, relative to the repository
WHEELHOUSE = REPO_ROOT / "build" / "wheelhouse"  # where `make setup` downloads the lock's wheels
WHEELHOUSE_DIR_NAME = "wheelhouse"  # ... and where the bundle carries them
# Staged files are written with these modes, whatever the umask: the zip keeps them, and Lambda runs the code as
# a user other than the file's owner (a 0600 module would fail to import). The hash reads contents, not modes.
_FILE_MODE = 0o644
_DIR_MODE = 0o755
_NOT_SHIPPED_NAMES = {"__pycache__", "ruff.toml"}
_NOT_SHIPPED_SUFFIXES = (".pyc", ".pyo")
_GIT_TIMEOUT_S = 30


@dataclass(frozen=True)
class Bundle:
    """One staged code asset: the top-level packages it holds, whole, and the wheels of a lock."""

    packages: tuple[str, ...]
    lock: str | None = None  # a training lock (repository-relative) whose wheels ship in wheelhouse/
    # a module (job_keeper.handler): the bundle holds only it and what it imports, found in `packages`
    entry: str | None = None

    @property
    def sources(self) -> list[str]:
        return list(self.packages)


# training reads the GPU's peak for MFU from the instance catalog; node_bootstrap's expected counts come
# rendered in the node config instead.
NODE_BUNDLE = Bundle(("instance_catalog", "node_bootstrap", "training"), lock=NODE_LOCK)
# The keeper's handler and the modules it imports, directly or not, from the packages its layer may reach
# (tests/test_architecture.py): the job model and its AWS plumbing, and the job contract with the nodes.
KEEPER_CODE = Bundle(("cluster_aws", "cluster_jobs", "instance_catalog", "job_keeper", "node_bootstrap", "training"),
                     entry="job_keeper.handler")
BUNDLED_PACKAGES = NODE_BUNDLE.packages


def is_shipped(relative_path: str) -> bool:
    """Whether a file (a path relative to the repository, with /) belongs in the bundle."""
    parts = PurePosixPath(relative_path).parts
    if any(part.startswith(".") or part in _NOT_SHIPPED_NAMES for part in parts):
        return False
    return not parts[-1].endswith(_NOT_SHIPPED_SUFFIXES)


def bundled_files(repo_root: Path = REPO_ROOT, bundle: Bundle = NODE_BUNDLE) -> list[str]:
    """The repository-relative paths of every file the bundle holds, sorted."""
    candidates = _git_tracked(repo_root, bundle.sources)
    if candidates is None:
        candidates = _walk(repo_root, bundle.sources)
    # A tracked file deleted in the work tree is not shipped (and its absence shows up in the tests).
    files = sorted(p for p in set(candidates) if is_shipped(p) and (repo_root / p).is_file())
    if bundle.entry is not None:
        files = import_closure(repo_root, bundle.entry, files)
    return files


def module_name(relative_path: str) -> str:
    """`cluster_jobs/table.py` -> `cluster_jobs.table`; a package's __init__.py is the package."""
    parts = PurePosixPath(relative_path).with_suffix("").parts
    return ".".join(parts[:-1] if parts[-1] == "__init__" else parts)


def import_closure(repo_root: Path, entry: str, files: list[str]) -> list[str]:
    """The files among `files` that `entry` needs: its module, every module it imports, directly or not, and the
    __init__.py of each package on their way (importing a.b runs a). Every import in a file counts, also one
    inside a function, as in tests/test_architecture.py: a module the keeper could import must be there."""
    modules = {module_name(p): p for p in files if p.endswith(".py")}
    if entry not in modules:
        raise ValueError(f"{entry} is not among the bundle's modules")
    needed: set[str] = set()
    todo = [entry]
    while todo:
        module = todo.pop()
        if module in needed:
            continue
        needed.add(module)
        parts = module.split(".")
        todo.extend(".".join(parts[:i]) for i in range(1, len(parts)) if ".".join(parts[:i]) in modules)
        todo.extend(_imported_modules(module, repo_root, modules))
    return sorted(modules[m] for m in needed)


def _module_file(repo_root: Path, name: str) -> str:
    """The repository-relative file of module `name` in the work tree, or ""."""
    for relative in ("/".join(name.split(".")) + ".py", "/".join(name.split(".")) + "/__init__.py"):
        if (repo_root / relative).is_file() and is_shipped(relative):
            return relative
    return ""


def _imported_modules(module: str, repo_root: Path, modules: dict[str, str]) -> set[str]:
    path = repo_root / modules[module]
    is_package = path.name == "__init__.py"
    found = set()
    for node in ast.walk(ast.parse(path.read_text(encoding="utf-8"), str(path))):
        if isinstance(node, ast.Import):
            names = [alias.name for alias in node.names]
        elif isinstance(node, ast.ImportFrom):
            base = node.module or ""
            if node.level:  # relative: from its package
                anchor = module.split(".") if is_package else module.split(".")[:-1]
                anchor = anchor[: len(anchor) - (node.level - 1)]
                base = ".".join([*anchor, *([node.module] if node.module else [])])
            names = [f"{base}.{alias.name}" for alias in node.names] + [base]  # a name may be a submodule
        else:
            continue
        for name in names:
            if name not in modules and _module_file(repo_root, name):
                # a module in the work tree that git does not track yet: staged without it the function would
                # fail on its import, so it ships (a clean checkout has no such module)
                modules[name] = _module_file(repo_root, name)
            while name and name not in modules:  # the module itself, else the package that holds the name
                name = name.rpartition(".")[0]
            if name and name != module:
                found.add(name)
    return found


def read_lock(repo_root: Path = REPO_ROOT, relative: str = NODE_LOCK) -> Lock:
    return parse_lock((repo_root / relative).read_text(encoding="utf-8"), relative)


def stage_bundle(destination: Path, *, repo_root: Path = REPO_ROOT, bundle: Bundle = NODE_BUNDLE,
                 wheelhouse: Path = WHEELHOUSE) -> Path:
    """Copy the bundle's files, and the lock's wheels from `wheelhouse`, into `destination` (replacing what was
    there) and return it. LockError names a locked package whose wheel is missing or differs."""
    if destination.exists():
        shutil.rmtree(destination)
    destination.mkdir(parents=True)
    for relative in bundled_files(repo_root, bundle):
        target = destination / relative
        _make_dirs(destination, target.parent)
        shutil.copyfile(repo_root / relative, target)  # contents only: modes and times are not the code
        target.chmod(_FILE_MODE)
    if bundle.lock is not None:
        wheels = select_wheels(read_lock(repo_root, bundle.lock), str(wheelhouse),
                               f"run `make setup`: it downloads the wheels {bundle.lock} pins into {wheelhouse}")
        _make_dirs(destination, destination / WHEELHOUSE_DIR_NAME)
        for name in wheels:
            target = destination / WHEELHOUSE_DIR_NAME / name
            shutil.copyfile(wheelhouse / name, target)
            target.chmod(_FILE_MODE)
    return destination


def stage_keeper_code(destination: Path, *, repo_root: Path = REPO_ROOT) -> Path:
    """The job keeper Lambda function's code, staged into `destination` (see KEEPER_CODE)."""
    return stage_bundle(destination, repo_root=repo_root, bundle=KEEPER_CODE)


def _make_dirs(root: Path, directory: Path) -> None:
    """`directory` and its parents up to `root`, each with _DIR_MODE."""
    missing = []
    while directory != root and not directory.exists():
        missing.append(directory)
        directory = directory.parent
    for path in reversed(missing):
        path.mkdir()
        path.chmod(_DIR_MODE)


def _git_tracked(repo_root: Path, sources: list[str]) -> list[str] | None:
    """Files git tracks under `sources`, or None when `repo_root` is not a git work tree (or git is missing)."""
    try:
        result = subprocess.run(
            # Paths relative to repo_root (ls-files' default), also when it sits inside a larger repository.
            ["git", "-C", str(repo_root), "ls-files", "-z", "--", *sources],
            capture_output=True,
            timeout=_GIT_TIMEOUT_S,
            check=False,
        )
    except (OSError, subprocess.TimeoutExpired):
        return None
    if result.returncode != 0:
        return None
    tracked = [p for p in result.stdout.decode().split("\0") if p]
    return tracked or None  # nothing tracked yet (a fresh `git init`): ship the files as they are


def _walk(repo_root: Path, sources: list[str]) -> list[str]:
    files = []
    for source in sources:
        path = repo_root / source
        if path.is_file():
            files.append(source)
        else:
            files.extend(p.relative_to(repo_root).as_posix() for p in path.rglob("*") if p.is_file())
    return files
