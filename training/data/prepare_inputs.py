"""The input files of ``python -m training.data.prepare``: which files it reads, and the documents in each.

Formats, by how the file's name ends (docs/data-format.md, "Input formats"):

- ``.txt``: the whole file is one document, or each block of lines between blank lines (``--txt-split``);
- ``.jsonl``: one JSON object per line, its ``--text-field`` is the document;
- ``.jsonl.gz``, ``.json.gz``: the same, gzip-compressed (C4 and Dolma name their JSON-lines files .json.gz);
- ``.jsonl.zst``, ``.json.zst``: the same, Zstandard-compressed (the Pile, SlimPajama, RedPajama);
- ``.parquet``: one document per row, from the string column ``--text-field`` (FineWeb, Hugging Face datasets).

Everything but .txt streams: compressed files are decompressed as they are read, line by line, and Parquet
files are read in batches of rows of the one column, so memory stays bounded whatever a file's size.
pyarrow and zstandard are imported only for files that need them: prepare runs where the operator prepares
the data (a workstation, then ``aws s3 sync`` to the data bucket), not on the nodes, whose lock does not carry
them; a missing one is named in one line with the pinned version to install.
"""

from __future__ import annotations

import gzip
import importlib
import io
import json
import zlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass
from pathlib import Path
from types import ModuleType

SUFFIXES = (".txt", ".jsonl", ".jsonl.gz", ".json.gz", ".jsonl.zst", ".json.zst", ".parquet")
# the versions requirements-dev.txt pins and the tests use (tests/training/test_prepare_inputs.py checks both agree)
PYARROW_PIN = "pyarrow==26.0.1"
ZSTANDARD_PIN = "zstandard==0.25.0"
PARQUET_BATCH_ROWS = 1024  # rows of the text column decoded at once
ZSTD_MAX_WINDOW_BYTES = 1 << 31  # files made with `zstd --long=31` need up to a 2 GiB window (default: 128 MiB)
READ_BUFFER_BYTES = 1 << 20


class PrepareError(ValueError):
    """Bad input for prepare; the message names the file (and line or row) and what is wrong."""


@dataclass
class Document:
    text: str
    where: str  # "file", "file:line" or "file row N", for error messages


def input_format(path: Path) -> str | None:
    """The suffix of SUFFIXES that ``path``'s name ends with, or None."""
    return next((s for s in SUFFIXES if path.name.endswith(s)), None)


def find_input_files(input_path: Path) -> list[Path]:
    """``input_path`` itself, or every file in one of the formats under the directory, in sorted order."""
    if input_path.is_file():
        if input_format(input_path) is None:
            raise PrepareError(f"--input {input_path}: allowed suffixes: {', '.join(SUFFIXES)}")
        return [input_path]
    if not input_path.is_dir():
        raise PrepareError(f"--input {input_path}: no such file or directory")
    files = sorted(p for p in input_path.rglob("*") if p.is_file() and input_format(p) is not None)
    if not files:
        raise PrepareError(f"--input {input_path}: no {', '.join(SUFFIXES)} files in the directory")
    return files


def check_readers(files: list[Path]) -> None:
    """Fail before anything is read when a file needs a package that is not installed."""
    for suffix, module, pin in ((".parquet", "pyarrow.parquet", PYARROW_PIN), (".zst", "zstandard", ZSTANDARD_PIN)):
        first = next((p for p in files if input_format(p).endswith(suffix)), None)
        if first is not None:
            _require(module, pin, first)


def _require(module: str, pin: str, path: Path) -> ModuleType:
    try:
        return importlib.import_module(module)
    except ImportError as exc:
        package = pin.split("==")[0]
        raise PrepareError(f"{path}: reading it needs the {package} package: pip install {pin}") from exc


def read_documents(path: Path, *, text_field: str, txt_split: str) -> Iterator[Document]:
    """The documents of one input file, in file order (blank JSON lines are skipped)."""
    suffix = input_format(path)
    if suffix == ".parquet":
        yield from _read_parquet(path, text_field)
    elif suffix == ".txt":
        yield from _read_txt(path, txt_split)
    elif suffix is not None and suffix.endswith(".zst"):
        zstandard = _require("zstandard", ZSTANDARD_PIN, path)
        with open(path, "rb") as f:
            lines = _split_lines(_zstd_chunks(f, zstandard))
            errors = (OSError, EOFError, zstandard.ZstdError)
            yield from _jsonl_documents(_numbered_lines(lines, path, errors), path, text_field)
    else:
        # gzip: several concatenated members (pigz, bgzip) read as one stream; a truncated one raises EOFError
        with open(path, "rb") if suffix == ".jsonl" else gzip.open(path, "rb") as f:
            errors = (OSError, EOFError, zlib.error)
            yield from _jsonl_documents(_numbered_lines(f, path, errors), path, text_field)


def _zstd_chunks(f: io.BufferedReader, zstandard: ModuleType) -> Iterator[bytes]:
    """The decompressed bytes of every frame in ``f`` (pzstd and appended files hold several), in pieces.
    One decompressor per frame: zstandard's readers end quietly at a cut inside a frame, and a cut file must fail."""
    dctx = zstandard.ZstdDecompressor(max_window_size=ZSTD_MAX_WINDOW_BYTES)
    frame, in_frame = dctx.decompressobj(), False
    while chunk := f.read(READ_BUFFER_BYTES):
        while chunk:
            in_frame = True
            if out := frame.decompress(chunk):
                yield out
            chunk = b""
            if frame.eof:  # the frame ended inside this chunk: what follows starts the next one
                chunk, frame, in_frame = frame.unused_data, dctx.decompressobj(), False
    if in_frame:
        raise EOFError("the file ends inside a zstd frame")


def _split_lines(chunks: Iterable[bytes]) -> Iterator[bytes]:
    rest: list[bytes] = []  # the start of a line that continues in the next chunk
    for chunk in chunks:
        *lines, tail = chunk.split(b"\n")
        for line in lines:
            yield b"".join(rest) + line + b"\n"
            rest = []
        rest.append(tail)
    if last := b"".join(rest):
        yield last


def _numbered_lines(stream: Iterable[bytes], path: Path,
                    errors: tuple[type[BaseException], ...]) -> Iterator[tuple[int, bytes]]:
    """(line number, line) pairs; a stream that cannot be decompressed fails naming the last good line."""
    lines = iter(stream)
    number = 0
    while True:
        try:
            raw = next(lines)
        except StopIteration:
            return
        except errors as exc:
            raise PrepareError(f"{path}: cannot decompress past line {number} ({exc})") from exc
        number += 1
        yield number, raw


def _jsonl_documents(lines: Iterable[tuple[int, bytes]], path: Path, text_field: str) -> Iterator[Document]:
    for number, raw in lines:
        where = f"{path}:{number}"
        try:
            line = raw.decode("utf-8")
        except UnicodeDecodeError as exc:
            raise PrepareError(f"{where}: not UTF-8 ({exc.reason} at byte {exc.start})") from exc
        if not line.strip():
            continue
        try:
            record = json.loads(line)
        except json.JSONDecodeError as exc:
            raise PrepareError(f"{where}: not valid JSON ({exc.msg} at column {exc.colno})") from exc
        if not isinstance(record, dict):
            raise PrepareError(f"{where}: expected a JSON object, found {type(record).__name__}")
        if text_field not in record:
            fields = ", ".join(sorted(record)) or "none"
            raise PrepareError(f"{where}: no field {text_field!r} (fields: {fields}); choose one with --text-field")
        text = record[text_field]
        if not isinstance(text, str):
            raise PrepareError(f"{where}: field {text_field!r} is {type(text).__name__}, allowed: a string")
        yield Document(text, where)


def _read_parquet(path: Path, text_field: str) -> Iterator[Document]:
    pq = _require("pyarrow.parquet", PYARROW_PIN, path)
    pa = importlib.import_module("pyarrow")
    try:
        parquet = pq.ParquetFile(path)
    except (OSError, pa.ArrowException) as exc:
        raise PrepareError(f"{path}: not a readable Parquet file ({exc})") from exc
    schema = parquet.schema_arrow
    if text_field not in schema.names:
        raise PrepareError(
            f"{path}: no column {text_field!r} (columns: {', '.join(schema.names) or 'none'}); "
            "choose one with --text-field")
    column_type = schema.field(text_field).type
    if not (pa.types.is_string(column_type) or pa.types.is_large_string(column_type)
            or pa.types.is_string_view(column_type)):
        raise PrepareError(f"{path}: column {text_field!r} is {column_type}, allowed: a string column")
    batches = parquet.iter_batches(batch_size=PARQUET_BATCH_ROWS, columns=[text_field])  # row group by row group
    row = 0
    while True:
        try:
            batch = next(batches)
        except StopIteration:
            return
        except (OSError, pa.ArrowException) as exc:
            raise PrepareError(f"{path}: cannot read past row {row} ({exc})") from exc
        for text in batch.column(0).to_pylist():
            row += 1
            if text is None:
                raise PrepareError(f"{path} row {row}: column {text_field!r} is null, allowed: a string")
            yield Document(text, f"{path} row {row}")


def _read_txt(path: Path, txt_split: str) -> Iterator[Document]:
    data = path.read_bytes()
    try:
        text = data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PrepareError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from exc
    if txt_split == "file":
        yield Document(text, str(path))
        return
    block: list[str] = []
    first_line = 1
    for number, line in enumerate(text.splitlines(keepends=True), start=1):
        if line.strip():
            if not block:
                first_line = number
            block.append(line)
        elif block:
            yield Document("".join(block).rstrip("\n"), f"{path}:{first_line}")
            block = []
    if block:
        yield Document("".join(block).rstrip("\n"), f"{path}:{first_line}")
