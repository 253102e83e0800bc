"""Moving a local-tier shard (``local_layout``) from one rank to another over a gloo process group.

A shard travels as what its node wrote: a header (the shard's marker and its files' sizes, JSON) and then
each file's bytes in chunks of ``CHUNK_BYTES``, so neither side holds more than a chunk of it in memory at
once. The receiver writes into ``rank-<R>.partial``, checks every file against the digests of the marker it
was sent, and only then writes the marker and renames the directory: a shard that arrived damaged is never
published, and the receiver says so.

Two patterns use it, both deadlock-free with gloo's point-to-point operations:

- ``exchange``: every rank sends its own shard to one peer and receives one from another at the same time
  (the ring of replicas after a local save). Sends and receives are posted together, chunk by chunk, and a
  rank with nothing to send says so in its header (size 0), so a failed save never leaves its peer waiting.
- ``send_shard`` / ``receive_shard``: one transfer at a time, in an order every rank computed alike (the
  fetches of a resume): each transfer waits only on the two ranks that take part in it.
"""

from __future__ import annotations

import json
import logging
import shutil
from dataclasses import dataclass
from pathlib import Path

import torch
import torch.distributed as dist

from training.checkpoint.local_layout import (
    SHARD_MARKER,
    ShardInfo,
    partial_dir,
    publish,
    shard_dir,
    verify_shard,
    write_shard_marker,
)

log = logging.getLogger("training.checkpoint")

CHUNK_BYTES = 64 << 20


@dataclass(frozen=True)
class _Outgoing:
    header: bytes
    files: list[tuple[Path, int]]  # (path, size) in the header's order


def _outgoing(path: Path | None) -> _Outgoing:
    """What to send for the shard at ``path``; an empty header when there is nothing to send."""
    if path is None:
        return _Outgoing(b"", [])
    try:
        info = json.loads((path / SHARD_MARKER).read_text())
        files = [(path / name, (path / name).stat().st_size) for name in sorted(info["files"])]
    except (OSError, ValueError, KeyError) as exc:  # its peer then gets nothing, and knows it at once
        log.warning("local checkpoint: cannot send the shard at %s: %s", path, exc)
        return _Outgoing(b"", [])
    header = json.dumps({"marker": info, "sizes": [size for _, size in files]}).encode()
    return _Outgoing(header, files)


def _chunks(files: list[tuple[Path, int]]):
    """(file index, bytes) for every chunk the header announced, in order (an empty file has none). The peer
    counts on exactly these chunks: a file that cannot be read whole is sent as zeros where it failed, which
    its digest then refuses, rather than leaving the peer waiting for chunks that never come."""
    for index, (path, size) in enumerate(files):
        try:
            f = open(path, "rb")
        except OSError as exc:
            log.warning("local checkpoint: cannot read %s to send it: %s", path, exc)
            f = None
        try:
            for _, length in _chunk_sizes([size]):
                chunk = b""
                if f is not None:
                    try:
                        chunk = f.read(length)
                    except OSError as exc:
                        log.warning("local checkpoint: cannot read %s to send it: %s", path, exc)
                        f.close()
                        f = None
                yield index, chunk.ljust(length, b"\0")[:length]
        finally:
            if f is not None:
                f.close()


def _chunk_sizes(sizes: list[int]) -> list[tuple[int, int]]:
    return [(index, min(CHUNK_BYTES, size - offset)) for index, size in enumerate(sizes)
            for offset in range(0, size, CHUNK_BYTES)]


class _Incoming:
    """A shard being received into ``rank-<R>.partial`` under ``root``. A failure to write here (a full disk)
    is recorded, not raised: the chunks still have to be received, or the sender would wait for ever; the
    shard is then not published and ``finish`` says so."""

    def __init__(self, root: Path, header: bytes) -> None:
        data = json.loads(header)
        self.info = ShardInfo.from_json(json.dumps(data["marker"]))
        self.sizes = [int(s) for s in data["sizes"]]
        if len(self.sizes) != len(self.info.files):
            raise ValueError(f"shard header of rank {self.info.rank}: {len(self.sizes)} sizes for "
                             f"{len(self.info.files)} files")
        self.root = root
        self.partial = partial_dir(root, self.info.step, self.info.rank)  # from two integers: inside root
        self.names = sorted(self.info.files)
        # The names come from the peer: a name that is not a plain file of this shard is refused before anything
        # is written, and its chunks are still taken (and dropped) so the sender is not left waiting.
        self.problem: str | None = next(filter(None, (_unsafe_name(self.partial, n) for n in self.names)), None)
        if self.problem is not None:
            return
        try:
            shutil.rmtree(self.partial, ignore_errors=True)
            self.partial.mkdir(parents=True)
            for name in self.names:  # every file exists, also an empty one
                (self.partial / name).touch()
        except OSError as exc:
            self.problem = f"cannot write {self.partial}: {exc}"

    def write(self, index: int, data: torch.Tensor) -> None:
        if self.problem is not None:
            return
        try:
            with open(self.partial / self.names[index], "ab") as f:
                f.write(data.numpy().tobytes())
        except OSError as exc:
            self.problem = f"cannot write {self.partial / self.names[index]}: {exc}"

    def finish(self) -> Path | None:
        """Verify and publish; the published directory, or None (with a warning) when it could not be written
        or a file differs from its digest."""
        problem = self.problem or verify_shard(self.partial, self.info)
        if problem is None:
            try:
                write_shard_marker(self.partial, self.info)
                final = shard_dir(self.root, self.info.step, self.info.rank)
                publish(self.partial, final)
                return final
            except OSError as exc:
                problem = f"cannot publish {self.partial}: {exc}"
        log.warning("local checkpoint: the shard of rank %d step %d received here is not kept: %s",
                    self.info.rank, self.info.step, problem)
        shutil.rmtree(self.partial, ignore_errors=True)
        return None


def _unsafe_name(partial: Path, name: str) -> str | None:
    """Why ``name``, a file name a peer sent, is not a plain file directly inside ``partial``; None when it is."""
    resolved = (partial / name).resolve() if name and "\0" not in name else None
    if (name in ("", ".", "..", SHARD_MARKER) or any(c in name for c in ("/", "\\", "\0"))
            or resolved is None or resolved.parent != partial.resolve()):
        return (f"the peer's shard names the file {name!r}: allowed are plain file names inside {partial} "
                f"(no '/', '\\', NUL, '.', '..' or {SHARD_MARKER!r})")
    return None


def _exchange_tensor(group, send: torch.Tensor | None, dst: int | None, recv: torch.Tensor | None,
                     src: int | None) -> None:
    works = []
    if send is not None and dst is not None:
        works.append(dist.isend(send, dst=dst, group=group))
    if recv is not None and src is not None:
        works.append(dist.irecv(recv, src=src, group=group))
    for work in works:
        work.wait()


def _exchange_header(group, header: bytes, dst: int | None, src: int | None) -> bytes:
    length_out = torch.tensor([len(header)], dtype=torch.int64)
    length_in = torch.zeros(1, dtype=torch.int64)
    _exchange_tensor(group, length_out, dst, length_in if src is not None else None, src)
    size_in = int(length_in.item()) if src is not None else 0
    body_out = torch.frombuffer(bytearray(header), dtype=torch.uint8) if header else None
    body_in = torch.empty(size_in, dtype=torch.uint8) if size_in else None
    _exchange_tensor(group, body_out, dst, body_in, src)
    return body_in.numpy().tobytes() if body_in is not None else b""


def exchange(group, *, own: Path | None, dst: int, src: int, root: Path) -> Path | None:
    """Send the shard at ``own`` (None: this rank has none to send) to rank ``dst`` while receiving rank
    ``src``'s shard into ``root``. Returns the received shard's directory, or None when ``src`` sent none or
    it could not be kept."""
    outgoing = _outgoing(own)
    header_in = _exchange_header(group, outgoing.header, dst, src)
    incoming = _Incoming(root, header_in) if header_in else None
    sends = _chunks(outgoing.files)
    receives = iter(_chunk_sizes(incoming.sizes) if incoming else [])
    while True:
        sending = next(sends, None)
        receiving = next(receives, None)
        if sending is None and receiving is None:
            break
        out = torch.frombuffer(bytearray(sending[1]), dtype=torch.uint8) if sending else None
        into = torch.empty(receiving[1], dtype=torch.uint8) if receiving else None
        _exchange_tensor(group, out, dst if sending else None, into, src if receiving else None)
        if incoming is not None and receiving is not None and into is not None:
            incoming.write(receiving[0], into)
    return incoming.finish() if incoming is not None else None


def send_shard(group, path: Path, dst: int) -> None:
    """Send the shard at ``path`` to rank ``dst``, which calls ``receive_shard`` for it."""
    outgoing = _outgoing(path)
    _exchange_header(group, outgoing.header, dst, None)
    for _, chunk in _chunks(outgoing.files):
        _exchange_tensor(group, torch.frombuffer(bytearray(chunk), dtype=torch.uint8), dst, None, None)


def receive_shard(group, src: int, root: Path) -> Path | None:
    """Receive the shard rank ``src`` sends with ``send_shard`` into ``root``; its directory, or None when it
    could not be kept."""
    header = _exchange_header(group, b"", None, src)
    if not header:  # the sender could not read its copy, and sends nothing else
        log.warning("local checkpoint: rank %d had no shard to send", src)
        return None
    incoming = _Incoming(root, header)
    for index, size in _chunk_sizes(incoming.sizes):
        into = torch.empty(size, dtype=torch.uint8)
        _exchange_tensor(group, None, None, into, src)
        incoming.write(index, into)
    return incoming.finish()
