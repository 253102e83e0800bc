"""The synthetic source: a learnable task, a pure function of (seed, step, micro_step, dp_rank)."""

import math

import numpy as np
import pytest
import torch

from training.data.batches import DataConfig, SyntheticBatchSource, build_batch_source
from training.errors import ConfigError

VOCAB = 64


def _source(rank=0, world=2, micro=4, accum=2, seq_len=32, seed=7, branching=4):
    return build_batch_source(
        DataConfig(synthetic_branching=branching),
        seq_len=seq_len,
        vocab_size=VOCAB,
        seed=seed,
        dp_rank=rank,
        dp_world_size=world,
        micro_batch_size=micro,
        grad_accum_steps=accum,
    )


def test_shapes_dtypes_and_shifted_targets():
    inputs, targets = _source().get(3, 1)
    assert inputs.shape == targets.shape == (4, 32)
    assert inputs.dtype == targets.dtype == torch.int64
    assert torch.equal(inputs[:, 1:], targets[:, :-1])
    assert int(inputs.min()) >= 0 and int(targets.max()) < VOCAB


def test_a_batch_is_a_pure_function_of_seed_step_micro_step_and_rank():
    a, b = _source(), _source()  # two independent builds, as after a restart
    for step, micro_step in [(0, 0), (5, 1), (1000, 0)]:
        assert all(
            torch.equal(x, y) for x, y in zip(a.get(step, micro_step), b.get(step, micro_step), strict=True)
        )
    # asking in another order changes nothing
    later_first = b.get(5, 1)
    assert torch.equal(later_first[0], _source().get(5, 1)[0])
    assert not torch.equal(a.get(0, 0)[0], a.get(0, 1)[0])
    assert not torch.equal(a.get(0, 0)[0], _source(rank=1).get(0, 0)[0])
    assert not torch.equal(a.get(0, 0)[0], _source(seed=8).get(0, 0)[0])


def test_a_sample_does_not_depend_on_its_batch_neighbours():
    # global sample g is the same walk whether it is row 1 of a micro-batch of 2 or row 3 of one of 4:
    # with micro=2, world=1, accum=1, step 1 holds samples 2 and 3; with micro=4, step 0 holds 0..3
    small = _source(world=1, micro=2, accum=1).get(1, 0)[0]
    large = _source(world=1, micro=4, accum=1).get(0, 0)[0]
    assert torch.equal(small, large[2:])


def _true_log_probs(source: SyntheticBatchSource) -> np.ndarray:
    table = np.zeros((VOCAB, VOCAB))
    for token in range(VOCAB):
        table[token, source.successors[token]] = source.probs
    with np.errstate(divide="ignore"):
        return np.log(table)


def _pairs(source, steps):
    cur, nxt = [], []
    for step in steps:
        for micro_step in range(2):
            inputs, targets = source.get(step, micro_step)
            cur.append(inputs.numpy().ravel())
            nxt.append(targets.numpy().ravel())
    return np.concatenate(cur), np.concatenate(nxt)


def test_every_transition_follows_the_chain_and_its_entropy_is_low():
    source = _source(world=1)
    cur, nxt = _pairs(source, range(20))
    log_p = _true_log_probs(source)[cur, nxt]
    assert np.isfinite(log_p).all()  # no transition outside the table
    measured = float(-log_p.mean())
    assert measured == pytest.approx(source.entropy_rate_nats, abs=0.05)
    assert source.entropy_rate_nats <= math.log(4) + 1e-9
    assert measured < 0.35 * math.log(VOCAB)
    # each token's successors are distinct: branching really is the number of choices
    assert all(len(set(row)) == 4 for row in source.successors.tolist())


def test_the_task_is_learnable_from_its_own_batches():
    """A bigram count model fitted on training steps predicts later steps far better than chance."""
    source = _source(world=1)
    cur, nxt = _pairs(source, range(0, 30))
    counts = np.full((VOCAB, VOCAB), 0.01)
    np.add.at(counts, (cur, nxt), 1.0)
    model_log_p = np.log(counts / counts.sum(axis=1, keepdims=True))
    held_cur, held_nxt = _pairs(source, range(100, 110))
    held_out_loss = float(-model_log_p[held_cur, held_nxt].mean())
    assert held_out_loss < 0.5 * math.log(VOCAB)  # uniform guessing scores ln(64) = 4.16 nats
    assert held_out_loss < source.entropy_rate_nats + 0.3


def test_branching_one_is_deterministic():
    inputs, targets = _source(branching=1).get(0, 0)
    source = _source(branching=1)
    assert torch.equal(targets, torch.from_numpy(source.successors[inputs.numpy(), 0]))
    assert source.entropy_rate_nats == pytest.approx(0.0)


def test_dense_branching_and_its_limit():
    dense = _source(branching=40)  # more than half the vocabulary: rows are shuffles of it
    assert all(len(set(row)) == 40 for row in dense.successors.tolist())
    assert dense.entropy_rate_nats <= math.log(40)
    with pytest.raises(
        ConfigError, match=r"data.synthetic_branching=65: allowed: at most model.vocab_size=64"
    ):
        _source(branching=65)
