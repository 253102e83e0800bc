"""A warm torch.compile at every restart: Inductor's cache directory, snapshotted into the job's checkpoint
directory (FSx, which every node of the job sees) under a key of what invalidates it, and restored into the
local Inductor directory of a node that lacks it (the spare that starts attempt 2).

The whole directory, not torch.compiler's portable cache artifacts: the artifacts hold the FX graph and
AOTAutograd entries (and, on a GPU, the Triton kernels), but not the C++ kernels Inductor builds for a CPU, so
on the CPU they bought nothing (docs/benchmarks.md, "Cold and warm compile"); the directory holds everything
Inductor wrote.

- Where Inductor writes: TORCHINDUCTOR_CACHE_DIR when the environment names one, otherwise
  <temp dir>/torchinductor-<key> (on a node the temp dir is the job's own /scratch/jobs/<id>), set for the
  duration of the run (`inductor_dir`).
- The snapshot: <checkpoint.dir>/compile-cache/<key>/inductor-<sha256 prefix>.tar and manifest.json naming it
  with its sha256, written by rank 0 after its first step when it compiled cold (both replaced atomically: a
  reader sees the old pair or the new one).
- The restore, before the first compile: once per node and snapshot (a lock and a marker in the local
  directory, which the node's ranks share); the tar's sha256 is checked before anything is extracted, and a
  file Inductor already has locally is kept.

A missing snapshot is a cold compile; an unreadable, stale or corrupt one is ignored with a warning (and replaced
after the cold compile): never a failed start. The snapshot is code the job runs (Inductor's kernels), kept in
the job's own checkpoint directory, which only the job user of this job writes (docs/security.md); the trainer
runs as that user, so the snapshot crosses no privilege boundary.
"""

from __future__ import annotations

import contextlib
import fcntl
import hashlib
import io
import json
import logging
import os
import platform
import sys
import tarfile
import tempfile
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path, PurePosixPath

import torch

from training.config import TrainConfig
from training.env_vars import env_var

log = logging.getLogger(__name__)

CACHE_DIR = "compile-cache"  # in checkpoint.dir
MANIFEST = "manifest.json"
INDUCTOR_ENV = "TORCHINDUCTOR_CACHE_DIR"
_LOCK = ".restore.lock"  # in the local directory: the node's ranks restore one at a time


@dataclass(frozen=True)
class CompileCache:
    """One run's Inductor directory on this node and its snapshot's directory in checkpoint.dir."""

    local_dir: Path
    shared_dir: Path

    @property
    def manifest(self) -> Path:
        return self.shared_dir / MANIFEST


def cache_key(cfg: TrainConfig, world_size: int) -> str:
    """What a compiled graph depends on: another value of any of these compiles other graphs."""
    sections = cfg.to_dict()
    parts = {"torch": torch.__version__, "python": list(sys.version_info[:2]), "machine": platform.machine(),
             "model": sections["model"], "parallel": sections["parallel"], "fp8": sections["fp8"],
             "seq_len": cfg.run.seq_len, "micro_batch_size": cfg.run.micro_batch_size, "world_size": world_size}
    return hashlib.sha256(json.dumps(parts, sort_keys=True, default=str).encode()).hexdigest()[:16]


def compile_cache_for(cfg: TrainConfig, world_size: int) -> CompileCache | None:
    """This run's cache; None without torch.compile or without a checkpoint directory."""
    if not cfg.parallel.compile or not cfg.checkpoint.dir:
        return None
    key = cache_key(cfg, world_size)
    local = os.environ.get(INDUCTOR_ENV) or os.path.join(tempfile.gettempdir(), f"torchinductor-{key}")
    return CompileCache(local_dir=Path(local), shared_dir=Path(cfg.checkpoint.dir) / CACHE_DIR / key)


@contextlib.contextmanager
def inductor_dir(cache: CompileCache | None) -> Iterator[None]:
    """Inductor writes into the cache's local directory while the run lasts (the environment as it was after)."""
    if cache is None:
        yield
        return
    with env_var(INDUCTOR_ENV, str(cache.local_dir)):
        yield


def restore_compile_cache(cache: CompileCache | None) -> bool:
    """Whether a snapshot is in the local directory (restored now, or by another rank of this node) before the
    first compile."""
    if cache is None:
        return False
    try:
        manifest = json.loads(cache.manifest.read_text())
        sha256, name = str(manifest["sha256"]), str(manifest["tar"])
    except FileNotFoundError:
        return False  # never saved: a cold compile
    except (OSError, ValueError, KeyError, TypeError) as e:
        return _not_used(cache.manifest, f"{type(e).__name__}: {e}")
    tar_path = cache.shared_dir / name
    if PurePosixPath(name).name != name:
        return _not_used(cache.manifest, f"the manifest names {name!r}, not a file beside it")
    try:
        cache.local_dir.mkdir(parents=True, exist_ok=True)
        with open(cache.local_dir / _LOCK, "a") as lock:
            fcntl.flock(lock, fcntl.LOCK_EX)  # released when the file is closed
            marker = cache.local_dir / f".restored-{sha256[:16]}"
            if marker.exists():
                return True
            data = tar_path.read_bytes()
            if hashlib.sha256(data).hexdigest() != sha256:
                return _not_used(tar_path, "its sha256 is not the manifest's")
            files = _extract(data, cache.local_dir)
            marker.touch()
    except (OSError, tarfile.TarError, ValueError) as e:
        return _not_used(tar_path, f"{type(e).__name__}: {e}")
    log.info("compile cache restored from %s into %s (%d files)", tar_path, cache.local_dir, files)
    return True


def save_compile_cache(cache: CompileCache | None) -> bool:
    """After the first step compiled cold (forward and backward): the local directory as a snapshot in
    checkpoint.dir. A failed write is a warning: the run goes on."""
    if cache is None or not cache.local_dir.is_dir():
        return False
    data, files = _snapshot(cache.local_dir)
    sha256 = hashlib.sha256(data).hexdigest()
    name = f"inductor-{sha256[:16]}.tar"
    try:
        cache.shared_dir.mkdir(parents=True, exist_ok=True)
        _write_atomic(cache.shared_dir / name, data)
        _write_atomic(cache.manifest, json.dumps({"tar": name, "sha256": sha256, "bytes": len(data), "files": files,
                                                   "torch": torch.__version__}, indent=2).encode())
    except OSError as e:
        log.warning("compile cache not saved to %s: %s", cache.shared_dir, e)
        return False
    for old in cache.shared_dir.glob("inductor-*.tar"):
        if old.name != name:  # a reader that still holds the old manifest ignores the missing file and compiles
            old.unlink(missing_ok=True)
    log.info("compile cache saved to %s (%d files, %d bytes)", cache.shared_dir / name, files, len(data))
    return True


def _not_used(path: Path, why: str) -> bool:
    log.warning("compile cache %s not used (%s): compiling cold", path, why)
    return False


def _kept(relative: PurePosixPath) -> bool:
    """What a snapshot holds: Inductor's entries, not its locks, temporary files (Inductor's ".<name>.<pid>.tmp",
    Triton's "tmp.pid_<pid>_<id>/" directories) or this module's markers."""
    return (relative.parts[0] != "locks" and relative.suffix not in (".tmp", ".lock")
            and not any(part.startswith((".", "tmp.pid_")) for part in relative.parts))


def _snapshot(local_dir: Path) -> tuple[bytes, int]:
    buffer, files = io.BytesIO(), 0
    with tarfile.open(fileobj=buffer, mode="w", format=tarfile.PAX_FORMAT) as tar:
        for dirpath, dirnames, filenames in os.walk(local_dir):
            dirnames.sort()
            for filename in sorted(filenames):
                path = Path(dirpath, filename)
                relative = PurePosixPath(path.relative_to(local_dir).as_posix())
                if not _kept(relative) or path.is_symlink():
                    continue
                try:  # another rank of this node may write (rename) or remove an entry meanwhile
                    content = path.read_bytes()
                except FileNotFoundError:
                    continue
                info = tarfile.TarInfo(str(relative))
                info.size, info.mode, info.mtime = len(content), path.stat().st_mode & 0o755, 0
                tar.addfile(info, io.BytesIO(content))
                files += 1
    return buffer.getvalue(), files


def _extract(data: bytes, local_dir: Path) -> int:
    """Every member checked before any is written (regular files under relative paths only), then each file
    written atomically; a file already present is kept (Inductor names its entries by their content)."""
    with tarfile.open(fileobj=io.BytesIO(data), mode="r:") as tar:
        members = tar.getmembers()
        for member in members:
            relative = PurePosixPath(member.name)
            if not member.isfile() or relative.is_absolute() or ".." in relative.parts or not _kept(relative):
                raise ValueError(f"member {member.name!r} is not a cache file under the directory")
        for member in members:
            target = local_dir.joinpath(*PurePosixPath(member.name).parts)
            if target.exists():
                continue
            source = tar.extractfile(member)
            assert source is not None  # a regular file (checked above)
            target.parent.mkdir(parents=True, exist_ok=True)
            _write_atomic(target, source.read(), mode=member.mode & 0o755)
    return len(members)


def _write_atomic(path: Path, data: bytes, mode: int = 0o644) -> None:
    tmp = path.with_name(f".{path.name}.{os.getpid()}.tmp")
    try:
        with open(tmp, "wb") as f:
            os.fchmod(f.fileno(), mode)
            f.write(data)
            f.flush()
            os.fsync(f.fileno())
        os.replace(tmp, path)
    finally:
        tmp.unlink(missing_ok=True)
