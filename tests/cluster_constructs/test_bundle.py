"""The node bundle and the job keeper's code are pure functions of the committed code: caches, tool state and
untracked files never change their asset hashes (and so the launch template and the function), whatever ran in
the checkout before `cdk synth`."""

import os
import shutil
import stat
import subprocess
from pathlib import Path

import pytest
from aws_cdk import FileSystem

from cluster_constructs.bundle import (
    KEEPER_CODE,
    NODE_BUNDLE,
    REPO_ROOT,
    bundled_files,
    is_shipped,
    stage_bundle,
    stage_keeper_code,
)

GIT = shutil.which("git")
RUFF = Path(REPO_ROOT / ".venv" / "bin" / "ruff")
# What lint, tests and editors leave inside the bundled packages.
JUNK = {
    "node_bootstrap/.ruff_cache/0.17.5/12345678901234567890": "cache",
    "node_bootstrap/.ruff_cache/CACHEDIR.TAG": "Signature: 8a477f597d28d172789f06886806bc55",
    "node_bootstrap/__pycache__/config.cpython-311.pyc": "bytecode",
    "training/__pycache__/train.cpython-39.pyc": "bytecode",
    "training/.pytest_cache/v/cache/lastfailed": "{}",
    "training/.mypy_cache/3.11/x.json": "{}",
    "training/configs/.tiny-cpu.toml.swp": "editor",
    "node_bootstrap/jobs/stray.pyc": "bytecode",
    "cluster_jobs/__pycache__/table.cpython-311.pyc": "bytecode",
    "job_keeper/.ruff_cache/CACHEDIR.TAG": "Signature: 8a477f597d28d172789f06886806bc55",
}
BUNDLES = {"node": NODE_BUNDLE, "keeper": KEEPER_CODE}


def _copy_sources(destination: Path) -> Path:
    """A checkout of the bundled packages (their files as the repository has them) in `destination`."""
    sources = {*bundled_files(REPO_ROOT, NODE_BUNDLE), *bundled_files(REPO_ROOT, KEEPER_CODE)}
    for relative in [*sorted(sources), "pyproject.toml", "node_bootstrap/ruff.toml"]:
        # (ruff.toml is not shipped, but lint reads it)
        target = destination / relative
        target.parent.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(REPO_ROOT / relative, target)
    return destination


def _git(repo: Path, *args: str) -> None:
    subprocess.run(
        ["git", "-C", str(repo), "-c", "user.name=t", "-c", "user.email=t@example.invalid", *args],
        check=True,
        capture_output=True,
        timeout=60,
    )


def _fingerprint(repo: Path, tmp_path: Path, name: str, bundle=NODE_BUNDLE) -> str:
    return FileSystem.fingerprint(str(stage_bundle(tmp_path / name, repo_root=repo, bundle=bundle)))


def _in_a_cache(relative: str) -> bool:
    """Under a cache directory (__pycache__, .ruff_cache, ...): a module such as training/compile_cache.py is not."""
    return any(part.endswith("cache") for part in relative.split("/")[:-1])


def _add_junk(repo: Path) -> None:
    for relative, text in JUNK.items():
        (repo / relative).parent.mkdir(parents=True, exist_ok=True)
        (repo / relative).write_text(text)


@pytest.fixture
def git_checkout(tmp_path):
    if GIT is None:
        pytest.skip("git is not installed")
    repo = _copy_sources(tmp_path / "repo")
    _git(repo, "init", "-q")
    _git(repo, "add", "-A")
    _git(repo, "commit", "-q", "-m", "sources")
    return repo


@pytest.mark.parametrize("name", sorted(BUNDLES))
def test_caches_and_untracked_files_do_not_change_the_bundle_hash(git_checkout, tmp_path, name):
    bundle = BUNDLES[name]
    before = _fingerprint(git_checkout, tmp_path, "before", bundle)
    _add_junk(git_checkout)
    (git_checkout / "training" / "scratch_notes.py").write_text("print('not committed')\n")
    (git_checkout / "cluster_jobs" / "scratch_notes.py").write_text("print('not committed')\n")
    after = _fingerprint(git_checkout, tmp_path, "after", bundle)
    assert after == before
    staged = {p.relative_to(tmp_path / "after").as_posix() for p in (tmp_path / "after").rglob("*") if p.is_file()}
    assert not {p for p in staged if _in_a_cache(p) or p.endswith((".pyc", ".swp")) or "scratch_notes" in p}
    if bundle is NODE_BUNDLE:
        assert "training/configs/tiny-cpu.toml" in staged and "instance_catalog/instance_types.py" in staged
    else:
        assert "node_bootstrap/job_contract.py" in staged and "cluster_jobs/table.py" in staged


def test_a_code_change_does_change_the_bundle_hash(git_checkout, tmp_path):
    before = _fingerprint(git_checkout, tmp_path, "before")
    with (git_checkout / "node_bootstrap" / "config.py").open("a") as f:
        f.write("# a change the nodes must get\n")
    assert _fingerprint(git_checkout, tmp_path, "after") != before


@pytest.mark.skipif(not RUFF.exists(), reason="ruff is installed by make setup")
def test_linting_leaves_no_cache_inside_the_packages(git_checkout, tmp_path):
    before = _fingerprint(git_checkout, tmp_path, "before")
    # What `make lint` runs (without --no-cache: the point is where the cache goes). `ruff check .` used to
    # write node_bootstrap/.ruff_cache, node_bootstrap having a ruff.toml of its own.
    for args in (["check", "."], ["check", "--config", "node_bootstrap/ruff.toml", "node_bootstrap"]):
        result = subprocess.run(
            [str(RUFF), *args], cwd=git_checkout, capture_output=True, text=True, timeout=120
        )
        assert result.returncode == 0, result.stdout + result.stderr
    assert [p.relative_to(git_checkout).as_posix() for p in git_checkout.rglob(".ruff_cache")] == [".ruff_cache"]
    assert _fingerprint(git_checkout, tmp_path, "after") == before


@pytest.mark.parametrize("name", sorted(BUNDLES))
def test_without_git_caches_are_still_left_out(tmp_path, name):
    repo = _copy_sources(tmp_path / "archive")  # an unpacked source archive: no .git
    before = _fingerprint(repo, tmp_path, "before", BUNDLES[name])
    _add_junk(repo)
    assert _fingerprint(repo, tmp_path, "after", BUNDLES[name]) == before


def test_a_job_model_change_changes_the_keeper_code_and_not_the_node_bundle(git_checkout, tmp_path):
    node, keeper = (_fingerprint(git_checkout, tmp_path, f"before-{n}", BUNDLES[n]) for n in ("node", "keeper"))
    with (git_checkout / "cluster_jobs" / "table.py").open("a") as f:
        f.write("# a change the keeper must get\n")
    assert _fingerprint(git_checkout, tmp_path, "after-keeper", KEEPER_CODE) != keeper
    assert _fingerprint(git_checkout, tmp_path, "after-node", NODE_BUNDLE) == node


def test_a_clusterctl_change_changes_neither_asset(git_checkout, tmp_path):
    before = {n: _fingerprint(git_checkout, tmp_path, f"before-{n}", BUNDLES[n]) for n in BUNDLES}
    (git_checkout / "clusterctl").mkdir()
    (git_checkout / "clusterctl" / "cli.py").write_text("# the CLI is neither on the nodes nor in the keeper\n")
    _git(git_checkout, "add", "-A")
    _git(git_checkout, "commit", "-q", "-m", "clusterctl")
    assert {n: _fingerprint(git_checkout, tmp_path, f"after-{n}", BUNDLES[n]) for n in BUNDLES} == before


def _staged_files(root: Path) -> list[str]:
    return sorted(p.relative_to(root).as_posix() for p in root.rglob("*") if p.is_file() or p.is_symlink())


@pytest.mark.skipif(GIT is None or not (REPO_ROOT / ".git").exists(), reason="needs the git checkout")
def test_the_keeper_code_holds_exactly_the_keeper_and_the_modules_it_imports(tmp_path):
    staged = stage_keeper_code(tmp_path / "keeper")
    files = _staged_files(staged)
    # the handler's modules and what they import (tests/test_architecture.py checks the list against the
    # imports): no clusterctl, no CDK constructs, no tests, no docs; of the nodes' code only the job contract,
    # and nothing of the trainer
    assert {f.split("/")[0] for f in files} == {"cluster_aws", "cluster_jobs", "job_keeper", "node_bootstrap"}
    assert "job_keeper/handler.py" in files and "cluster_jobs/table.py" in files
    assert [f for f in files if f.startswith("node_bootstrap/")] == ["node_bootstrap/__init__.py",
                                                                      "node_bootstrap/job_contract.py"]
    assert "cluster_jobs/request.py" not in files and "cluster_jobs/records.py" not in files  # clusterctl's
    assert all(f.endswith(".py") and (REPO_ROOT / f).is_file() for f in files)
    assert not [f for f in files if "__pycache__" in f or f.endswith((".pyc", ".pyo")) or "/." in f]
    # staging again gives the same asset hash: a pure function of the committed code
    assert FileSystem.fingerprint(str(staged)) == FileSystem.fingerprint(
        str(stage_keeper_code(tmp_path / "again")))


def test_staged_files_are_world_readable_whatever_the_umask(tmp_path):
    # The CLI zips each file with its mode, and Lambda runs the code as another user than the file's owner.
    old = os.umask(0o077)
    try:
        staged = stage_keeper_code(tmp_path / "keeper")
    finally:
        os.umask(old)
    modes = {stat.S_IMODE(p.stat().st_mode) for p in staged.rglob("*") if p.is_file()}
    assert modes == {0o644}
    assert {stat.S_IMODE(p.stat().st_mode) for p in staged.rglob("*") if p.is_dir()} == {0o755}


def test_shipped_files_are_sources_only():
    assert is_shipped("training/configs/1b.toml") and is_shipped("node_bootstrap/user_data.sh")
    for path in JUNK:
        assert not is_shipped(path), path
    assert not is_shipped("node_bootstrap/ruff.toml")
    files = bundled_files()
    assert "node_bootstrap/__main__.py" in files and "training/__main__.py" in files
    assert {f.split("/")[0] for f in files} == {"instance_catalog", "node_bootstrap", "training"}
    assert "instance_catalog/instance_types.py" in files  # training's MFU reads the GPU peak from it


# --- the training lock's wheels -----------------------------------------------------------------------------


def test_the_node_bundle_carries_exactly_the_locked_wheels(tmp_path):
    wheelhouse = tmp_path / "wheelhouse"
    shutil.copytree(REPO_ROOT / "build" / "wheelhouse", wheelhouse)
    (wheelhouse / "torchao-0.17.0-cp310-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"an older download")
    (wheelhouse / "six-1.16.0-py2.py3-none-any.whl").write_bytes(b"not in the lock")
    staged = stage_bundle(tmp_path / "bundle", wheelhouse=wheelhouse)
    assert sorted(p.name for p in (staged / "wheelhouse").iterdir()) == [
        "safetensors-0.8.0-cp310-abi3-manylinux_2_17_x86_64.manylinux2014_x86_64.whl",
        "torchao-0.18.0-cp310-abi3-manylinux_2_24_x86_64.manylinux_2_28_x86_64.whl"]
    assert (staged / "training" / "node-requirements.txt").exists()  # the lock itself, beside the trainer
    assert not (stage_keeper_code(tmp_path / "keeper") / "wheelhouse").exists()


def test_a_missing_or_different_wheel_stops_the_synthesis(tmp_path):
    from node_bootstrap.package_lock import LockError

    empty = tmp_path / "empty"
    empty.mkdir()
    with pytest.raises(LockError, match=rf"^torchao==0\.18\.0: no wheel in {empty}: run `make setup`: it "
                                        r"downloads the wheels training/node-requirements\.txt pins into "):
        stage_bundle(tmp_path / "a", wheelhouse=empty)
    tampered = tmp_path / "tampered"
    shutil.copytree(REPO_ROOT / "build" / "wheelhouse", tampered)
    [wheel] = tampered.glob("torchao-*.whl")
    wheel.write_bytes(wheel.read_bytes() + b"\0")
    with pytest.raises(LockError, match=r"^torchao==0\.18\.0: hash mismatch: torchao-0\.18\.0-.*\.whl has sha256 "):
        stage_bundle(tmp_path / "b", wheelhouse=tampered)
