"""Start-up checks: what would otherwise fail late and expensively fails first, with one line.

Run on every rank before the process group and the model are built (train.train calls run_preflight), so a
job with a bad setting ends in seconds instead of at its first save or on a GPU:

- checkpoint.dir (when saves are on): a directory this process can write. It is created when missing, and
  a probe file is written and removed; a path that is a file, or that the job user cannot write, is a
  ConfigError naming it. Without this the error came at the first save, after a whole checkpoint interval.
- data (source = "shards"): the index is valid and its vocab_size fits model.vocab_size, on every rank. On
  global rank 0 a sample of the token ids is read and compared with the index's vocab_size: up to
  SAMPLE_SHARDS_MAX shards (all of them if there are fewer; else evenly spaced, the first and last
  included), from each CHUNKS_PER_SHARD chunks of SAMPLE_CHUNK_TOKENS tokens (its start, middle and end; the
  whole shard when it is smaller): at most 1024 x 3 x 4096 = 12.6M tokens, 25-50 MB, whatever the corpus
  size. It catches a wrong tokenizer or a truncated or corrupt shard early; it cannot prove every id valid.
  That guarantee comes from the data loader, which checks the ids of every micro-batch on the CPU before
  they reach the model (data.ShardBatchSource), so an id past the embedding is never a device-side assert.
"""

from __future__ import annotations

import logging
import os
import socket
from pathlib import Path

import numpy as np

from training.config import TrainConfig
from training.data.batches import open_checked_shards
from training.data.shards import TokenShards
from training.errors import ConfigError

log = logging.getLogger(__name__)

SAMPLE_SHARDS_MAX = 1024  # shards whose ids the start-up sample reads
SAMPLE_CHUNK_TOKENS = 4096  # tokens per chunk read
CHUNKS_PER_SHARD = 3  # a shard's start, middle and end


def run_preflight(cfg: TrainConfig, *, rank: int) -> None:
    """Every start-up check, on this rank (rank 0 also samples the token ids)."""
    if cfg.checkpoint.dir:
        check_checkpoint_dir(cfg.checkpoint.dir)
    if cfg.data.source == "shards":
        shards = open_checked_shards(cfg.data, seq_len=cfg.run.seq_len, vocab_size=cfg.model.vocab_size)
        if rank == 0:
            check_token_id_sample(shards)


def check_checkpoint_dir(directory: str) -> None:
    """checkpoint.dir exists (or is created) as a directory this process can create files in."""
    path = Path(directory)
    if path.exists() and not path.is_dir():
        raise ConfigError(
            f"checkpoint.dir={directory!r}: exists and is not a directory; allowed: a directory this job can write"
        )
    probe = path / f".write-test-{socket.gethostname()}-{os.getpid()}"
    try:
        path.mkdir(parents=True, exist_ok=True)
        probe.write_bytes(b"")
        probe.unlink()
    except OSError as exc:
        where = f" ({exc.filename})" if exc.filename and str(exc.filename) != str(probe) else ""
        raise ConfigError(
            f"checkpoint.dir={directory!r}: this job (uid {os.geteuid()}) cannot write it: "
            f"{exc.strerror or exc}{where}; allowed: a directory this job can write"
        ) from None


def sample_ranges(num_tokens: int) -> list[tuple[int, int]]:
    """(start, length) of the chunks read from a shard of ``num_tokens`` tokens."""
    if num_tokens <= CHUNKS_PER_SHARD * SAMPLE_CHUNK_TOKENS:
        return [(0, num_tokens)] if num_tokens else []
    last = num_tokens - SAMPLE_CHUNK_TOKENS
    starts = [0, last // 2, last]
    return [(start, SAMPLE_CHUNK_TOKENS) for start in starts]


def sampled_shards(count: int) -> list[int]:
    """Indices of the shards the sample reads: all, or SAMPLE_SHARDS_MAX evenly spaced with both ends."""
    if count <= SAMPLE_SHARDS_MAX:
        return list(range(count))
    return sorted({round(i * (count - 1) / (SAMPLE_SHARDS_MAX - 1)) for i in range(SAMPLE_SHARDS_MAX)})


def check_token_id_sample(shards: TokenShards) -> None:
    """The sampled ids of ``shards`` are below its index's vocab_size (see the module docstring)."""
    starts = np.cumsum([0] + [s.num_tokens for s in shards.shards])
    read = 0
    for index in sampled_shards(len(shards.shards)):
        shard = shards.shards[index]
        for offset, length in sample_ranges(shard.num_tokens):
            ids = shards.read(int(starts[index]) + offset, length)
            read += length
            top = int(ids.max())
            if top >= shards.vocab_size:
                position = offset + int(np.argmax(ids))
                raise ConfigError(
                    f"data.path={str(shards.path)!r}: token id {top} at position {position} of "
                    f"{shard.file}; allowed: ids below the index's vocab_size={shards.vocab_size} (a shard "
                    "from another tokenizer, or a corrupt one?)"
                )
    log.info("preflight: %d sampled token ids of %s are below vocab_size %d", read, shards.path,
             shards.vocab_size)
