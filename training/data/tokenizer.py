"""Tokenizers for ``python -m training.data.prepare``: a byte-level one, and a local tokenizer.json.

The byte-level tokenizer needs nothing: token i < 256 is byte i of the UTF-8 text, and 256 is the
end-of-document token. A tokenizer.json (Hugging Face ``tokenizers`` format, e.g. Llama 3's) is loaded from
a local file only: nothing here reaches a model hub, so preparing data works on a node without internet.
"""

from __future__ import annotations

import hashlib
from collections.abc import Sequence
from pathlib import Path
from typing import Any, Protocol

BYTE_VOCAB_SIZE = 257  # bytes 0..255, then the end-of-document token
BYTE_EOS_ID = 256

# Names that tokenizer.json files commonly give their end-of-document token, tried in order when the
# caller does not name one: Llama 3, GPT-2/NeoX, Llama 2/Mistral, Gemma.
EOS_CANDIDATES = ("<|end_of_text|>", "<|endoftext|>", "</s>", "<eos>")


class TokenizerError(ValueError):
    """A tokenizer that cannot be used: a missing file or package, or no end-of-document token."""


class Tokenizer(Protocol):
    vocab_size: int  # number of token ids, special tokens included; every id is < vocab_size
    eos_id: int  # the token appended after every document

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        """Token ids of each text, without special tokens."""
        ...

    def decode(self, ids: Sequence[int]) -> str: ...

    def describe(self) -> dict[str, Any]:
        """What index.json records about the tokenizer, so a reader knows how the ids were made."""
        ...


class ByteTokenizer:
    """UTF-8 bytes as tokens: vocab 257 (bytes, then EOS = 256)."""

    vocab_size = BYTE_VOCAB_SIZE
    eos_id = BYTE_EOS_ID

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        return [list(text.encode("utf-8")) for text in texts]

    def decode(self, ids: Sequence[int]) -> str:
        # EOS (and any id past a byte) has no text; a cut inside a multi-byte character decodes as U+FFFD
        return bytes(i for i in ids if 0 <= i < 256).decode("utf-8", errors="replace")

    def describe(self) -> dict[str, Any]:
        return {"kind": "byte", "vocab_size": self.vocab_size, "eos_id": self.eos_id}


class JsonFileTokenizer:
    """A local tokenizer.json through the ``tokenizers`` package (imported only when one is used)."""

    def __init__(self, path: str | Path, *, eos_token: str | None = None):
        self.path = Path(path)
        if not self.path.is_file():
            raise TokenizerError(f"tokenizer {str(self.path)!r}: no such file (expected a tokenizer.json)")
        try:
            import tokenizers
        except ImportError as exc:
            raise TokenizerError(
                f"tokenizer {str(self.path)!r} needs the 'tokenizers' package: pip install tokenizers "
                "(or use --tokenizer byte)"
            ) from exc
        try:
            self._tok = tokenizers.Tokenizer.from_file(str(self.path))
        except Exception as exc:  # the Rust side raises a bare Exception for a malformed file
            raise TokenizerError(f"tokenizer {str(self.path)!r}: not a valid tokenizer.json ({exc})") from exc
        self.vocab_size = int(self._tok.get_vocab_size(with_added_tokens=True))
        self.eos_token, self.eos_id = self._find_eos(eos_token)

    def _find_eos(self, eos_token: str | None) -> tuple[str, int]:
        names = (eos_token,) if eos_token is not None else EOS_CANDIDATES
        for name in names:
            token_id = self._tok.token_to_id(name)
            if token_id is not None:
                return name, int(token_id)
        if eos_token is not None:
            raise TokenizerError(f"eos_token={eos_token!r}: not in the vocabulary of {str(self.path)!r}")
        raise TokenizerError(
            f"tokenizer {str(self.path)!r}: none of {', '.join(EOS_CANDIDATES)} is in its vocabulary; "
            "name its end-of-document token with --eos-token"
        )

    def encode_batch(self, texts: Sequence[str]) -> list[list[int]]:
        # no BOS/EOS from the tokenizer's post-processor: prepare appends exactly one EOS per document
        return [enc.ids for enc in self._tok.encode_batch(list(texts), add_special_tokens=False)]

    def decode(self, ids: Sequence[int]) -> str:
        return self._tok.decode(list(ids), skip_special_tokens=False)

    def describe(self) -> dict[str, Any]:
        return {
            "kind": "tokenizer.json",
            "path": str(self.path.resolve()),
            "sha256": hashlib.sha256(self.path.read_bytes()).hexdigest(),
            "vocab_size": self.vocab_size,
            "eos_token": self.eos_token,
            "eos_id": self.eos_id,
        }


def load_tokenizer(spec: str, *, eos_token: str | None = None) -> Tokenizer:
    """``"byte"`` for the byte-level tokenizer, else a local tokenizer.json, or a model directory holding one
    (a Hugging Face model directory, e.g. the Llama 3.1 8B one a fine-tune starts from)."""
    if Path(spec).is_dir():
        spec = str(Path(spec) / "tokenizer.json")  # a directory without one: "no such file" names the path
    if spec == "byte":
        if eos_token is not None:
            raise TokenizerError(
                f"eos_token={eos_token!r}: the byte tokenizer's end-of-document id is fixed (256)"
            )
        return ByteTokenizer()
    return JsonFileTokenizer(spec, eos_token=eos_token)
