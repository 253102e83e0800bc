"""The tokenizer files of an export whose run had no init directory: the tokenizer its data was prepared with,
in the form ``AutoTokenizer.from_pretrained`` loads (issue 44: the quick-start export had none).

The run's shard directory records its tokenizer (``index.json``'s ``tokenizer``, training.data.prepare):
- ``byte`` (the default): written here as a ``tokenizers`` BPE model with no merges over the 256 byte-level
  symbols, so id i is byte i (the same ids as training.data.tokenizer.ByteTokenizer), and the end-of-document
  id 256 as the special token ``<|end_of_text|>`` (Llama 3's name for it). The byte-level symbols are GPT-2's
  printable stand-ins for bytes, which the ByteLevel pre-tokenizer and decoder map to and from.
- ``tokenizer.json``: that file is copied, when it is still where prepare read it and its sha256 is the one
  recorded (a file changed since is not the run's tokenizer).
A synthetic run, or shards no longer there, get no tokenizer files: the export says so in its log line.
Plain JSON, no ``tokenizers`` import: an export runs where only torch and safetensors are installed.
"""

from __future__ import annotations

import hashlib
import json
import shutil
from pathlib import Path
from typing import Any

from training.data.shards import INDEX_FILE
from training.data.tokenizer import BYTE_EOS_ID, BYTE_VOCAB_SIZE

TOKENIZER_FILE = "tokenizer.json"
TOKENIZER_CONFIG_FILE = "tokenizer_config.json"
BYTE_EOS_TOKEN = "<|end_of_text|>"


def byte_level_symbols() -> list[str]:
    """The printable character that stands for each byte 0..255 in byte-level BPE (GPT-2's table): printable
    Latin-1 bytes stand for themselves, the others take the code points from 256 up, in byte order."""
    printable = [*range(ord("!"), ord("~") + 1), *range(ord("¡"), ord("¬") + 1), *range(ord("®"), ord("ÿ") + 1)]
    symbols: dict[int, str] = {b: chr(b) for b in printable}
    extra = 0
    for b in range(256):
        if b not in symbols:
            symbols[b] = chr(256 + extra)
            extra += 1
    return [symbols[b] for b in range(256)]


def byte_tokenizer_json() -> dict[str, Any]:
    """A tokenizer.json whose ids are ByteTokenizer's: byte b -> b, end of document -> 256."""
    byte_level = {"type": "ByteLevel", "add_prefix_space": False, "trim_offsets": False, "use_regex": False}
    return {
        "version": "1.0",
        "truncation": None,
        "padding": None,
        "added_tokens": [{"id": BYTE_EOS_ID, "content": BYTE_EOS_TOKEN, "single_word": False, "lstrip": False,
                          "rstrip": False, "normalized": False, "special": True}],
        "normalizer": None,
        "pre_tokenizer": byte_level,
        "post_processor": None,
        "decoder": byte_level,
        "model": {"type": "BPE", "dropout": None, "unk_token": None, "continuing_subword_prefix": None,
                  "end_of_word_suffix": None, "fuse_unk": False, "byte_fallback": False, "ignore_merges": False,
                  "vocab": {symbol: b for b, symbol in enumerate(byte_level_symbols())}, "merges": []},
    }


def byte_tokenizer_config(max_length: int | None) -> dict[str, Any]:
    return {"tokenizer_class": "PreTrainedTokenizerFast", "eos_token": BYTE_EOS_TOKEN,
            "clean_up_tokenization_spaces": False, **_max_length(max_length)}


def _max_length(max_length: int | None) -> dict[str, int]:
    """The run's sequence length as the tokenizer's model_max_length (transformers warns past it)."""
    return {} if max_length is None else {"model_max_length": max_length}


def write_run_tokenizer(out: Path, data: dict[str, Any], *, max_length: int | None) -> str:
    """Write the tokenizer files for a run without an init directory, from its ``[data]`` settings; returns
    what was written, for the export's log line."""
    if data.get("source") != "shards" or not data.get("path"):
        return "no tokenizer files (the run trained on synthetic data)"
    index_path = Path(data["path"]) / INDEX_FILE
    try:
        recorded = json.loads(index_path.read_text()).get("tokenizer", {})
    except (OSError, ValueError):
        return f"no tokenizer files ({index_path} cannot be read: the run's shards are not here)"
    kind = recorded.get("kind") if isinstance(recorded, dict) else None
    if kind == "byte":
        if recorded.get("vocab_size") != BYTE_VOCAB_SIZE or recorded.get("eos_id") != BYTE_EOS_ID:
            return f"no tokenizer files ({index_path} records a byte tokenizer of another vocabulary)"
        (out / TOKENIZER_FILE).write_text(json.dumps(byte_tokenizer_json(), ensure_ascii=False) + "\n")
        (out / TOKENIZER_CONFIG_FILE).write_text(json.dumps(byte_tokenizer_config(max_length), indent=2) + "\n")
        return "the byte tokenizer (tokenizer.json: id = byte, 256 = <|end_of_text|>)"
    if kind == "tokenizer.json":
        source = Path(str(recorded.get("path", "")))
        if not source.is_file() or hashlib.sha256(source.read_bytes()).hexdigest() != recorded.get("sha256"):
            return f"no tokenizer files ({source} is gone or changed since the data was prepared)"
        shutil.copyfile(source, out / TOKENIZER_FILE)
        eos = recorded.get("eos_token")
        config = {"tokenizer_class": "PreTrainedTokenizerFast", **_max_length(max_length),
                  **({"eos_token": eos} if isinstance(eos, str) else {})}
        (out / TOKENIZER_CONFIG_FILE).write_text(json.dumps(config, indent=2) + "\n")
        return f"the tokenizer the data was prepared with ({source})"
    return f"no tokenizer files ({index_path} records no tokenizer this export knows)"
