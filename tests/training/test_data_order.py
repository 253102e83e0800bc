"""The sample order: a pure function of (seed, step, micro_step, dp_rank), disjoint across ranks."""

import numpy as np
import pytest

from training.data.batches import SampleLayout, permute


@pytest.mark.parametrize("n", [1, 2, 3, 5, 16, 17, 1000, 4099])
def test_permute_is_a_permutation_of_range_n(n):
    out = permute(np.arange(n), n, seed=3, epoch=0)
    assert sorted(out.tolist()) == list(range(n))


def test_permute_depends_on_seed_and_epoch_and_is_repeatable():
    n = 1000
    base = permute(np.arange(n), n, seed=1, epoch=0)
    assert np.array_equal(base, permute(np.arange(n), n, seed=1, epoch=0))
    assert not np.array_equal(base, permute(np.arange(n), n, seed=2, epoch=0))
    assert not np.array_equal(base, permute(np.arange(n), n, seed=1, epoch=1))
    # evaluated at a few positions it agrees with the whole permutation (no hidden state)
    assert np.array_equal(permute(np.array([999, 0, 500]), n, seed=1, epoch=0), base[[999, 0, 500]])


def test_permute_shuffles():
    n = 10_000
    out = permute(np.arange(n), n, seed=0, epoch=0)
    assert np.mean(out == np.arange(n)) < 0.01  # few fixed points
    assert abs(np.corrcoef(out, np.arange(n))[0, 1]) < 0.05  # no trend left


def test_permute_of_a_huge_domain_needs_no_array_of_it():
    n = 10**12  # a trillion windows: a materialized permutation would need 8 TB
    out = permute(np.arange(5), n, seed=0, epoch=0)
    assert out.shape == (5,) and (out >= 0).all() and (out < n).all() and len(set(out.tolist())) == 5


def _layout(rank, world=4, micro=3, accum=2):
    return SampleLayout(
        seq_len=8, micro_batch_size=micro, grad_accum_steps=accum, dp_rank=rank, dp_world_size=world
    )


def test_sample_indices_tile_the_global_sequence_without_gaps_or_overlap():
    world, micro, accum, steps = 4, 3, 2, 5
    seen = []
    for step in range(steps):
        for micro_step in range(accum):
            for rank in range(world):
                seen.extend(_layout(rank, world, micro, accum).sample_indices(step, micro_step).tolist())
    assert sorted(seen) == list(range(steps * accum * world * micro))


def test_sample_indices_formula():
    layout = _layout(rank=2, world=4, micro=3, accum=2)
    # g = ((step * accum + micro_step) * world + rank) * micro + i
    assert layout.sample_indices(5, 1).tolist() == [((5 * 2 + 1) * 4 + 2) * 3 + i for i in range(3)]


def test_sample_indices_reject_a_micro_step_outside_the_accumulation():
    with pytest.raises(ValueError, match=r"micro_step=2: allowed: 0 <= micro_step < 2"):
        _layout(0).sample_indices(0, 2)
    with pytest.raises(ValueError, match="step=-1"):
        _layout(0).sample_indices(-1, 0)
