"""python -m training.data.prepare: tokenize text, JSON lines or Parquet into a shard directory (docs/data-format.md).

    python -m training.data.prepare --input corpus/ --output /fsx/data/corpus-byte
    python -m training.data.prepare --input docs.jsonl.zst --text-field body --tokenizer tokenizer.json \\
        --output /fsx/data/docs-llama3

The input formats and their readers: training/data/prepare_inputs.py.

Shards are written to temporary names and renamed into place at the end, index.json last: a run that fails
leaves the output directory as it was, and one killed half-way leaves it without index.json, which training
refuses to open.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from typing import Any

from training.data.prepare_inputs import (
    SUFFIXES,
    Document,
    PrepareError,
    check_readers,
    find_input_files,
    read_documents,
)
from training.data.shards import ShardWriter
from training.data.tokenizer import Tokenizer, TokenizerError, load_tokenizer

TXT_SPLITS = ("file", "blank-line")
DEFAULT_SHARD_SIZE_TOKENS = 1 << 27  # 256 MiB per shard at uint16: few files, each large enough to stream
ENCODE_BATCH_DOCUMENTS = 512  # documents handed to the tokenizer at once (tokenizers parallelizes a batch)


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
    check_readers(files)  # a missing pyarrow or zstandard fails now, not after hours of other files
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
        prog="python -m training.data.prepare",
        description="Tokenize .txt, JSON lines (.jsonl, gzip- or zstd-compressed) or Parquet documents into token "
        "shards for training (docs/data-format.md). "
        "Each document is followed by the tokenizer's end-of-document token; documents with only whitespace "
        "are skipped. index.json is written last: a directory without it is incomplete.",
    )
    parser.add_argument(
        "--input",
        required=True,
        type=Path,
        metavar="FILE_OR_DIR",
        help=f"a file ({', '.join(SUFFIXES)}), or a directory searched recursively for them (read in path "
        "order); .json.gz/.json.zst are read as JSON lines; Parquet needs pyarrow, .zst needs zstandard",
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
        help="'byte' (UTF-8 bytes, vocab 257, end-of-document id 256), the path of a local tokenizer.json, or a "
        "model directory holding one (e.g. the Hugging Face directory a fine-tune starts from) (needs the "
        "tokenizers package; never downloads) (default: byte)",
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
        help="the field of each JSON-lines object, or the string column of a Parquet file, holding the text "
        "(default: text)",
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
