"""Training batches: token shards or a synthetic task, in an order that is a pure function of the step.

Every micro-batch is a pure function of (seed, step, micro_step, dp_rank): micro-batch row ``i`` is global
sample number

    g = ((step * grad_accum_steps + micro_step) * dp_world_size + dp_rank) * micro_batch_size + i

so the ranks of one step read disjoint samples, consecutive steps continue where the last stopped, and a
resumed run needs no loader state to reproduce the exact batches. For shards, sample g is window
``permute(g mod n)`` of epoch ``g // n`` (n windows of seq_len + 1 tokens); for the synthetic source it is
a walk of a fixed random Markov chain seeded by (seed, g).

A ``Prefetcher`` runs the source on a background thread (kept on the GPU's NUMA node, see numa.py), stages
the micro-batches of the next steps in pinned memory and copies them to the GPU without blocking the host.
"""

from __future__ import annotations

import logging
import math
import queue
import threading
from dataclasses import dataclass
from typing import Protocol

import numpy as np
import torch

from training import numa
from training.config.sections import DataConfig
from training.data.shards import ShardFormatError, TokenShards, open_shards
from training.errors import ConfigError

log = logging.getLogger(__name__)

Batch = tuple[torch.Tensor, torch.Tensor]  # (inputs, targets), int64 [micro_batch_size, seq_len]


class BatchSource(Protocol):
    def get(self, step: int, micro_step: int) -> Batch:
        """Micro-batch ``micro_step`` of optimizer step ``step`` for this rank, on the CPU."""
        ...


@dataclass(frozen=True)
class SampleLayout:
    """Where a rank's micro-batches sit in the global sample sequence."""

    seq_len: int  # tokens per sample (inputs; the targets are the same window shifted by one)
    micro_batch_size: int  # samples per micro-batch
    grad_accum_steps: int  # micro-batches per optimizer step
    dp_rank: int
    dp_world_size: int

    def sample_indices(self, step: int, micro_step: int) -> np.ndarray:
        """Global sample numbers of micro-batch ``micro_step`` of ``step`` on this rank (int64)."""
        if not 0 <= micro_step < self.grad_accum_steps:
            raise ValueError(f"micro_step={micro_step}: allowed: 0 <= micro_step < {self.grad_accum_steps}")
        if step < 0:
            raise ValueError(f"step={step}: allowed: >= 0")
        first = (step * self.grad_accum_steps + micro_step) * self.dp_world_size + self.dp_rank
        return first * self.micro_batch_size + np.arange(self.micro_batch_size, dtype=np.int64)


def permute(positions: np.ndarray, n: int, *, seed: int, epoch: int, rounds: int = 6) -> np.ndarray:
    """A seeded pseudo-random permutation of ``range(n)``, evaluated at ``positions`` without building it.

    A balanced Feistel network over the smallest power-of-four domain >= n is a bijection on that domain;
    "cycle walking" (apply it again while the result is >= n) restricts it to a bijection on [0, n) (Black
    and Rogaway, "Ciphers with Arbitrary Finite Domains", 2002). Unlike ``Generator.permutation(n)`` it costs
    O(len(positions)) time and memory, so a corpus of a billion windows needs no per-epoch array per rank.
    """
    half_bits = max(1, math.ceil(math.log2(max(n, 2)) / 2))
    half_mask = np.uint64((1 << half_bits) - 1)
    keys = np.random.SeedSequence([seed, epoch, 0xFE15]).generate_state(rounds, dtype=np.uint64)

    def encrypt(x: np.ndarray) -> np.ndarray:
        left, right = x >> np.uint64(half_bits), x & half_mask
        for key in keys:
            left, right = right, left ^ (_mix64(right ^ key) & half_mask)
        return (left << np.uint64(half_bits)) | right

    out = encrypt(np.asarray(positions, dtype=np.uint64))
    outside = out >= np.uint64(n)
    while outside.any():  # expected < 4 passes: the domain is less than 4n
        out[outside] = encrypt(out[outside])
        outside = out >= np.uint64(n)
    return out.astype(np.int64)


def _mix64(z: np.ndarray) -> np.ndarray:
    """The splitmix64 finalizer (Steele, Lea and Flood, 2014): a cheap, well-mixing 64-bit hash."""
    z = (z ^ (z >> np.uint64(30))) * np.uint64(0xBF58476D1CE4E5B9)
    z = (z ^ (z >> np.uint64(27))) * np.uint64(0x94D049BB133111EB)
    return z ^ (z >> np.uint64(31))


class ShardBatchSource:
    """Samples are windows of seq_len + 1 tokens at multiples of seq_len in the shards' token stream; every
    epoch visits every window once, in an order that is reshuffled per epoch."""

    def __init__(self, shards: TokenShards, layout: SampleLayout, *, seed: int):
        self.shards = shards
        self.layout = layout
        self.seed = seed
        self.num_windows = (shards.num_tokens - 1) // layout.seq_len

    def get(self, step: int, micro_step: int) -> Batch:
        samples = self.layout.sample_indices(step, micro_step)
        epochs, positions = np.divmod(samples, self.num_windows)
        windows = np.empty_like(samples)
        for epoch in np.unique(epochs):  # one epoch, or two where a micro-batch crosses the boundary
            here = epochs == epoch
            windows[here] = permute(positions[here], self.num_windows, seed=self.seed, epoch=int(epoch))
        seq_len = self.layout.seq_len
        tokens = np.stack([self.shards.read(int(w) * seq_len, seq_len + 1) for w in windows])
        # Every id the model sees is checked on the CPU (a max over one micro-batch, microseconds): an id past
        # the embedding would otherwise be a device-side assert on the GPU, or silent garbage.
        if int(tokens.max()) >= self.shards.vocab_size:
            row = int(np.argmax(tokens.max(axis=1)))
            raise ConfigError(
                f"data.path={str(self.shards.path)!r}: token id {int(tokens[row].max())} in the window at "
                f"stream position {int(windows[row]) * seq_len}; allowed: ids below the index's "
                f"vocab_size={self.shards.vocab_size} (python -m training.data.prepare writes only those)"
            )
        return _split(tokens)

    def describe(self) -> str:
        """What the run reads, for its start-up line: the directory, its tokens and the tokenizer that made them."""
        tok = self.shards.tokenizer
        made_by = f"{tok.get('kind', 'unrecorded')}{' ' + tok['path'] if tok.get('path') else ''}"
        return (f"source shards, path {str(self.shards.path)!r}, {self.shards.num_tokens:,} tokens, tokenizer "
                f"{made_by} (vocab_size {self.shards.vocab_size}, end-of-document id {self.shards.eos_id})")


class SyntheticBatchSource:
    """A learnable task with no files: walks of a fixed random Markov chain over the vocabulary.

    Each token has ``branching`` distinct random successors; the walk moves to successor j with probability
    p_j (one Dirichlet draw shared by all tokens). Table and p are fixed by the seed. A model that learns
    the table predicts the next token with exactly H(p) <= ln(branching) nats of uncertainty, far below the
    ln(vocab_size) of an untrained model, so a falling loss shows that training works.
    """

    def __init__(self, layout: SampleLayout, *, vocab_size: int, seed: int, branching: int):
        if not 1 <= branching <= vocab_size:
            raise ConfigError(
                f"data.synthetic_branching={branching}: allowed: at most model.vocab_size={vocab_size}"
            )
        self.layout = layout
        self.vocab_size = vocab_size
        self.seed = seed
        rng = np.random.Generator(np.random.PCG64(np.random.SeedSequence([seed, 0x5A17])))
        self.successors = _distinct_successors(rng, vocab_size, branching)
        self.probs = rng.dirichlet(np.ones(branching))
        self._thresholds = np.cumsum(self.probs)[:-1]  # a uniform draw u picks successor #(u >= thresholds)

    @property
    def entropy_rate_nats(self) -> float:
        """Entropy of the next token given the current one: the loss of a model that learned the chain."""
        p = self.probs[self.probs > 0]
        return float(-(p * np.log(p)).sum())

    def get(self, step: int, micro_step: int) -> Batch:
        samples = self.layout.sample_indices(step, micro_step)
        length = self.layout.seq_len + 1
        # one generator per sample, seeded by (seed, g): a sample never depends on its batch neighbours
        draws = np.stack(
            [np.random.Generator(np.random.PCG64([self.seed, int(g)])).random(length) for g in samples],
            axis=1,
        )  # [length, batch]: each step of the walk reads one contiguous row
        choices = np.searchsorted(self._thresholds, draws, side="right")
        tokens = np.empty((length, len(samples)), dtype=np.int64)
        tokens[0] = np.minimum((draws[0] * self.vocab_size).astype(np.int64), self.vocab_size - 1)
        for t in range(1, length):  # the walk is sequential; one gather per position for the whole batch
            tokens[t] = self.successors[tokens[t - 1], choices[t]]
        return _split(tokens.T)

    def describe(self) -> str:
        """The start-up line's words: no files are read, whatever data.path a reader may expect."""
        return (f"source synthetic (no files: a Markov chain over {self.vocab_size} token ids, "
                f"{self.successors.shape[1]} successors each), no path, no tokenizer")


def _distinct_successors(rng: np.random.Generator, vocab_size: int, branching: int) -> np.ndarray:
    """[vocab_size, branching] random token ids, distinct within each row."""
    if 2 * branching > vocab_size:  # dense: shuffle every row of 0..V-1 (V <= 2 * branching, small)
        rows = np.tile(np.arange(vocab_size), (vocab_size, 1))
        return rng.permuted(rows, axis=1)[:, :branching]
    table = rng.integers(0, vocab_size, size=(vocab_size, branching))
    while True:  # sparse: redraw the few rows with a repeat (each row repeats with probability < 1/2)
        ordered = np.sort(table, axis=1)
        repeats = (ordered[:, 1:] == ordered[:, :-1]).any(axis=1)
        if not repeats.any():
            return table
        table[repeats] = rng.integers(0, vocab_size, size=(int(repeats.sum()), branching))


def open_checked_shards(cfg: DataConfig, *, seq_len: int, vocab_size: int) -> TokenShards:
    """The shard directory at data.path, opened and checked against its index and the model: the index's
    vocabulary fits model.vocab_size, and the stream holds at least one sample."""
    try:
        shards = open_shards(cfg.path)
    except ShardFormatError as exc:  # reported like any other bad setting, with the file-level detail
        raise ConfigError(f"data.path={cfg.path!r}: not a usable shard directory: {exc}") from exc
    if shards.vocab_size > vocab_size:
        raise ConfigError(
            f"model.vocab_size={vocab_size}: allowed: >= {shards.vocab_size}, the vocab_size of the "
            f"shards at data.path={cfg.path!r}"
        )
    if shards.num_tokens < seq_len + 1:
        raise ConfigError(
            f"data.path={cfg.path!r}: holds {shards.num_tokens} tokens; allowed: at least run.seq_len + 1 = "
            f"{seq_len + 1}"
        )
    return shards


def build_batch_source(
    cfg: DataConfig,
    *,
    seq_len: int,
    vocab_size: int,
    seed: int,
    dp_rank: int,
    dp_world_size: int,
    micro_batch_size: int,
    grad_accum_steps: int,
) -> ShardBatchSource | SyntheticBatchSource:
    """The batch source ``cfg`` names, for one data-parallel rank."""
    if not 0 <= dp_rank < dp_world_size:
        raise ValueError(f"dp_rank={dp_rank}: allowed: 0 <= dp_rank < dp_world_size={dp_world_size}")
    layout = SampleLayout(seq_len, micro_batch_size, grad_accum_steps, dp_rank, dp_world_size)
    if cfg.source == "synthetic":
        return SyntheticBatchSource(
            layout, vocab_size=vocab_size, seed=seed, branching=cfg.synthetic_branching
        )
    shards = open_checked_shards(cfg, seq_len=seq_len, vocab_size=vocab_size)
    return ShardBatchSource(shards, layout, seed=seed)


class Prefetcher:
    """Prepares the micro-batches of the coming steps on a background thread, in step order.

    The thread calls ``source.get(step, micro_step)`` for step ``start_step`` on, stages the tensors in
    pinned memory when the device is CUDA, and keeps at most ``depth`` steps ready. ``next_step()`` hands
    over the next step's micro-batches, copied to ``device`` with non_blocking copies (asynchronous from
    pinned memory, so the copy overlaps the GPU work queued before it). An exception in the thread is raised
    by the ``next_step()`` that would have returned its step.
    """

    def __init__(
        self,
        source: BatchSource,
        *,
        start_step: int,
        grad_accum_steps: int,
        device: torch.device | str,
        depth: int = 2,
        pin_memory: bool = True,
        numa_affinity: bool = True,
    ):
        if depth < 1:
            raise ValueError(f"depth={depth!r}: allowed: an integer >= 1")
        self.device = torch.device(device)
        self.next_step_index = start_step  # the step the next call to next_step() returns
        self._source = source
        self._grad_accum_steps = grad_accum_steps
        self._pin = pin_memory and self.device.type == "cuda" and torch.cuda.is_available()
        cpus = numa.loader_cpus_for_device(self.device) if numa_affinity else None
        self._queue: queue.Queue[tuple[int, list[Batch] | BaseException]] = queue.Queue(maxsize=depth)
        self._stop = threading.Event()
        self._failure: BaseException | None = None
        self._thread = threading.Thread(
            target=self._produce, args=(start_step, cpus), name="batch-prefetcher", daemon=True
        )
        self._thread.start()

    def _produce(self, step: int, cpus: set[int] | None) -> None:
        try:
            numa.maybe_pin_current_thread(cpus)
            while not self._stop.is_set():
                batches = [self._source.get(step, m) for m in range(self._grad_accum_steps)]
                if self._pin:
                    batches = [(x.pin_memory(), y.pin_memory()) for x, y in batches]
                if not self._put((step, batches)):
                    return
                step += 1
        except BaseException as exc:  # handed to the training thread, which decides what is fatal
            self._put((step, exc))

    def _put(self, item: tuple[int, list[Batch] | BaseException]) -> bool:
        while not self._stop.is_set():
            try:
                self._queue.put(item, timeout=0.1)
                return True
            except queue.Full:
                continue
        return False

    def next_step(self) -> list[Batch]:
        """The (inputs, targets) micro-batches of the next step, on the device."""
        if self._failure is not None:
            raise self._failure
        if self._stop.is_set():
            raise RuntimeError("Prefetcher.next_step() after close()")
        while True:
            try:
                step, item = self._queue.get(timeout=1.0)
                break
            except queue.Empty:
                if not self._thread.is_alive() and self._queue.empty():
                    raise RuntimeError("the batch loader thread ended without a result") from None
        if isinstance(item, BaseException):
            self._failure = item
            raise item
        assert step == self.next_step_index, (step, self.next_step_index)
        self.next_step_index += 1
        return [(x.to(self.device, non_blocking=True), y.to(self.device, non_blocking=True)) for x, y in item]

    def close(self) -> None:
        """Stop the loader thread and drop what it prepared; safe to call twice."""
        self._stop.set()
        while True:  # unblock a put() waiting for room
            try:
                self._queue.get_nowait()
            except queue.Empty:
                break
        self._thread.join(timeout=10.0)
        if self._thread.is_alive():
            log.warning(
                "the batch loader thread is still inside source.get() after 10 s; leaving it (daemon)"
            )

    def __enter__(self) -> Prefetcher:
        return self

    def __exit__(self, *exc_info: object) -> None:
        self.close()


def _split(tokens: np.ndarray) -> Batch:
    """Inputs are a window's first seq_len tokens; targets the same window shifted by one."""
    window = torch.from_numpy(np.ascontiguousarray(tokens, dtype=np.int64))
    return window[:, :-1].contiguous(), window[:, 1:].contiguous()

