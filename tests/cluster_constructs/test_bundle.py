"""The node bundle is a pure function of the committed code: caches, tool state and untracked files never
change its asset hash (and so the launch template), whatever ran in the checkout before `cdk synth`."""

import shutil
import subprocess
from pathlib import Path

import pytest
from aws_cdk import FileSystem

from cluster_constructs.bundle import REPO_ROOT, bundled_files, is_shipped, stage_bundle

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
}


def _copy_sources(destination: Path) -> Path:
    """A checkout of the bundled packages (their files as the repository has them) in `destination`."""
    for relative in [*bundled_files(REPO_ROOT), "pyproject.toml", "node_bootstrap/ruff.toml"]:
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


def _fingerprint(repo: Path, tmp_path: Path, name: str) -> str:
    return FileSystem.fingerprint(str(stage_bundle(tmp_path / name, repo_root=repo)))


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


def test_caches_and_untracked_files_do_not_change_the_bundle_hash(git_checkout, tmp_path):
    before = _fingerprint(git_checkout, tmp_path, "before")
    _add_junk(git_checkout)
    (git_checkout / "training" / "scratch_notes.py").write_text("print('not committed')\n")
    after = _fingerprint(git_checkout, tmp_path, "after")
    assert after == before
    staged = {p.relative_to(tmp_path / "after").as_posix() for p in (tmp_path / "after").rglob("*") if p.is_file()}
    assert not {p for p in staged if "cache" in p or p.endswith((".pyc", ".swp")) or "scratch_notes" in p}
    assert "training/configs/tiny-cpu.toml" in staged and "cluster_constructs/instance_types.py" in staged


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


def test_without_git_caches_are_still_left_out(tmp_path):
    repo = _copy_sources(tmp_path / "archive")  # an unpacked source archive: no .git
    before = _fingerprint(repo, tmp_path, "before")
    _add_junk(repo)
    assert _fingerprint(repo, tmp_path, "after") == before


def test_shipped_files_are_sources_only():
    assert is_shipped("training/configs/1b.toml") and is_shipped("node_bootstrap/user_data.sh")
    for path in JUNK:
        assert not is_shipped(path), path
    assert not is_shipped("node_bootstrap/ruff.toml")
    files = bundled_files()
    assert "node_bootstrap/__main__.py" in files and "training/__main__.py" in files
    assert [f for f in files if f.startswith("cluster_constructs/")] == ["cluster_constructs/instance_types.py"]
