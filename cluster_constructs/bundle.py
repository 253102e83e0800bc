"""The node bundle: node_bootstrap, the training package and the instance catalog, staged for one S3 asset.

User-data downloads the asset and unpacks it at /opt/cluster/bundle (docs/architecture.md section 1). Staging
copies only those packages, so the asset hash (and the launch template) changes only when code the nodes run
changes, never for a README or test edit.
"""

from __future__ import annotations

import shutil
from pathlib import Path

REPO_ROOT = Path(__file__).resolve().parent.parent
BUNDLED_PACKAGES = ("node_bootstrap", "training")
_IGNORE = shutil.ignore_patterns("__pycache__", "*.pyc", "ruff.toml", ".pytest_cache")


def stage_bundle(destination: Path, *, repo_root: Path = REPO_ROOT) -> Path:
    """Copy the bundled packages into `destination` (replacing what was there) and return it."""
    if destination.exists():
        shutil.rmtree(destination)
    destination.mkdir(parents=True)
    for package in BUNDLED_PACKAGES:
        shutil.copytree(repo_root / package, destination / package, ignore=_IGNORE)
    # The catalog alone, without the CDK constructs: training reads the GPU peak for MFU from it.
    catalog = destination / "cluster_constructs"
    catalog.mkdir()
    (catalog / "__init__.py").write_text('"""Only the instance catalog is shipped to the nodes."""\n')
    shutil.copy2(repo_root / "cluster_constructs" / "instance_types.py", catalog / "instance_types.py")
    return destination
