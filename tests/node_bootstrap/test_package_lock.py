"""The training lock: what it pins, which torch it fits, which FP8 backends it provides, and every way a lock
is refused (one line naming the line and what is allowed)."""

from __future__ import annotations

from pathlib import Path

import pytest

from node_bootstrap.package_lock import LockError, parse_lock, select_wheels

REPO = Path(__file__).resolve().parents[2]
HASH_A = "a" * 64
HASH_B = "b" * 64


def lock(body: str, fits: str = "# fits-torch: >=2.11,<2.14\n") -> str:
    return fits + body


def test_the_committed_lock_pins_torchao_for_torch_2_11_to_2_13():
    parsed = parse_lock((REPO / "training" / "node-requirements.txt").read_text())
    assert [p.pin() for p in parsed.packages] == ["torchao==0.18.0", "safetensors==0.8.0"]
    assert parsed.fp8_backends() == ["none", "torchao"]
    assert [parsed.torch_fits(v) for v in ("2.10.1", "2.11.0", "2.13.0+cu130", "2.13.1", "2.14.0", "2.14.0a0")] == [
        False, True, True, True, False, False]


def test_continuations_several_hashes_and_transformer_engine():
    parsed = parse_lock(lock(f"Transformer_Engine_Torch==2.17.0 \\\n    --hash=sha256:{HASH_A} \\\n"
                             f"    --hash=sha256:{HASH_B}\ntorchao==0.18.0 --hash=sha256:{HASH_A}\n",
                             fits="# fits-torch: ==2.13.0\n"))
    assert parsed.package("transformer-engine-torch").sha256 == (HASH_A, HASH_B)
    assert parsed.fp8_backends() == ["none", "torchao", "te"]
    assert parsed.torch_fits("2.13.0+cu130") and not parsed.torch_fits("2.13.1")


@pytest.mark.parametrize(("text", "message"), [
    (lock("torchao>=0.18\n"), "the lock line 2: 'torchao>=0.18': allowed: name==version with --hash options"),
    (lock("torchao==0.18.0\n"), "the lock line 2: torchao==0.18.0 has no --hash=sha256:..."),
    (lock("torchao==0.18.0 --hash=md5:abc\n"), "the lock line 2: '--hash=md5:abc': allowed: --hash=sha256:<64 hex"),
    (lock(f"torch==2.13.0 --hash=sha256:{HASH_A}\n"), "the lock line 2: torch is the AMI's and is never installed"),
    (lock(f"torchao==0.18.0 --hash=sha256:{HASH_A}\nTorchAO==0.17.0 --hash=sha256:{HASH_B}\n"),
     "the lock line 3: TorchAO is pinned twice"),
    (f"torchao==0.18.0 --hash=sha256:{HASH_A}\n", "the lock has no '# fits-torch: >=X.Y,<X.Z' line"),
    (lock("", fits="# fits-torch: ~=2.13\n"), "the lock line 1: fits-torch '~=2.13': allowed: comma-separated"),
    (lock(""), "the lock pins no package"),
])
def test_a_lock_that_cannot_be_read_is_refused_naming_the_line(text, message):
    with pytest.raises(LockError) as err:
        parse_lock(text)
    assert str(err.value).startswith(message)


def test_wheels_are_chosen_by_name_version_and_hash(tmp_path):
    (tmp_path / "torchao-0.18.0-cp310-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"wheel")
    (tmp_path / "torchao-0.17.0-cp310-abi3-manylinux_2_28_x86_64.whl").write_bytes(b"older")
    import hashlib

    digest = hashlib.sha256(b"wheel").hexdigest()
    parsed = parse_lock(lock(f"torchao==0.18.0 --hash=sha256:{digest}\n"))
    assert select_wheels(parsed, str(tmp_path), "fix") == ["torchao-0.18.0-cp310-abi3-manylinux_2_28_x86_64.whl"]
    other = parse_lock(lock(f"torchao==0.18.0 --hash=sha256:{HASH_A}\n"))
    with pytest.raises(LockError, match=rf"^torchao==0\.18\.0: hash mismatch: torchao-0\.18\.0-cp310-abi3-"
                                        rf"manylinux_2_28_x86_64\.whl has sha256 {digest}; the lock allows {HASH_A}$"):
        select_wheels(other, str(tmp_path), "fix")
    with pytest.raises(LockError, match=r"^the wheelhouse /nonexistent is missing: run make setup$"):
        select_wheels(parsed, "/nonexistent", "run make setup")
