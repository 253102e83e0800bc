"""training.data.prepare's compressed JSON lines and Parquet inputs: the same shards as plain .jsonl, read streaming."""

from __future__ import annotations

import gzip
import io
import json
import re
import sys
from pathlib import Path

import pyarrow as pa
import pyarrow.parquet as pq
import pytest
import zstandard

from training.data.prepare import main
from training.data.prepare_inputs import PYARROW_PIN, ZSTANDARD_PIN, PrepareError, read_documents
from training.data.shards import open_shards

REPO = Path(__file__).resolve().parents[2]
DOCS = ["first document", "zwei: straße, 東京", "", "   ", "a longer one\nwith two lines\n", "last"]


def _jsonl_bytes(docs, field="text"):
    return b"".join(json.dumps({field: d, "id": i}).encode() + b"\n" for i, d in enumerate(docs))


def write_input(path: Path, docs, field="text") -> Path:
    """``docs`` in the format of ``path``'s name, split in two (two gzip members, two zstd frames, several
    Parquet row groups), as parallel compressors and dataset writers leave them."""
    half = len(docs) // 2
    if path.name.endswith((".jsonl", ".json")):
        path.write_bytes(_jsonl_bytes(docs, field))
    elif path.name.endswith(".gz"):
        path.write_bytes(b"".join(gzip.compress(_jsonl_bytes(part, field)) for part in (docs[:half], docs[half:])))
    elif path.name.endswith(".zst"):
        zstd = zstandard.ZstdCompressor()
        path.write_bytes(b"".join(zstd.compress(_jsonl_bytes(part, field)) for part in (docs[:half], docs[half:])))
    else:
        table = pa.table({"id": list(range(len(docs))), field: docs})
        pq.write_table(table, path, row_group_size=2)
    return path


def _shard_bytes(out: Path) -> list[bytes]:
    return [(out / s["file"]).read_bytes() for s in json.loads((out / "index.json").read_text())["shards"]]


@pytest.mark.parametrize("name", ["c.jsonl.gz", "c.json.gz", "c.jsonl.zst", "c.json.zst", "c.parquet"])
def test_each_format_makes_the_shards_of_the_same_text_as_jsonl(tmp_path, name):
    reference, out = tmp_path / "ref", tmp_path / "out"
    assert main(["--input", str(write_input(tmp_path / "c.jsonl", DOCS)), "--output", str(reference),
                 "--shard-size-tokens", "16"]) == 0
    assert main(["--input", str(write_input(tmp_path / name, DOCS)), "--output", str(out),
                 "--shard-size-tokens", "16"]) == 0
    assert json.loads((out / "index.json").read_text()) == json.loads((reference / "index.json").read_text())
    assert _shard_bytes(out) == _shard_bytes(reference) and len(_shard_bytes(out)) > 1
    assert open_shards(out).num_documents == 4  # the two blank ones skipped


def test_a_directory_mixes_the_formats_in_path_order_with_the_text_field(tmp_path, capsys):
    corpus = tmp_path / "in"
    (corpus / "sub").mkdir(parents=True)
    write_input(corpus / "a.parquet", ["one", "two", "three"], field="content")
    write_input(corpus / "b.jsonl.zst", ["four"], field="content")
    write_input(corpus / "sub" / "c.jsonl.gz", ["five", "six"], field="content")
    (corpus / "notes.json").write_text("{}")  # plain .json is no input format: ignored
    write_input(tmp_path / "all.jsonl", ["one", "two", "three", "four", "five", "six"], field="content")
    assert main(["--input", str(corpus), "--output", str(tmp_path / "out"), "--text-field", "content"]) == 0
    assert "from 6 documents in 3 file(s)" in capsys.readouterr().out
    assert main(["--input", str(tmp_path / "all.jsonl"), "--output", str(tmp_path / "ref"),
                 "--text-field", "content"]) == 0
    assert _shard_bytes(tmp_path / "out") == _shard_bytes(tmp_path / "ref")


@pytest.mark.parametrize("name", ["t.jsonl.gz", "t.jsonl.zst"])
def test_a_damaged_stream_yields_what_precedes_the_damage_then_names_the_line(tmp_path, name):
    # streaming: the documents before the damage come out before the end of the file is reached
    src = tmp_path / name
    write_input(src, [f"document {i} " + "x" * (i % 97) for i in range(20_000)])
    src.write_bytes(src.read_bytes()[: src.stat().st_size // 2])
    docs = read_documents(src, text_field="text", txt_split="file")
    seen = 0
    with pytest.raises(PrepareError, match=rf"^{re.escape(str(src))}: cannot decompress past line (\d+) ") as err:
        for doc in docs:
            assert doc.where == f"{src}:{seen + 1}"
            seen += 1
    assert 0 < seen < 20_000 and str(err.value).startswith(f"{src}: cannot decompress past line {seen} ")


def test_parquet_is_read_a_batch_at_a_time(tmp_path):
    # 64 row groups, 16.5 MB of text: what pyarrow holds while the rows are read stays a small part of it
    texts = [f"doc {i} " + "x" * 1000 for i in range(64 * 256)]
    src = tmp_path / "big.parquet"
    pq.write_table(pa.table({"text": texts}), src, row_group_size=256)
    peak_bytes, count = 0, 0
    for doc in read_documents(src, text_field="text", txt_split="file"):
        peak_bytes = max(peak_bytes, pa.total_allocated_bytes())
        count += 1
        assert doc.text == texts[count - 1]
    assert count == len(texts) and peak_bytes < sum(map(len, texts)) / 4


def test_a_long_window_zstd_file_is_read(tmp_path):
    # `zstd --long` frames ask for a window past the decompressor's default limit (128 MiB)
    params = zstandard.ZstdCompressionParameters.from_level(3, window_log=28, enable_ldm=True)
    buffer = io.BytesIO()
    with zstandard.ZstdCompressor(compression_params=params).stream_writer(buffer, closefd=False) as writer:
        writer.write(_jsonl_bytes(["long window"] * 3))
    src = tmp_path / "long.jsonl.zst"
    src.write_bytes(buffer.getvalue())
    with pytest.raises(zstandard.ZstdError, match="too much memory"):  # what a default decompressor says
        zstandard.ZstdDecompressor().stream_reader(io.BytesIO(buffer.getvalue())).read()
    assert [d.text for d in read_documents(src, text_field="text", txt_split="file")] == ["long window"] * 3


def test_parquet_errors_name_the_file_and_the_column(tmp_path, capsys):
    src = tmp_path / "d.parquet"
    pq.write_table(pa.table({"body": ["a"], "n": [1]}), src)
    assert main(["--input", str(src), "--output", str(tmp_path / "o")]) == 1
    assert f"prepare: error: {src}: no column 'text' (columns: body, n); choose one with --text-field" in (
        capsys.readouterr().err)
    assert main(["--input", str(src), "--output", str(tmp_path / "o"), "--text-field", "n"]) == 1
    assert f"{src}: column 'n' is int64, allowed: a string column" in capsys.readouterr().err
    pq.write_table(pa.table({"text": ["a", None, "c"]}), src)
    assert main(["--input", str(src), "--output", str(tmp_path / "o")]) == 1
    assert f"{src} row 2: column 'text' is null, allowed: a string" in capsys.readouterr().err
    src.write_text("not parquet")
    assert main(["--input", str(src), "--output", str(tmp_path / "o")]) == 1
    assert f"{src}: not a readable Parquet file (" in capsys.readouterr().err
    assert not (tmp_path / "o" / "index.json").exists()


def test_a_compressed_line_error_names_the_line(tmp_path, capsys):
    src = tmp_path / "d.jsonl.zst"
    src.write_bytes(zstandard.ZstdCompressor().compress(b'{"text": "ok"}\n{"body": "x"}\n'))
    assert main(["--input", str(src), "--output", str(tmp_path / "o")]) == 1
    assert f"{src}:2: no field 'text' (fields: body); choose one with --text-field" in capsys.readouterr().err


@pytest.mark.parametrize(("name", "modules", "pin"), [
    ("d.parquet", ("pyarrow", "pyarrow.parquet"), PYARROW_PIN),
    ("d.jsonl.zst", ("zstandard",), ZSTANDARD_PIN),
])
def test_a_missing_package_is_named_with_its_pin_before_anything_is_written(tmp_path, capsys, monkeypatch, name,
                                                                            modules, pin):
    corpus = tmp_path / "in"
    corpus.mkdir()
    write_input(corpus / "a.jsonl", ["fine"])
    write_input(corpus / name, ["needs a package"])
    for module in modules:
        monkeypatch.setitem(sys.modules, module, None)  # `import` of it now raises ImportError
    assert main(["--input", str(corpus), "--output", str(tmp_path / "o")]) == 1
    package = pin.split("==")[0]
    assert capsys.readouterr().err == (
        f"prepare: error: {corpus / name}: reading it needs the {package} package: pip install {pin}\n")
    assert not (tmp_path / "o").exists()


def test_the_pins_in_the_messages_are_the_tested_ones():
    pins = (REPO / "requirements-dev.txt").read_text().split()
    assert PYARROW_PIN in pins and ZSTANDARD_PIN in pins
    assert pa.__version__ == PYARROW_PIN.split("==")[1] and zstandard.__version__ == ZSTANDARD_PIN.split("==")[1]
