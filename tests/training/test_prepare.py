"""python -m training.data.prepare: text and jsonl to shards, errors that name file and line, safe overwrite."""

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest

from training.data.prepare import main
from training.data.shards import open_shards

REPO = Path(__file__).resolve().parents[2]


def _byte_stream(docs):
    out = []
    for doc in docs:
        out.extend(doc.encode("utf-8"))
        out.append(256)
    return out


def _tokens(path):
    shards = open_shards(path)
    return shards.read(0, shards.num_tokens).tolist()


@pytest.fixture
def corpus(tmp_path):
    root = tmp_path / "in"
    (root / "sub").mkdir(parents=True)
    (root / "a.txt").write_text("first file\nstill first\n\nsame document\n")
    (root / "sub" / "c.jsonl").write_text(
        json.dumps({"text": "json one", "id": 1}) + "\n\n" + json.dumps({"text": "jsön two"}) + "\n"
    )
    (root / "b.txt").write_text("   \n")  # whitespace only: skipped
    (root / "notes.md").write_text("ignored: not .txt or .jsonl")
    return root


def test_directory_of_txt_and_jsonl_round_trips(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    assert main(["--input", str(corpus), "--output", str(out), "--shard-size-tokens", "16"]) == 0
    # files in sorted path order: a.txt, b.txt (empty), sub/c.jsonl; a .txt file is one document
    docs = ["first file\nstill first\n\nsame document\n", "json one", "jsön two"]
    assert _tokens(out) == _byte_stream(docs)
    index = json.loads((out / "index.json").read_text())
    assert index["num_documents"] == 3 and index["dtype"] == "uint16"
    assert [s["num_tokens"] for s in index["shards"]][:-1] == [16] * (len(index["shards"]) - 1)
    assert not list(out.glob(".*.tmp"))
    summary = capsys.readouterr().out
    shards, tokens = len(index["shards"]), index["num_tokens"]
    assert f"{shards} shard(s), {tokens:,} tokens (uint16) from 3 documents in 3 file(s)" in summary
    assert "skipped 1 empty document(s)" in summary and "tokenizer: byte (vocab_size 257" in summary


def test_blank_line_split_makes_one_document_per_block(tmp_path):
    src = tmp_path / "blocks.txt"
    src.write_text("para one\nline two\n\n\n  \npara two\n\npara three")
    assert main(["--input", str(src), "--output", str(tmp_path / "out"), "--txt-split", "blank-line"]) == 0
    assert _tokens(tmp_path / "out") == _byte_stream(["para one\nline two", "para two", "para three"])


def test_jsonl_missing_field_names_the_line(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    assert (
        main(["--input", str(corpus / "sub" / "c.jsonl"), "--output", str(out), "--text-field", "body"]) == 1
    )
    err = capsys.readouterr().err
    assert f"prepare: error: {corpus / 'sub' / 'c.jsonl'}:1: no field 'body' (fields: id, text)" in err
    assert "--text-field" in err
    assert list(out.iterdir()) == []  # nothing half-written


@pytest.mark.parametrize(
    ("line", "message"),
    [
        ("{not json", ":2: not valid JSON"),
        ("[1, 2]", ":2: expected a JSON object, found list"),
        ('{"text": 5}', ":2: field 'text' is int, allowed: a string"),
    ],
)
def test_bad_jsonl_lines_are_named(tmp_path, capsys, line, message):
    src = tmp_path / "d.jsonl"
    src.write_text('{"text": "fine"}\n' + line + "\n")
    assert main(["--input", str(src), "--output", str(tmp_path / "out")]) == 1
    assert f"{src}{message}" in capsys.readouterr().err


def test_non_empty_output_is_refused_without_overwrite(corpus, tmp_path, capsys):
    out = tmp_path / "out"
    out.mkdir()
    (out / "keep.txt").write_text("mine")
    assert main(["--input", str(corpus), "--output", str(out)]) == 1
    assert "not empty (1 entries: keep.txt); pass --overwrite" in capsys.readouterr().err
    assert sorted(p.name for p in out.iterdir()) == ["keep.txt"]


def test_overwrite_replaces_shards_and_keeps_other_files(corpus, tmp_path):
    out = tmp_path / "out"
    assert main(["--input", str(corpus), "--output", str(out), "--shard-size-tokens", "8"]) == 0
    old_shards = len(list(out.glob("shard-*.bin")))
    (out / "README").write_text("my notes")
    src = tmp_path / "small.txt"
    src.write_text("tiny")
    assert main(["--input", str(src), "--output", str(out), "--overwrite", "--shard-size-tokens", "8"]) == 0
    assert _tokens(out) == _byte_stream(["tiny"])
    assert sorted(p.name for p in out.iterdir()) == ["README", "index.json", "shard-00000.bin"]
    assert old_shards > 1


def test_a_failed_overwrite_leaves_the_old_shards_intact(corpus, tmp_path):
    out = tmp_path / "out"
    assert main(["--input", str(corpus), "--output", str(out), "--shard-size-tokens", "8"]) == 0
    before = _tokens(out)
    bad = tmp_path / "bad"
    bad.mkdir()
    (bad / "a.jsonl").write_text(json.dumps({"text": "x" * 100}) + "\n")  # fills several new shards ...
    (bad / "b.jsonl").write_text("{broken\n")  # ... before this fails
    assert main(["--input", str(bad), "--output", str(out), "--overwrite", "--shard-size-tokens", "8"]) == 1
    assert _tokens(out) == before
    assert not list(out.glob(".*.tmp"))


def test_input_errors(tmp_path, capsys):
    assert main(["--input", str(tmp_path / "missing"), "--output", str(tmp_path / "o")]) == 1
    assert "no such file or directory" in capsys.readouterr().err
    (tmp_path / "x.csv").write_text("a,b")
    assert main(["--input", str(tmp_path / "x.csv"), "--output", str(tmp_path / "o")]) == 1
    assert "allowed suffixes: .txt, .jsonl" in capsys.readouterr().err
    (tmp_path / "latin1.txt").write_bytes("café".encode("latin-1"))
    assert main(["--input", str(tmp_path / "latin1.txt"), "--output", str(tmp_path / "o")]) == 1
    err = capsys.readouterr().err
    assert f"{tmp_path / 'latin1.txt'}: not UTF-8 (unexpected end of data at byte 3)" in err
    (tmp_path / "empty.txt").write_text("\n\n")
    assert main(["--input", str(tmp_path / "empty.txt"), "--output", str(tmp_path / "o")]) == 1
    assert "no non-empty documents" in capsys.readouterr().err
    assert not (tmp_path / "o" / "index.json").exists()


def test_a_local_tokenizer_json(tmp_path):
    # a real tokenizer.json, trained here on a few words (tests/ has no __init__.py to share helpers through)
    from tokenizers import Tokenizer, models, pre_tokenizers, trainers

    tok = Tokenizer(models.WordLevel(unk_token="[UNK]"))
    tok.pre_tokenizer = pre_tokenizers.Whitespace()
    tok.train_from_iterator(
        ["the cat sat", "the dog"], trainers.WordLevelTrainer(special_tokens=["[UNK]", "</s>"])
    )
    tok_path = tmp_path / "tokenizer.json"
    tok.save(str(tok_path))
    src = tmp_path / "d.jsonl"
    src.write_text(json.dumps({"text": "the cat sat"}) + "\n" + json.dumps({"text": "the dog"}) + "\n")
    assert main(["--input", str(src), "--output", str(tmp_path / "out"), "--tokenizer", str(tok_path)]) == 0
    shards = open_shards(tmp_path / "out")
    assert shards.tokenizer["kind"] == "tokenizer.json" and shards.eos_id == 1
    ids = shards.read(0, shards.num_tokens)
    assert ids.tolist().count(1) == 2 and ids[-1] == 1 and len(ids) == 3 + 1 + 2 + 1
    assert np.all(ids < shards.vocab_size)


def test_the_module_runs_as_a_command(corpus, tmp_path):
    help_text = subprocess.run(
        [sys.executable, "-m", "training.data.prepare", "--help"],
        cwd=REPO,
        capture_output=True,
        text=True,
        check=True,
    ).stdout
    for option in (
        "--input",
        "--output",
        "--tokenizer",
        "--text-field",
        "--txt-split",
        "--shard-size-tokens",
    ):
        assert option in help_text
    run = subprocess.run(
        [sys.executable, "-m", "training.data.prepare", "--input", str(corpus), "--output", str(tmp_path / "out")],
        cwd=REPO,
        capture_output=True,
        text=True,
    )
    assert run.returncode == 0, run.stderr
    assert "wrote 1 shard(s)" in run.stdout
