"""The node bundle: node_bootstrap, the training package and the instance catalog, staged for one S3 asset.

User-data downloads the asset and unpacks it at /opt/cluster/bundle (docs/architecture.md section 1). The asset
hash names the bundle object and is baked into the launch template, so the bundle must be a pure function of
the committed code: the same checkout gives the same hash whatever tools ran in it before.

So staging copies only source files: in a git checkout, the files git tracks under the bundled packages (a new
module reaches the nodes once it is `git add`ed); elsewhere (an unpacked source archive), every file under
them. In both cases caches and tool state never ship: no hidden files or directories (`.ruff_cache`,
`.pytest_cache`, `.mypy_cache`, editor files), no `__pycache__`, no `*.pyc`, and not the packages' lint config.
A README or test edit does not change the hash either: only the bundled packages are staged.
"""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path, PurePosixPath

REPO_ROOT = Path(__file__).resolve().parent.parent
BUNDLED_PACKAGES = ("node_bootstrap", "training")
# The catalog alone, without the CDK constructs: training reads the GPU peak for MFU from it.
CATALOG = "cluster_constructs/instance_types.py"
_NOT_SHIPPED_NAMES = {"__pycache__", "ruff.toml"}
_NOT_SHIPPED_SUFFIXES = (".pyc", ".pyo")
_GIT_TIMEOUT_S = 30


def is_shipped(relative_path: str) -> bool:
    """Whether a file (a path relative to the repository, with /) belongs in the bundle."""
    parts = PurePosixPath(relative_path).parts
    if any(part.startswith(".") or part in _NOT_SHIPPED_NAMES for part in parts):
        return False
    return not parts[-1].endswith(_NOT_SHIPPED_SUFFIXES)


def bundled_files(repo_root: Path = REPO_ROOT) -> list[str]:
    """The repository-relative paths of every file the bundle holds, sorted."""
    sources = [*BUNDLED_PACKAGES, CATALOG]
    candidates = _git_tracked(repo_root, sources)
    if candidates is None:
        candidates = _walk(repo_root, sources)
    # A tracked file deleted in the work tree is not shipped (and its absence shows up in the tests).
    return sorted(p for p in set(candidates) if is_shipped(p) and (repo_root / p).is_file())


def stage_bundle(destination: Path, *, repo_root: Path = REPO_ROOT) -> Path:
    """Copy the bundle's files into `destination` (replacing what was there) and return it."""
    if destination.exists():
        shutil.rmtree(destination)
    destination.mkdir(parents=True)
    for relative in bundled_files(repo_root):
        target = destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(repo_root / relative, target)  # contents only: modes and times are not the code
    (destination / "cluster_constructs" / "__init__.py").write_text(
        '"""Only the instance catalog is shipped to the nodes."""\n'
    )
    return destination


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
