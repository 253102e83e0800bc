"""The training lock: what the trainer imports on a node beyond the Deep Learning AMI's PyTorch, pinned.

The lock (training/node-requirements.txt in the repository, in the bundle on a node) is a pip requirements
file in hash-checking mode: one `name==version` per package with its `--hash=sha256:...` options, so pip
itself refuses a wheel whose bytes differ. Two comment lines say what pip cannot:

    # fits-torch: >=2.11,<2.14     the torch releases these wheels were chosen for; the step refuses others
    # (a name==version line per package, each with its hashes)

The torch on a node is the AMI's and is never installed from the lock (a second torch would shadow the one the
DLAMI built against its driver, NCCL and EFA). Which FP8 backends a lock provides follows from its packages
(FP8_BACKEND_PACKAGES); the stack reports them, `clusterctl submit` checks configs against them.
Standard library only, Python 3.9: node_bootstrap reads the lock on the node; the stack and clusterctl too.
"""

from __future__ import annotations

import hashlib
import os
import re
from dataclasses import dataclass

# fp8.backend value -> the distribution that provides it ("none" needs nothing beyond torch). TE's PyTorch
# extension is the one that marks "te": the lock pins it with transformer-engine and transformer-engine-cu12.
FP8_BACKEND_PACKAGES: dict[str, str] = {"torchao": "torchao", "te": "transformer-engine-torch"}
_REQUIREMENT = re.compile(r"^([A-Za-z0-9][A-Za-z0-9._-]*)==([A-Za-z0-9.+!-]+)$")
_HASH = re.compile(r"^--hash=sha256:([0-9a-f]{64})$")
_VERSION_RANGE = re.compile(r"^(>=|<|==)\s*([0-9]+(?:\.[0-9]+)*)$")
_FITS_TORCH = "# fits-torch:"


class LockError(ValueError):
    """The lock cannot be read or satisfied; the message names the package (or line) and the reason."""


@dataclass(frozen=True)
class LockedPackage:
    name: str  # as written in the lock
    version: str
    sha256: tuple[str, ...]  # every hash the lock accepts (one per wheel it may come from)

    @property
    def normalized(self) -> str:
        return normalize(self.name)

    def pin(self) -> str:
        return f"{self.name}=={self.version}"


@dataclass(frozen=True)
class Lock:
    packages: tuple[LockedPackage, ...]
    fits_torch: tuple[tuple[str, tuple[int, ...]], ...]  # (operator, release) pairs, all must hold
    fits_torch_text: str

    def package(self, name: str) -> LockedPackage | None:
        wanted = normalize(name)
        return next((p for p in self.packages if p.normalized == wanted), None)

    def fp8_backends(self) -> list[str]:
        """The fp8.backend values jobs can use with this lock installed, "none" first."""
        provided = [b for b, dist in FP8_BACKEND_PACKAGES.items() if self.package(dist) is not None]
        return ["none"] + provided

    def torch_fits(self, torch_version: str) -> bool:
        release = release_of(torch_version)
        return all(_compare(release, op, bound) for op, bound in self.fits_torch)


def normalize(name: str) -> str:
    """PEP 503 name normalization: runs of -, _ and . become -, lower case."""
    return re.sub(r"[-_.]+", "-", name).lower()


def release_of(version: str) -> tuple[int, ...]:
    """(2, 13, 0) for "2.13.0+cu130" or "2.13.0a0": the leading numeric release, local and pre tags dropped."""
    match = re.match(r"^([0-9]+(?:\.[0-9]+)*)", version.strip())
    if not match:
        raise LockError(f"cannot read the version {version!r}")
    return tuple(int(part) for part in match.group(1).split("."))


def parse_lock(text: str, source: str = "the lock") -> Lock:
    """Read a lock; LockError names `source`, the line and what is allowed."""
    packages: list[LockedPackage] = []
    fits: tuple[tuple[str, tuple[int, ...]], ...] | None = None
    fits_text = ""
    for number, line in _logical_lines(text):
        if line.startswith(_FITS_TORCH):
            fits_text = line[len(_FITS_TORCH):].strip()
            fits = _parse_range(fits_text, f"{source} line {number}")
            continue
        if not line or line.startswith("#"):
            continue
        words = line.split()
        match = _REQUIREMENT.fullmatch(words[0])
        if not match:
            raise LockError(f"{source} line {number}: {words[0]!r}: allowed: name==version with --hash options "
                            "(a lock pins exact versions)")
        hashes = []
        for option in words[1:]:
            found = _HASH.fullmatch(option)
            if not found:
                raise LockError(f"{source} line {number}: {option!r}: allowed: --hash=sha256:<64 hex digits>")
            hashes.append(found.group(1))
        name, version = match.groups()
        if not hashes:
            raise LockError(f"{source} line {number}: {name}=={version} has no --hash=sha256:...: every "
                            "package of the lock needs the hashes of the wheels it may install")
        if normalize(name) == "torch":
            raise LockError(f"{source} line {number}: torch is the AMI's and is never installed from the lock; "
                            "say which releases the lock fits with '# fits-torch: >=X.Y,<X.Z'")
        if any(p.normalized == normalize(name) for p in packages):
            raise LockError(f"{source} line {number}: {name} is pinned twice")
        packages.append(LockedPackage(name, version, tuple(hashes)))
    if fits is None:
        raise LockError(f"{source} has no '{_FITS_TORCH} >=X.Y,<X.Z' line: say which torch releases it fits")
    if not packages:
        raise LockError(f"{source} pins no package")
    return Lock(tuple(packages), fits, fits_text)


def _logical_lines(text: str):
    """(first line number, line) with backslash continuations joined, as pip reads a requirements file."""
    pending, start = "", 0
    for number, raw in enumerate(text.splitlines(), 1):
        stripped = raw.strip()
        if not pending:
            start = number
        if stripped.endswith("\\"):
            pending += stripped[:-1] + " "
            continue
        yield start, (pending + stripped).strip()
        pending = ""
    if pending:
        yield start, pending.strip()


def _parse_range(text: str, where: str) -> tuple[tuple[str, tuple[int, ...]], ...]:
    bounds = []
    for part in text.split(","):
        match = _VERSION_RANGE.fullmatch(part.strip())
        if not match:
            raise LockError(f"{where}: fits-torch {text!r}: allowed: comma-separated >=X.Y, <X.Y or ==X.Y.Z")
        bounds.append((match.group(1), tuple(int(p) for p in match.group(2).split("."))))
    return tuple(bounds)


def _compare(release: tuple[int, ...], op: str, bound: tuple[int, ...]) -> bool:
    width = max(len(release), len(bound))
    left = release + (0,) * (width - len(release))
    right = bound + (0,) * (width - len(bound))
    if op == ">=":
        return left >= right
    if op == "<":
        return left < right
    return left == right


def select_wheels(lock: Lock, wheelhouse: str, fix: str) -> list[str]:
    """The file name of each locked package's wheel in the directory `wheelhouse`, checked against the lock's
    hashes. LockError names the package and the reason; `fix` says what to do about a missing wheel."""
    try:
        names = sorted(n for n in os.listdir(wheelhouse) if n.endswith(".whl"))
    except OSError:
        raise LockError(f"the wheelhouse {wheelhouse} is missing: {fix}") from None
    chosen = []
    for package in lock.packages:
        candidates = [n for n in names if wheel_matches(n, package)]
        if not candidates:
            raise LockError(f"{package.pin()}: no wheel in {wheelhouse}: {fix}")
        digests = {n: file_sha256(os.path.join(wheelhouse, n)) for n in candidates}
        good = [n for n, digest in digests.items() if digest in package.sha256]
        if not good:
            found = ", ".join(f"{n} has sha256 {d}" for n, d in digests.items())
            raise LockError(f"{package.pin()}: hash mismatch: {found}; the lock allows "
                            f"{', '.join(package.sha256)}")
        chosen.extend(good)
    return chosen


def wheel_matches(filename: str, package: LockedPackage) -> bool:
    """Whether a wheel file is a build of `package` (PEP 427: {name}-{version}(-{build})?-{py}-{abi}-{platform})."""
    parts = filename[:-len(".whl")].split("-") if filename.endswith(".whl") else []
    return len(parts) >= 5 and normalize(parts[0]) == package.normalized and parts[1] == package.version


def file_sha256(path: str) -> str:
    digest = hashlib.sha256()
    with open(path, "rb") as f:
        for block in iter(lambda: f.read(1 << 20), b""):
            digest.update(block)
    return digest.hexdigest()
