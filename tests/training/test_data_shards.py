"""The shard format: written by prepare, read back exactly, validated on open; batches from shards."""

import json
import shutil

import numpy as np
import pytest
import torch

from training.data.batches import DataConfig, build_batch_source, permute
from training.data.prepare import prepare
from training.data.shards import ShardFormatError, ShardWriter, open_shards
from training.data.tokenizer import ByteTokenizer
from training.errors import ConfigError

DOCS = [f"document {i}: " + "lorem ipsum dolor sit amet " * (i % 7 + 1) + "é ü 字" for i in range(40)]


@pytest.fixture(scope="module")
def corpus(tmp_path_factory):
    """40 documents in a .jsonl file, tokenized into shards of 500 tokens (documents span shards)."""
    root = tmp_path_factory.mktemp("corpus")
    with open(root / "docs.jsonl", "w") as f:
        for doc in DOCS:
            f.write(json.dumps({"text": doc}) + "\n")
    prepare(root / "docs.jsonl", root / "shards", tokenizer=ByteTokenizer(), shard_size_tokens=500)
    return root / "shards"


def _expected_stream():
    tokens = []
    for doc in DOCS:
        tokens.extend(doc.encode("utf-8"))
        tokens.append(256)
    return np.array(tokens, dtype=np.int64)


def test_round_trip_reads_back_the_exact_tokens(corpus):
    shards = open_shards(corpus)
    expected = _expected_stream()
    assert shards.num_tokens == len(expected)
    assert shards.vocab_size == 257 and shards.eos_id == 256 and shards.dtype == np.uint16
    assert shards.num_documents == len(DOCS)
    assert [s.num_tokens for s in shards.shards[:-1]] == [500] * (len(shards.shards) - 1)
    assert np.array_equal(shards.read(0, shards.num_tokens), expected)
    # a read across a shard boundary
    assert np.array_equal(shards.read(480, 50), expected[480:530])
    with pytest.raises(IndexError):
        shards.read(shards.num_tokens - 3, 4)


def test_uint32_shards_for_a_large_vocabulary(tmp_path):
    writer = ShardWriter(
        tmp_path, vocab_size=128_256, eos_id=128_001, tokenizer={"kind": "test"}, shard_size_tokens=4
    )
    writer.add_document([5, 70_000, 128_255])
    writer.add_document([])
    index = writer.finish()
    assert index["dtype"] == "uint32"
    shards = open_shards(tmp_path)
    assert shards.read(0, shards.num_tokens).tolist() == [5, 70_000, 128_255, 128_001, 128_001]
    assert [s.num_tokens for s in shards.shards] == [4, 1]


def test_writer_refuses_ids_outside_the_vocabulary(tmp_path):
    writer = ShardWriter(tmp_path, vocab_size=257, eos_id=256, tokenizer={}, shard_size_tokens=10)
    with pytest.raises(ValueError, match=r"token id 300 outside the vocabulary \[0, 257\)"):
        writer.add_document([1, 300])


def _source(path, *, rank=0, world=2, micro=2, accum=2, seq_len=16, vocab=257, seed=1):
    return build_batch_source(
        DataConfig(source="shards", path=str(path)),
        seq_len=seq_len,
        vocab_size=vocab,
        seed=seed,
        dp_rank=rank,
        dp_world_size=world,
        micro_batch_size=micro,
        grad_accum_steps=accum,
    )


def test_batches_are_stream_windows_shifted_by_one(corpus):
    source = _source(corpus, rank=1)
    stream = torch.from_numpy(_expected_stream())
    inputs, targets = source.get(2, 1)
    assert inputs.shape == targets.shape == (2, 16) and inputs.dtype == torch.int64
    g = ((2 * 2 + 1) * 2 + 1) * 2 + np.arange(2)
    windows = permute(g % source.num_windows, source.num_windows, seed=1, epoch=0)
    for row, window in enumerate(windows):
        start = int(window) * 16
        assert torch.equal(inputs[row], stream[start : start + 16])
        assert torch.equal(targets[row], stream[start + 1 : start + 17])


@pytest.fixture(scope="module")
def counting(tmp_path_factory):
    """Shards whose token at stream position p is p, so a sample's first input names its window."""
    path = tmp_path_factory.mktemp("counting")
    writer = ShardWriter(
        path, vocab_size=65_536, eos_id=65_535, tokenizer={"kind": "test"}, shard_size_tokens=700
    )
    writer.add_document(np.arange(4_000))
    writer.finish()
    return path


def _windows_read(sources, steps, accum, seq_len):
    """Window numbers each rank reads over ``steps``, in order."""
    read = {rank: [] for rank in range(len(sources))}
    for step in steps:
        for micro_step in range(accum):
            for rank, source in enumerate(sources):
                inputs, targets = source.get(step, micro_step)
                assert torch.equal(inputs[:, 1:], targets[:, :-1])
                assert (inputs[:, 0] % seq_len == 0).all()  # windows start at multiples of seq_len
                read[rank].extend((inputs[:, 0] // seq_len).tolist())
    return read


def test_ranks_read_disjoint_windows_and_each_epoch_covers_every_window_once(counting):
    world, micro, accum, seq_len = 2, 5, 1, 16  # 10 samples per step
    sources = [
        _source(counting, rank=r, world=world, micro=micro, accum=accum, seq_len=seq_len, vocab=65_536)
        for r in range(world)
    ]
    n = sources[0].num_windows
    assert n == 4_000 // seq_len == 250  # 25 steps per epoch
    epoch0 = _windows_read(sources, range(25), accum, seq_len)
    assert not set(epoch0[0]) & set(epoch0[1])  # ranks disjoint
    assert sorted(epoch0[0] + epoch0[1]) == list(range(n))  # every window exactly once
    epoch1 = _windows_read(sources, range(25, 50), accum, seq_len)
    assert sorted(epoch1[0] + epoch1[1]) == list(range(n))
    assert epoch1[0] != epoch0[0]  # a new order


def test_order_is_repeatable_after_a_restart_and_reshuffled_per_epoch(corpus):
    a, b = _source(corpus), _source(corpus)
    assert all(torch.equal(x, y) for x, y in zip(a.get(7, 1), b.get(7, 1), strict=True))
    n = a.num_windows
    epoch0 = permute(np.arange(n), n, seed=1, epoch=0)
    epoch1 = permute(np.arange(n), n, seed=1, epoch=1)
    assert not np.array_equal(epoch0, epoch1)
    # a micro-batch that straddles the epoch boundary still reads valid windows from both epochs
    one = _source(corpus, world=1, micro=5, accum=1)
    step = n // 5  # samples 5*step .. 5*step+4 cross g = n unless n is a multiple of 5
    inputs, _ = one.get(step, 0)
    assert inputs.shape == (5, 16)


def test_model_vocab_smaller_than_the_shards_is_a_config_error(corpus):
    with pytest.raises(ConfigError, match=r"model.vocab_size=256: allowed: >= 257"):
        _source(corpus, vocab=256)


def test_too_few_tokens_for_one_sample_is_a_config_error(corpus):
    with pytest.raises(
        ConfigError, match=r"data.path=.*: holds \d+ tokens; allowed: at least run.seq_len \+ 1"
    ):
        _source(corpus, seq_len=100_000)


def test_a_bad_shard_directory_is_a_config_error_naming_data_path(tmp_path):
    with pytest.raises(ConfigError, match=r"data.path='.*': not a usable shard directory: .* no index.json"):
        _source(tmp_path)


@pytest.fixture
def broken(corpus, tmp_path):
    """A writable copy of the corpus and a helper to edit its index."""
    path = tmp_path / "shards"
    shutil.copytree(corpus, path)

    def edit(**changes):
        index = json.loads((path / "index.json").read_text())
        index.update(changes)
        (path / "index.json").write_text(json.dumps(index))

    return path, edit


def test_missing_index_names_the_directory(tmp_path):
    with pytest.raises(ShardFormatError, match=r"has no index.json .* incomplete"):
        open_shards(tmp_path)
    with pytest.raises(ShardFormatError, match="is not a directory"):
        open_shards(tmp_path / "nope")


def test_invalid_json_names_the_file(broken):
    path, _ = broken
    (path / "index.json").write_text("{not json")
    with pytest.raises(ShardFormatError, match=r"index.json: not readable JSON"):
        open_shards(path)


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"format": "npy"}, r"index.json: format='npy': allowed: 'token-shards'"),
        ({"version": 2}, r"index.json: version=2: allowed: 1"),
        ({"dtype": "int8"}, r"index.json: dtype='int8': allowed: uint16, uint32"),
        ({"vocab_size": 128_256}, r"index.json: dtype='uint16': allowed: uint32 \(vocab_size=128256"),
        ({"eos_id": 257}, r"index.json: eos_id=257: allowed: an integer in \[0, vocab_size=257\)"),
        ({"shards": []}, r"index.json: shards=\[\]: allowed: a non-empty list"),
        ({"shards": [{"file": "../etc/passwd", "num_tokens": 1}]}, r"shards\[0\].file='../etc/passwd'"),
        ({"num_tokens": 5}, r"index.json: num_tokens=5, but the shards hold"),
    ],
)
def test_bad_index_fields_are_named(broken, changes, message):
    path, edit = broken
    edit(**changes)
    with pytest.raises(ShardFormatError, match=message):
        open_shards(path)


def test_missing_shard_file_is_named(broken):
    path, _ = broken
    (path / "shard-00001.bin").unlink()
    with pytest.raises(
        ShardFormatError, match=r"shard-00001.bin: missing \(listed in .*index.json: shards\[1\].file\)"
    ):
        open_shards(path)


def test_size_mismatch_names_file_field_and_sizes(broken):
    path, _ = broken
    with open(path / "shard-00000.bin", "r+b") as f:
        f.truncate(999)
    with pytest.raises(
        ShardFormatError,
        match=r"shard-00000.bin: 999 bytes, but .*shards\[0\].num_tokens=500 at uint16 "
        r"\(2 bytes per token\) needs 1000",
    ):
        open_shards(path)
