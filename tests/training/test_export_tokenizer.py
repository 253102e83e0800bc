"""The tokenizer files an export writes for a run without an init directory (training/hf/tokenizer_files.py).

The byte tokenizer's export through a real run is in test_train.py (the README's quick start); here each other
case of what the run's shard directory records, in-process and without torch."""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from training.data.prepare import prepare
from training.data.tokenizer import ByteTokenizer, JsonFileTokenizer
from training.hf.tokenizer_files import TOKENIZER_CONFIG_FILE, TOKENIZER_FILE, byte_tokenizer_json, write_run_tokenizer


def _shards(tmp_path: Path, tokenizer) -> Path:
    corpus = tmp_path / "corpus.txt"
    corpus.write_text("one document of text\n")
    prepare(corpus, tmp_path / "shards", tokenizer=tokenizer)
    return tmp_path / "shards"


@pytest.fixture
def own_tokenizer_file(tmp_path) -> Path:
    # a user's tokenizer.json (here: the byte tokenizer's own, which the tokenizers package reads)
    path = tmp_path / "mine" / "tokenizer.json"
    path.parent.mkdir()
    path.write_text(json.dumps(byte_tokenizer_json()))
    return path


def test_a_prepared_tokenizer_json_is_copied_with_its_end_of_document_token(tmp_path, own_tokenizer_file):
    shards = _shards(tmp_path, JsonFileTokenizer(own_tokenizer_file))
    out = tmp_path / "export"
    out.mkdir()
    written = write_run_tokenizer(out, {"source": "shards", "path": str(shards)}, max_length=64)
    assert written == f"the tokenizer the data was prepared with ({own_tokenizer_file})"
    assert (out / TOKENIZER_FILE).read_bytes() == own_tokenizer_file.read_bytes()
    assert json.loads((out / TOKENIZER_CONFIG_FILE).read_text()) == {
        "tokenizer_class": "PreTrainedTokenizerFast", "model_max_length": 64, "eos_token": "<|end_of_text|>"}


def test_a_tokenizer_file_changed_since_prepare_is_not_the_runs_and_is_not_copied(tmp_path, own_tokenizer_file):
    shards = _shards(tmp_path, JsonFileTokenizer(own_tokenizer_file))
    own_tokenizer_file.write_text(own_tokenizer_file.read_text() + " ")
    out = tmp_path / "export"
    out.mkdir()
    written = write_run_tokenizer(out, {"source": "shards", "path": str(shards)}, max_length=None)
    assert written == f"no tokenizer files ({own_tokenizer_file} is gone or changed since the data was prepared)"
    assert list(out.iterdir()) == []


def test_synthetic_data_and_missing_shards_write_nothing_and_say_why(tmp_path):
    out = tmp_path / "export"
    out.mkdir()
    assert write_run_tokenizer(out, {"source": "synthetic", "path": ""}, max_length=64) == (
        "no tokenizer files (the run trained on synthetic data)")
    gone = tmp_path / "gone"
    assert write_run_tokenizer(out, {"source": "shards", "path": str(gone)}, max_length=64) == (
        f"no tokenizer files ({gone / 'index.json'} cannot be read: the run's shards are not here)")
    assert list(out.iterdir()) == []


def test_byte_shards_get_the_byte_tokenizer_without_a_max_length_when_the_run_has_none(tmp_path):
    shards = _shards(tmp_path, ByteTokenizer())
    out = tmp_path / "export"
    out.mkdir()
    written = write_run_tokenizer(out, {"source": "shards", "path": str(shards)}, max_length=None)
    assert written.startswith("the byte tokenizer")
    assert "model_max_length" not in json.loads((out / TOKENIZER_CONFIG_FILE).read_text())
    vocab = json.loads((out / TOKENIZER_FILE).read_text())["model"]["vocab"]
    assert sorted(vocab.values()) == list(range(256)) and vocab["a"] == ord("a") and vocab["Ġ"] == ord(" ")
