"""The compile cache (training/compile_cache.py): its key and directories, a real round trip (Inductor's directory
after a cold compile, snapshotted into checkpoint.dir, restored into an empty directory, where the same compile
hits Inductor's FX graph cache and builds no kernel), and every way a snapshot can be bad: ignored with a
warning, nothing extracted, never a failed start."""

from __future__ import annotations

import hashlib
import io
import json
import logging
import os
import shutil
import tarfile
import threading
from pathlib import Path

import pytest
import torch
from torch._dynamo.utils import counters

from training.compile_cache import (
    CACHE_DIR,
    INDUCTOR_ENV,
    MANIFEST,
    CompileCache,
    cache_key,
    compile_cache_for,
    inductor_dir,
    restore_compile_cache,
    save_compile_cache,
)
from training.config import load_config


def config(tmp_path: Path, *overrides: str):
    return load_config("training/configs/tiny-cpu.toml", [f"checkpoint.dir={tmp_path}", *overrides])


def files_under(directory: Path) -> set[str]:
    """Inductor's entries: what a snapshot keeps (no locks, temporary files or markers)."""
    return {p.relative_to(directory).as_posix() for p in directory.rglob("*") if p.is_file()
            and not any(part.startswith(".") for part in p.relative_to(directory).parts)
            and p.relative_to(directory).parts[0] != "locks"}


def test_the_key_changes_with_what_invalidates_a_compiled_graph(tmp_path):
    base = config(tmp_path, "parallel.compile=true")
    assert cache_key(base, 2) == cache_key(config(tmp_path, "parallel.compile=true"), 2)
    assert cache_key(base, 2) != cache_key(base, 4)  # world size
    assert cache_key(base, 2) != cache_key(config(tmp_path, "parallel.compile=true", "run.seq_len=32"), 2)
    assert cache_key(base, 2) != cache_key(config(tmp_path, "parallel.compile=true", "model.n_layers=3"), 2)
    # not a step count or a learning rate: a longer run or another lr compiles the same graphs
    assert cache_key(base, 2) == cache_key(config(tmp_path, "parallel.compile=true", "run.steps=7", "optim.lr=1e-2"), 2)


def test_the_local_directory_is_the_environments_or_one_per_key_and_is_set_only_while_the_run_lasts(
        tmp_path, monkeypatch):
    cfg = config(tmp_path / "ckpt", "parallel.compile=true")
    key = cache_key(cfg, 2)
    monkeypatch.delenv(INDUCTOR_ENV, raising=False)
    (tmp_path / "tmp").mkdir()
    monkeypatch.setenv("TMPDIR", str(tmp_path / "tmp"))  # a node's job: its own /scratch/jobs/<id>
    monkeypatch.setattr("tempfile.tempdir", None)  # tempfile reads TMPDIR again
    cache = compile_cache_for(cfg, 2)
    assert cache == CompileCache(local_dir=tmp_path / "tmp" / f"torchinductor-{key}",
                                 shared_dir=tmp_path / "ckpt" / CACHE_DIR / key)
    with inductor_dir(cache):
        assert os.environ[INDUCTOR_ENV] == str(cache.local_dir)
    assert INDUCTOR_ENV not in os.environ

    monkeypatch.setenv(INDUCTOR_ENV, str(tmp_path / "mine"))  # the operator's own choice is kept
    assert compile_cache_for(cfg, 2).local_dir == tmp_path / "mine"
    with inductor_dir(compile_cache_for(cfg, 2)):
        pass
    assert os.environ[INDUCTOR_ENV] == str(tmp_path / "mine")
    assert compile_cache_for(config(tmp_path), 2) is None  # no torch.compile: nothing to keep


def compile_small_function() -> tuple[int, int]:
    """A fresh torch.compile of a forward and backward (dynamo's and Inductor's in-memory caches cleared first):
    the FX graph cache's (hits, misses), which count lookups in the directory on disk."""
    torch._dynamo.reset()
    torch._inductor.utils.clear_caches()
    counters.clear()
    f = torch.compile(lambda x, w: torch.relu(x @ w).sum())
    w = torch.randn(16, 16, requires_grad=True)
    f(torch.randn(4, 16), w).backward()
    return counters["inductor"]["fxgraph_cache_hit"], counters["inductor"]["fxgraph_cache_miss"]


@pytest.mark.slow
def test_a_cold_compiles_directory_restored_elsewhere_compiles_warm_and_builds_nothing(tmp_path, caplog):
    shared = tmp_path / "ckpt" / CACHE_DIR / "key"
    first = CompileCache(local_dir=tmp_path / "node-1", shared_dir=shared)
    with inductor_dir(first):
        assert restore_compile_cache(first) is False  # nothing saved yet: cold, and no warning
        hits, misses = compile_small_function()
        assert hits == 0 and misses > 0
        with caplog.at_level(logging.INFO, logger="training.compile_cache"):
            assert save_compile_cache(first)
    manifest = json.loads((shared / MANIFEST).read_text())
    snapshot = shared / manifest["tar"]
    assert hashlib.sha256(snapshot.read_bytes()).hexdigest() == manifest["sha256"]
    with tarfile.open(snapshot) as tar:
        kept = set(tar.getnames())
    assert kept == files_under(first.local_dir) and any(name.endswith(".so") for name in kept)  # C++ kernels too
    assert manifest["files"] == len(kept) and "WARNING" not in caplog.text

    shutil.rmtree(first.local_dir)  # the spare: nothing of node 1's directory but the snapshot
    spare = CompileCache(local_dir=tmp_path / "spare", shared_dir=shared)
    with inductor_dir(spare):
        assert restore_compile_cache(spare) is True
        assert files_under(spare.local_dir) == kept
        hits, misses = compile_small_function()
    assert hits > 0 and misses == 0
    assert files_under(spare.local_dir) == kept  # every kernel came from the snapshot: none was built


def make_snapshot(shared: Path, members: dict[str, bytes], *, link: str | None = None) -> dict:
    buffer = io.BytesIO()
    with tarfile.open(fileobj=buffer, mode="w") as tar:
        for name, content in members.items():
            info = tarfile.TarInfo(name)
            info.size = len(content)
            tar.addfile(info, io.BytesIO(content))
        if link is not None:
            info = tarfile.TarInfo("ab/evil.so")
            info.type, info.linkname = tarfile.SYMTYPE, link
            tar.addfile(info)
    data = buffer.getvalue()
    shared.mkdir(parents=True, exist_ok=True)
    (shared / "inductor-test.tar").write_bytes(data)
    manifest = {"tar": "inductor-test.tar", "sha256": hashlib.sha256(data).hexdigest()}
    (shared / MANIFEST).write_text(json.dumps(manifest))
    return manifest


@pytest.mark.parametrize("spoil, why", [
    ("manifest-garbage", "JSONDecodeError"),
    ("manifest-no-sha", "KeyError"),
    ("manifest-path", "the manifest names '../../elsewhere.tar', not a file beside it"),
    ("tar-missing", "FileNotFoundError"),
    ("tar-truncated", "its sha256 is not the manifest's"),
    ("member-escapes", "member '../outside.py' is not a cache file under the directory"),
    ("member-absolute", "member '/etc/cron.d/x' is not a cache file under the directory"),
    ("member-link", "member 'ab/evil.so' is not a cache file under the directory"),
])
def test_a_bad_snapshot_is_ignored_with_a_warning_and_nothing_is_extracted(tmp_path, caplog, spoil, why):
    cache = CompileCache(local_dir=tmp_path / "local", shared_dir=tmp_path / "shared")
    good = {"ab/cabc.py": b"print('kernel')\n", "fxgraph/x/y/entry": b"\x80\x04."}
    members = dict(good)
    if spoil == "member-escapes":
        members["../outside.py"] = b"owned"
    if spoil == "member-absolute":
        members["/etc/cron.d/x"] = b"owned"
    manifest = make_snapshot(cache.shared_dir, members, link="/etc/passwd" if spoil == "member-link" else None)
    if spoil == "manifest-garbage":
        cache.manifest.write_text("{not json")
    if spoil == "manifest-no-sha":
        cache.manifest.write_text(json.dumps({"tar": manifest["tar"]}))
    if spoil == "manifest-path":
        cache.manifest.write_text(json.dumps({**manifest, "tar": "../../elsewhere.tar"}))
    if spoil == "tar-missing":
        (cache.shared_dir / manifest["tar"]).unlink()
    if spoil == "tar-truncated":
        tar = cache.shared_dir / manifest["tar"]
        tar.write_bytes(tar.read_bytes()[:700])
    with caplog.at_level(logging.WARNING, logger="training.compile_cache"):
        assert restore_compile_cache(cache) is False
    assert "not used (" in caplog.text and why in caplog.text and "compiling cold" in caplog.text, caplog.text
    assert not (tmp_path / "outside.py").exists()
    assert not cache.local_dir.exists() or files_under(cache.local_dir) == set()  # nothing half-restored


def test_a_good_snapshot_is_restored_once_per_node_and_local_files_are_kept(tmp_path, caplog):
    cache = CompileCache(local_dir=tmp_path / "local", shared_dir=tmp_path / "shared")
    make_snapshot(cache.shared_dir, {"ab/cabc.py": b"from the snapshot\n", "cd/ccd.so": b"\x7fELF..."})
    (cache.local_dir / "ab").mkdir(parents=True)
    (cache.local_dir / "ab/cabc.py").write_text("this node's own\n")
    results: list[bool] = []
    with caplog.at_level(logging.INFO, logger="training.compile_cache"):
        ranks = [threading.Thread(target=lambda: results.append(restore_compile_cache(cache))) for _ in range(4)]
        for rank in ranks:
            rank.start()
        for rank in ranks:
            rank.join()
    assert results == [True] * 4  # the node's four ranks: one restores, the others find its marker
    assert caplog.text.count("compile cache restored from") == 1
    assert (cache.local_dir / "ab/cabc.py").read_text() == "this node's own\n"
    assert (cache.local_dir / "cd/ccd.so").read_bytes() == b"\x7fELF..."


def test_a_new_snapshot_replaces_the_old_one_and_an_unwritable_directory_is_a_warning(tmp_path, caplog):
    cache = CompileCache(local_dir=tmp_path / "local", shared_dir=tmp_path / "shared")
    (cache.local_dir / "ab").mkdir(parents=True)
    (cache.local_dir / "ab/one.py").write_text("1\n")
    (cache.local_dir / "locks").mkdir()
    (cache.local_dir / "locks/x.lock").write_text("")
    (cache.local_dir / "ab/.one.py.123.tmp").write_text("half")
    (cache.local_dir / "triton/0/tmp.pid_123_456").mkdir(parents=True)
    (cache.local_dir / "triton/0/tmp.pid_123_456/kernel.cubin").write_text("half")
    assert save_compile_cache(cache)
    first = json.loads(cache.manifest.read_text())["tar"]
    (cache.local_dir / "ab/two.py").write_text("2\n")
    assert save_compile_cache(cache)
    second = json.loads(cache.manifest.read_text())
    assert second["files"] == 2 and second["tar"] != first
    assert sorted(p.name for p in cache.shared_dir.iterdir()) == sorted([MANIFEST, second["tar"]])
    with tarfile.open(cache.shared_dir / second["tar"]) as tar:
        assert sorted(tar.getnames()) == ["ab/one.py", "ab/two.py"]  # no locks, no temporary files (Triton's too)

    blocked = CompileCache(local_dir=cache.local_dir, shared_dir=tmp_path / "a-file" / "key")
    (tmp_path / "a-file").write_text("")
    with caplog.at_level(logging.WARNING, logger="training.compile_cache"):
        assert save_compile_cache(blocked) is False
    assert f"compile cache not saved to {blocked.shared_dir}" in caplog.text
