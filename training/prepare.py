"""python -m training.prepare: tokenize text or jsonl into a shard directory (docs/data-format.md).

    python -m training.prepare --input corpus/ --output /fsx/data/corpus-byte
    python -m training.prepare --input docs.jsonl --text-field body --tokenizer tokenizer.json \\
        --output /fsx/data/docs-llama3

Shards are written to temporary names and renamed into place at the end, index.json last: a run that fails
leaves the output directory as it was, and one killed half-way leaves it without index.json, which training
refuses to open.
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from training.shards import ShardWriter
from training.tokenizer import Tokenizer, TokenizerError, load_tokenizer

SUFFIXES = (".txt", ".jsonl")
TXT_SPLITS = ("file", "blank-line")
DEFAULT_SHARD_SIZE_TOKENS = 1 << 27  # 256 MiB per shard at uint16: few files, each large enough to stream
ENCODE_BATCH_DOCUMENTS = 512  # documents handed to the tokenizer at once (tokenizers parallelizes a batch)


class PrepareError(ValueError):
    """Bad input for prepare; the message names the file (and line) and what is wrong."""


@dataclass
class Document:
    text: str
    where: str  # "file" or "file:line", for error messages


def find_input_files(input_path: Path) -> list[Path]:
    """``input_path`` itself, or every .txt and .jsonl file under the directory, in sorted order."""
    if input_path.is_file():
        if input_path.suffix not in SUFFIXES:
            raise PrepareError(f"--input {input_path}: allowed suffixes: {', '.join(SUFFIXES)}")
        return [input_path]
    if not input_path.is_dir():
        raise PrepareError(f"--input {input_path}: no such file or directory")
    files = sorted(p for p in input_path.rglob("*") if p.is_file() and p.suffix in SUFFIXES)
    if not files:
        raise PrepareError(f"--input {input_path}: no {' or '.join(SUFFIXES)} files in the directory")
    return files


def read_documents(path: Path, *, text_field: str, txt_split: str) -> Iterator[Document]:
    """The documents of one input file.

    .txt: the whole file is one document (``txt_split="file"``), or each block of lines between blank
    lines is one (``"blank-line"``). .jsonl: one JSON object per line, its ``text_field`` is the document;
    blank lines are skipped.
    """
    if path.suffix == ".jsonl":
        yield from _read_jsonl(path, text_field)
        return
    text = _read_utf8(path)
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


def _read_jsonl(path: Path, text_field: str) -> Iterator[Document]:
    with open(path, "rb") as f:
        for number, raw in enumerate(f, start=1):
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
                raise PrepareError(
                    f"{where}: no field {text_field!r} (fields: {fields}); choose one with --text-field"
                )
            text = record[text_field]
            if not isinstance(text, str):
                raise PrepareError(
                    f"{where}: field {text_field!r} is {type(text).__name__}, allowed: a string"
                )
            yield Document(text, where)


def _read_utf8(path: Path) -> str:
    data = path.read_bytes()
    try:
        return data.decode("utf-8")
    except UnicodeDecodeError as exc:
        raise PrepareError(f"{path}: not UTF-8 ({exc.reason} at byte {exc.start})") from exc


def check_output_dir(output_dir: Path, *, overwrite: bool) -> None:
    """Create ``output_dir``; a non-empty one is refused unless ``overwrite`` is set.

    With ``overwrite`` the old index.json and shards stay until the new ones are complete (ShardWriter
    .finish), so a run that fails on bad input loses nothing. Other files in the directory are kept.
    """
    if output_dir.exists() and not output_dir.is_dir():
        raise PrepareError(f"--output {output_dir}: exists and is not a directory")
    output_dir.mkdir(parents=True, exist_ok=True)
    entries = sorted(p.name for p in output_dir.iterdir())
    if entries and not overwrite:
        shown = ", ".join(entries[:5]) + (", ..." if len(entries) > 5 else "")
        raise PrepareError(
            f"--output {output_dir}: not empty ({len(entries)} entries: {shown}); pass --overwrite to "
            "replace the shard directory there"
        )


def prepare(
    input_path: str | Path,
    output_dir: str | Path,
    *,
    tokenizer: Tokenizer,
    text_field: str = "text",
    txt_split: str = "file",
    shard_size_tokens: int = DEFAULT_SHARD_SIZE_TOKENS,
    overwrite: bool = False,
) -> dict[str, Any]:
    """Tokenize every document under ``input_path`` into a shard directory; returns the written index."""
    if txt_split not in TXT_SPLITS:
        raise PrepareError(f"--txt-split {txt_split!r}: allowed: {', '.join(TXT_SPLITS)}")
    if shard_size_tokens < 1:
        raise PrepareError(f"--shard-size-tokens {shard_size_tokens}: allowed: an integer >= 1")
    files = find_input_files(Path(input_path))
    output_dir = Path(output_dir)
    check_output_dir(output_dir, overwrite=overwrite)
    writer = ShardWriter(
        output_dir,
        vocab_size=tokenizer.vocab_size,
        eos_id=tokenizer.eos_id,
        tokenizer=tokenizer.describe(),
        shard_size_tokens=shard_size_tokens,
    )
    skipped_empty = 0
    try:
        pending: list[Document] = []
        for path in files:
            for doc in read_documents(path, text_field=text_field, txt_split=txt_split):
                if not doc.text.strip():
                    skipped_empty += 1
                    continue
                pending.append(doc)
                if len(pending) >= ENCODE_BATCH_DOCUMENTS:
                    _encode_into(writer, tokenizer, pending)
                    pending = []
        _encode_into(writer, tokenizer, pending)
        if writer.num_documents == 0:
            raise PrepareError(f"--input {input_path}: no non-empty documents in {len(files)} file(s)")
        index = writer.finish()
    except BaseException:
        writer.abort()
        raise
    index["input_files"] = len(files)
    index["skipped_empty_documents"] = skipped_empty
    return index


def _encode_into(writer: ShardWriter, tokenizer: Tokenizer, docs: list[Document]) -> None:
    if not docs:
        return
    for doc, ids in zip(docs, tokenizer.encode_batch([d.text for d in docs]), strict=True):
        try:
            writer.add_document(ids)
        except ValueError as exc:  # an id outside the tokenizer's own vocab_size: a broken tokenizer.json
            raise PrepareError(f"{doc.where}: {exc}") from exc


def build_parser() -> argparse.ArgumentParser:
    parser = argparse.ArgumentParser(
        prog="python -m training.prepare",
        description="Tokenize .txt or .jsonl documents into token shards for training (docs/data-format.md). "
        "Each document is followed by the tokenizer's end-of-document token; documents with only whitespace "
        "are skipped. index.json is written last: a directory without it is incomplete.",
    )
    parser.add_argument(
        "--input",
        required=True,
        type=Path,
        metavar="FILE_OR_DIR",
        help="a .txt or .jsonl file, or a directory searched recursively for them (read in path order)",
    )
    parser.add_argument(
        "--output",
        required=True,
        type=Path,
        metavar="DIR",
        help="shard directory to write (created if missing; must be empty unless --overwrite)",
    )
    parser.add_argument(
        "--tokenizer",
        default="byte",
        metavar="byte|PATH",
        help="'byte' (UTF-8 bytes, vocab 257, end-of-document id 256) or the path of a local tokenizer.json "
        "(needs the tokenizers package; never downloads) (default: byte)",
    )
    parser.add_argument(
        "--eos-token",
        default=None,
        metavar="TOKEN",
        help="end-of-document token of a tokenizer.json (default: the first of "
        "<|end_of_text|>, <|endoftext|>, </s>, <eos> in its vocabulary)",
    )
    parser.add_argument(
        "--text-field",
        default="text",
        metavar="NAME",
        help="the field of each .jsonl object holding the text (default: text)",
    )
    parser.add_argument(
        "--txt-split",
        choices=TXT_SPLITS,
        default="file",
        help="what one document is in a .txt file: the whole file, or each block between blank lines "
        "(default: file)",
    )
    parser.add_argument(
        "--shard-size-tokens",
        type=int,
        default=DEFAULT_SHARD_SIZE_TOKENS,
        metavar="N",
        help=f"tokens per shard file; the last one may be smaller (default: {DEFAULT_SHARD_SIZE_TOKENS})",
    )
    parser.add_argument(
        "--overwrite",
        action="store_true",
        help="replace the index.json and shard files in a non-empty --output once the new ones are complete "
        "(other files there are kept)",
    )
    return parser


def main(argv: list[str] | None = None) -> int:
    args = build_parser().parse_args(argv)
    started = time.monotonic()
    try:
        tokenizer = load_tokenizer(args.tokenizer, eos_token=args.eos_token)
        index = prepare(
            args.input,
            args.output,
            tokenizer=tokenizer,
            text_field=args.text_field,
            txt_split=args.txt_split,
            shard_size_tokens=args.shard_size_tokens,
            overwrite=args.overwrite,
        )
    except (PrepareError, TokenizerError) as exc:
        print(f"prepare: error: {exc}", file=sys.stderr)
        return 1
    elapsed_s = time.monotonic() - started
    tok = index["tokenizer"]
    print(
        f"wrote {len(index['shards'])} shard(s), {index['num_tokens']:,} tokens ({index['dtype']}) from "
        f"{index['num_documents']:,} documents in {index['input_files']} file(s) to {args.output}\n"
        f"tokenizer: {tok['kind']}{' ' + tok['path'] if 'path' in tok else ''} "
        f"(vocab_size {index['vocab_size']}, end-of-document id {index['eos_id']})\n"
        f"skipped {index['skipped_empty_documents']} empty document(s); "
        f"{elapsed_s:.1f} s, {index['num_tokens'] / max(elapsed_s, 1e-9):,.0f} tokens/s"
    )
    return 0


if __name__ == "__main__":
    sys.exit(main())
