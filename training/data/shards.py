"""The token-shard format (docs/data-format.md): writing it atomically, and opening it with validation.

A shard directory holds flat little-endian ``.bin`` files of token ids and one ``index.json`` that lists
them. Documents are concatenated into one token stream, each followed by the end-of-document token; the
stream is split into shards of a fixed size at arbitrary points (a document may span two shards). Readers
memory-map the files with numpy, so opening a multi-terabyte corpus costs nothing and every rank reads only
the pages its samples touch.
"""

from __future__ import annotations

import json
import os
from collections.abc import Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np

FORMAT = "token-shards"
FORMAT_VERSION = 1
INDEX_FILE = "index.json"
SHARD_GLOB = "shard-*.bin"
DTYPES = ("uint16", "uint32")


class ShardFormatError(ValueError):
    """A shard directory that does not match its index; the message names the file and the field."""


def dtype_for_vocab(vocab_size: int) -> np.dtype:
    """The smallest unsigned dtype that holds every id below ``vocab_size``: uint16 up to 65,536 ids."""
    return np.dtype("<u2") if vocab_size <= 1 << 16 else np.dtype("<u4")


def shard_file_name(number: int) -> str:
    return f"shard-{number:05d}.bin"


@dataclass(frozen=True)
class ShardInfo:
    file: str  # name inside the shard directory
    num_tokens: int


class TokenShards:
    """An opened, validated shard directory: one virtual token stream over memory-mapped files."""

    def __init__(self, path: Path, index: dict[str, Any], shards: list[ShardInfo], dtype: np.dtype):
        self.path = path
        self.dtype = dtype
        self.vocab_size: int = index["vocab_size"]
        self.eos_id: int = index["eos_id"]
        self.tokenizer: dict[str, Any] = index.get("tokenizer", {})
        self.num_documents: int | None = index.get("num_documents")
        self.shards = shards
        self.num_tokens = sum(s.num_tokens for s in shards)
        # start offset of every shard in the stream; np.memmap refuses empty files, so those get no map
        self._starts = np.cumsum([0] + [s.num_tokens for s in shards])
        self._maps = [
            np.memmap(path / s.file, dtype=dtype, mode="r", shape=(s.num_tokens,)) if s.num_tokens else None
            for s in shards
        ]

    def read(self, start: int, length: int) -> np.ndarray:
        """Tokens ``[start, start + length)`` of the stream as int64, across shard boundaries."""
        if start < 0 or length < 0 or start + length > self.num_tokens:
            raise IndexError(f"tokens [{start}, {start + length}) outside the stream of {self.num_tokens}")
        out = np.empty(length, dtype=np.int64)
        filled = 0
        shard = int(np.searchsorted(self._starts, start, side="right")) - 1
        while filled < length:
            offset = start + filled - int(self._starts[shard])
            take = min(length - filled, self.shards[shard].num_tokens - offset)
            if take > 0:
                out[filled : filled + take] = self._maps[shard][offset : offset + take]
                filled += take
            shard += 1
        return out


def open_shards(path: str | Path) -> TokenShards:
    """Open the shard directory ``path`` and check it against its index before any training step."""
    path = Path(path)
    index_path = path / INDEX_FILE
    if not index_path.is_file():
        where = "is not a directory" if not path.is_dir() else f"has no {INDEX_FILE}"
        raise ShardFormatError(
            f"{path}: {where} (python -m training.data.prepare writes shard directories; one without "
            f"{INDEX_FILE} is incomplete)"
        )
    try:
        index = json.loads(index_path.read_text())
    except (OSError, UnicodeDecodeError, json.JSONDecodeError) as exc:
        raise ShardFormatError(f"{index_path}: not readable JSON ({exc})") from exc
    if not isinstance(index, dict):
        raise ShardFormatError(f"{index_path}: expected a JSON object, found {type(index).__name__}")
    dtype = _check_index(index_path, index)
    shards = _check_shards(index_path, index, dtype)
    return TokenShards(path, index, shards, dtype)


def _check_index(index_path: Path, index: dict[str, Any]) -> np.dtype:
    def field(name: str, value: object, allowed: str) -> ShardFormatError:
        return ShardFormatError(f"{index_path}: {name}={value!r}: allowed: {allowed}")

    if index.get("format") != FORMAT:
        raise field("format", index.get("format"), repr(FORMAT))
    if index.get("version") != FORMAT_VERSION:
        raise field("version", index.get("version"), str(FORMAT_VERSION))
    if index.get("dtype") not in DTYPES:
        raise field("dtype", index.get("dtype"), ", ".join(DTYPES))
    vocab_size = index.get("vocab_size")
    if not _is_int(vocab_size) or vocab_size < 1:
        raise field("vocab_size", vocab_size, "an integer >= 1")
    dtype = np.dtype("<u2" if index["dtype"] == "uint16" else "<u4")
    if vocab_size - 1 > np.iinfo(dtype).max:
        raise field(
            "dtype", index["dtype"], f"uint32 (vocab_size={vocab_size} has ids past {np.iinfo(dtype).max})"
        )
    eos_id = index.get("eos_id")
    if not _is_int(eos_id) or not 0 <= eos_id < vocab_size:
        raise field("eos_id", eos_id, f"an integer in [0, vocab_size={vocab_size})")
    if not isinstance(index.get("shards"), list) or not index["shards"]:
        raise field("shards", index.get("shards"), "a non-empty list of {file, num_tokens}")
    return dtype


def _check_shards(index_path: Path, index: dict[str, Any], dtype: np.dtype) -> list[ShardInfo]:
    shards = []
    for i, entry in enumerate(index["shards"]):
        where = f"{index_path}: shards[{i}]"
        if not isinstance(entry, dict):
            raise ShardFormatError(f"{where}={entry!r}: allowed: an object {{file, num_tokens}}")
        name, num_tokens = entry.get("file"), entry.get("num_tokens")
        # a plain file name: an index must not point readers outside its own directory
        if not isinstance(name, str) or not name or Path(name).name != name or name in (".", ".."):
            raise ShardFormatError(f"{where}.file={name!r}: allowed: a file name inside {index_path.parent}")
        if not _is_int(num_tokens) or num_tokens < 0:
            raise ShardFormatError(f"{where}.num_tokens={num_tokens!r}: allowed: an integer >= 0")
        shard_path = index_path.parent / name
        if not shard_path.is_file():
            raise ShardFormatError(f"{shard_path}: missing (listed in {where}.file)")
        size_bytes = shard_path.stat().st_size
        if size_bytes != num_tokens * dtype.itemsize:
            raise ShardFormatError(
                f"{shard_path}: {size_bytes} bytes, but {where}.num_tokens={num_tokens} at {dtype.name} "
                f"({dtype.itemsize} bytes per token) needs {num_tokens * dtype.itemsize}"
            )
        shards.append(ShardInfo(name, num_tokens))
    total = index.get("num_tokens")
    if total is not None and total != sum(s.num_tokens for s in shards):
        raise ShardFormatError(
            f"{index_path}: num_tokens={total!r}, but the shards hold {sum(s.num_tokens for s in shards)}"
        )
    return shards


def _is_int(value: object) -> bool:
    return isinstance(value, int) and not isinstance(value, bool)


class ShardWriter:
    """Writes documents into a shard directory; nothing there changes until ``finish()``.

    Shards are written to hidden temporary files (``.shard-00000.bin.tmp``) and flushed to disk. ``finish()``
    then removes an old index.json (the directory stops counting as complete), renames the new shards into
    place, deletes old shards the new index does not list, and writes index.json last through its own
    temporary file. A crash or an error before ``finish()`` leaves a previous shard directory intact (at the
    cost of disk space for both while writing); a crash inside it leaves a directory without index.json,
    which readers refuse.
    """

    def __init__(
        self,
        out_dir: str | Path,
        *,
        vocab_size: int,
        eos_id: int,
        tokenizer: dict[str, Any],
        shard_size_tokens: int,
    ):
        if shard_size_tokens < 1:
            raise ValueError(f"shard_size_tokens={shard_size_tokens!r}: allowed: an integer >= 1")
        self.out_dir = Path(out_dir)
        self.vocab_size = vocab_size
        self.eos_id = eos_id
        self.tokenizer = tokenizer
        self.shard_size_tokens = shard_size_tokens
        self.dtype = dtype_for_vocab(vocab_size)
        self.shards: list[ShardInfo] = []  # sealed shards, still under their temporary names
        self.num_documents = 0
        self._file = None  # the open temporary file of the shard being filled
        self._filled = 0  # tokens in it

    def add_document(self, tokens: Sequence[int] | np.ndarray) -> None:
        """Append one document and its end-of-document token."""
        ids = np.asarray(tokens, dtype=np.int64)
        if ids.size and (ids.min() < 0 or ids.max() >= self.vocab_size):
            bad = int(ids.max() if ids.max() >= self.vocab_size else ids.min())
            raise ValueError(f"token id {bad} outside the vocabulary [0, {self.vocab_size})")
        self._write(np.append(ids, self.eos_id).astype(self.dtype))
        self.num_documents += 1

    def _write(self, ids: np.ndarray) -> None:
        while ids.size:
            if self._file is None:
                self._file = open(self._temp_path(len(self.shards)), "wb")  # noqa: SIM115 (closed in _seal)
                self._filled = 0
            take = min(ids.size, self.shard_size_tokens - self._filled)
            ids[:take].tofile(self._file)
            self._filled += take
            ids = ids[take:]
            if self._filled == self.shard_size_tokens:
                self._seal()

    def _seal(self) -> None:
        self._file.flush()
        os.fsync(self._file.fileno())
        self._file.close()
        self._file = None
        self.shards.append(ShardInfo(shard_file_name(len(self.shards)), self._filled))

    def _temp_path(self, number: int) -> Path:
        return self.out_dir / f".{shard_file_name(number)}.tmp"

    def finish(self) -> dict[str, Any]:
        """Put the new shards in place and write index.json; returns the index."""
        if self._file is not None:
            self._seal()
        if not self.shards:
            raise ValueError("no documents were written: the input holds no text")
        index = {
            "format": FORMAT,
            "version": FORMAT_VERSION,
            "dtype": self.dtype.name,
            "vocab_size": self.vocab_size,
            "eos_id": self.eos_id,
            "tokenizer": self.tokenizer,
            "num_documents": self.num_documents,
            "num_tokens": sum(s.num_tokens for s in self.shards),
            "shards": [{"file": s.file, "num_tokens": s.num_tokens} for s in self.shards],
        }
        # 1) the old index goes first: from here until step 4 the directory is incomplete, never mixed
        (self.out_dir / INDEX_FILE).unlink(missing_ok=True)
        # 2) the new shards take their names, replacing old shards of the same number
        for number, shard in enumerate(self.shards):
            os.replace(self._temp_path(number), self.out_dir / shard.file)
        # 3) old shards past the new count would be unlisted clutter
        listed = {s.file for s in self.shards}
        for path in self.out_dir.glob(SHARD_GLOB):
            if path.name not in listed:
                path.unlink()
        # 4) the index, last
        temp = self.out_dir / f".{INDEX_FILE}.tmp"
        with open(temp, "w") as f:
            json.dump(index, f, indent=1)
            f.write("\n")
            f.flush()
            os.fsync(f.fileno())
        os.replace(temp, self.out_dir / INDEX_FILE)
        _fsync_dir(self.out_dir)  # make the renames themselves durable
        return index

    def abort(self) -> None:
        """Delete this writer's temporary files; the directory is left as it was before the writer."""
        if self._file is not None:
            self._file.close()
            self._file = None
        for number in range(len(self.shards) + 1):
            self._temp_path(number).unlink(missing_ok=True)
        self.shards.clear()


def _fsync_dir(path: Path) -> None:
    fd = os.open(path, os.O_RDONLY)
    try:
        os.fsync(fd)
    finally:
        os.close(fd)
