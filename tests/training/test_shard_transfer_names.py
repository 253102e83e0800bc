"""Local-tier shard transfers (training/checkpoint/shard_transfer.py): the file names in a peer's shard header
are checked against the transfer directory before anything is written, as a peer that sends paths would have
them. A refused shard is not kept, its chunks are still taken (the sender never waits), and the log says why in
one line."""

from __future__ import annotations

import hashlib
import json
import logging

import pytest
import torch

from training.checkpoint.local_layout import inventory, partial_dir
from training.checkpoint.shard_transfer import _chunk_sizes, _Incoming, _unsafe_name

PAYLOAD = b"pickled code would go here"


def header(names, payload=PAYLOAD):
    digest = hashlib.sha256(payload).hexdigest()
    marker = {"step": 4, "rank": 1, "world_size": 2, "files": {name: digest for name in names}}
    return json.dumps({"marker": marker, "sizes": [len(payload)] * len(names)}).encode()


def receive(root, names, payload=PAYLOAD):
    """Receive a shard whose header names `names`, each file `payload`, as receive_shard does."""
    incoming = _Incoming(root, header(names, payload))
    for index, size in _chunk_sizes(incoming.sizes):
        assert size == len(payload)  # one chunk per file
        incoming.write(index, torch.frombuffer(bytearray(payload), dtype=torch.uint8))
    return incoming.finish()


@pytest.mark.parametrize("name", [
    "../../../outside.txt",  # climbs out of the transfer directory
    "/tmp/absolute.txt",
    "sub/dir.distcp",
    "..",
    ".",
    "",
    "back\\slash",
    "nul\0byte",
    "shard.json",  # the marker the receiver writes itself
])
def test_a_name_that_is_not_a_plain_file_of_the_shard_is_refused_and_nothing_is_written(tmp_path, caplog, name):
    root = tmp_path / "local" / "job"
    victim = tmp_path / "local" / "outside.txt"
    victim.parent.mkdir(parents=True)
    victim.write_text("untouched")
    with caplog.at_level(logging.WARNING, logger="training.checkpoint"):
        assert receive(root, [".metadata", name]) is None
    assert victim.read_text() == "untouched"
    assert sorted(p.name for p in tmp_path.rglob("*")) == ["local", "outside.txt"]  # not even the directory
    (line,) = [r.getMessage() for r in caplog.records]
    assert line == (f"local checkpoint: the shard of rank 1 step 4 received here is not kept: the peer's shard "
                    f"names the file {name!r}: allowed are plain file names inside {partial_dir(root, 4, 1)} "
                    "(no '/', '\\', NUL, '.', '..' or 'shard.json')")


def test_a_name_that_resolves_outside_through_a_link_is_refused(tmp_path, caplog):
    root = tmp_path / "job"
    partial = partial_dir(root, 4, 1)
    partial.mkdir(parents=True)
    target = tmp_path / "elsewhere.distcp"
    target.write_bytes(b"original")
    (partial / "__0_0.distcp").symlink_to(target)  # left behind in the transfer directory
    assert _unsafe_name(partial, "__0_0.distcp") is not None
    with caplog.at_level(logging.WARNING, logger="training.checkpoint"):
        assert receive(root, ["__0_0.distcp"]) is None
    assert target.read_bytes() == b"original"
    assert "the peer's shard names the file '__0_0.distcp': allowed are plain file names inside" in caplog.text


def test_plain_names_are_received_and_published(tmp_path):
    names = [".metadata", "__0_0.distcp", "__1_0.distcp"]
    for name in names:
        assert _unsafe_name(partial_dir(tmp_path, 4, 1), name) is None
    kept = receive(tmp_path, names)
    assert kept is not None and sorted(p.name for p in kept.iterdir()) == sorted([*names, "shard.json"])
    assert (kept / "__1_0.distcp").read_bytes() == PAYLOAD
    assert list(inventory(tmp_path)) == [4]
