"""The byte-level tokenizer and local tokenizer.json loading (no hub, no network)."""

import sys

import pytest

from training.data.tokenizer import BYTE_EOS_ID, ByteTokenizer, JsonFileTokenizer, TokenizerError, load_tokenizer


def test_byte_tokenizer_round_trips_utf8():
    tok = load_tokenizer("byte")
    assert isinstance(tok, ByteTokenizer)
    assert (tok.vocab_size, tok.eos_id) == (257, 256)
    text = "héllo, 世界 🙂"
    (ids,) = tok.encode_batch([text])
    assert ids == list(text.encode("utf-8")) and max(ids) < 256
    assert tok.decode(ids + [BYTE_EOS_ID]) == text
    assert tok.describe() == {"kind": "byte", "vocab_size": 257, "eos_id": 256}


def test_byte_tokenizer_has_a_fixed_eos():
    with pytest.raises(
        TokenizerError, match=r"eos_token='</s>': the byte tokenizer's end-of-document id is fixed"
    ):
        load_tokenizer("byte", eos_token="</s>")


def write_tokenizer_json(path, special_tokens=("[UNK]", "</s>")):
    """A real tokenizer.json, trained here with the tokenizers package on a few sentences."""
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    trainer = trainers.WordLevelTrainer(special_tokens=list(special_tokens))
    tok.train_from_iterator(["the cat sat on the mat", "the dog ate the cat food"], trainer)
    tok.save(str(path))
    return path


def test_tokenizer_json_is_loaded_from_the_file_and_finds_its_eos(tmp_path):
    path = write_tokenizer_json(tmp_path / "tokenizer.json")
    tok = load_tokenizer(str(path))
    assert isinstance(tok, JsonFileTokenizer)
    assert tok.eos_token == "</s>" and tok.eos_id == 1
    assert tok.vocab_size == 2 + len({"the", "cat", "sat", "on", "mat", "dog", "ate", "food"})
    (ids,) = tok.encode_batch(["the cat ate"])
    assert len(ids) == 3 and all(2 <= i < tok.vocab_size for i in ids)
    assert tok.decode(ids) == "the cat ate"
    described = tok.describe()
    assert described["kind"] == "tokenizer.json" and described["eos_token"] == "</s>"
    assert len(described["sha256"]) == 64 and described["path"] == str(path.resolve())


def test_a_model_directory_means_its_tokenizer_json(tmp_path):
    # issue 44: a fine-tune prepares its data with the model's own tokenizer, given as the model's directory
    path = write_tokenizer_json(tmp_path / "tokenizer.json")
    tok = load_tokenizer(str(tmp_path))
    assert isinstance(tok, JsonFileTokenizer) and tok.describe()["path"] == str(path.resolve())
    empty = tmp_path / "no-tokenizer"
    empty.mkdir()
    with pytest.raises(TokenizerError, match=r"no-tokenizer/tokenizer.json': no such file"):
        load_tokenizer(str(empty))


def test_an_explicit_eos_token_must_exist(tmp_path):
    path = write_tokenizer_json(tmp_path / "tokenizer.json", special_tokens=("[UNK]", "[SEP]"))
    assert load_tokenizer(str(path), eos_token="[SEP]").eos_id == 1
    with pytest.raises(TokenizerError, match=r"eos_token='</s>': not in the vocabulary of"):
        load_tokenizer(str(path), eos_token="</s>")
    with pytest.raises(TokenizerError, match=r"none of <\|end_of_text\|>, .* name its end-of-document token"):
        load_tokenizer(str(path))


def test_missing_or_invalid_file(tmp_path):
    with pytest.raises(TokenizerError, match=r"no such file \(expected a tokenizer.json\)"):
        load_tokenizer(str(tmp_path / "missing.json"))
    (tmp_path / "bad.json").write_text("{}")
    with pytest.raises(TokenizerError, match="not a valid tokenizer.json"):
        load_tokenizer(str(tmp_path / "bad.json"))


def test_missing_tokenizers_package_says_how_to_install(tmp_path, monkeypatch):
    path = write_tokenizer_json(tmp_path / "tokenizer.json")
    monkeypatch.setitem(sys.modules, "tokenizers", None)  # what an environment without the package gives
    with pytest.raises(TokenizerError, match=r"needs the 'tokenizers' package: pip install tokenizers"):
        load_tokenizer(str(path))
