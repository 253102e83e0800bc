"""The prefetcher: the same batches as source.get, in step order, errors surfaced, a clean close."""

import os
import threading
import time

import pytest
import torch

from training.data import batches as data_module
from training.data.batches import DataConfig, Prefetcher, build_batch_source


def _source():
    return build_batch_source(
        DataConfig(),
        seq_len=16,
        vocab_size=64,
        seed=3,
        dp_rank=1,
        dp_world_size=2,
        micro_batch_size=2,
        grad_accum_steps=3,
    )


def test_yields_exactly_what_get_gives_in_step_order_from_the_start_step():
    source = _source()
    with Prefetcher(source, start_step=5, grad_accum_steps=3, device="cpu", depth=2) as prefetcher:
        for step in range(5, 9):
            batches = prefetcher.next_step()
            assert len(batches) == 3
            for micro_step, (inputs, targets) in enumerate(batches):
                expected_inputs, expected_targets = source.get(step, micro_step)
                assert torch.equal(inputs, expected_inputs) and torch.equal(targets, expected_targets)
                assert inputs.device.type == "cpu" and not inputs.is_pinned()  # no pinning without CUDA
        assert prefetcher.next_step_index == 9


class _RecordingSource:
    """Records which steps were asked for, and on which thread and CPUs."""

    def __init__(self, fail_at_step=None):
        self.calls = []
        self.fail_at_step = fail_at_step
        self.lock = threading.Lock()

    def get(self, step, micro_step):
        if step == self.fail_at_step:
            raise OSError(f"shard read failed at step {step}")
        with self.lock:
            self.calls.append((step, micro_step, threading.current_thread().name, os.sched_getaffinity(0)))
        return torch.full((1, 4), step), torch.full((1, 4), micro_step)


def _wait_for(predicate, timeout_s=5.0):
    deadline = time.monotonic() + timeout_s
    while not predicate() and time.monotonic() < deadline:
        time.sleep(0.01)
    return predicate()


def test_prefetch_is_bounded_by_depth_and_runs_on_its_own_thread():
    source = _RecordingSource()
    prefetcher = Prefetcher(source, start_step=0, grad_accum_steps=2, device="cpu", depth=2)
    try:
        # depth 2 ready in the queue, plus the one step the thread holds while waiting for room
        assert _wait_for(lambda: len(source.calls) >= 6)
        time.sleep(0.3)
        assert {step for step, *_ in source.calls} == {0, 1, 2}
        assert {name for _, _, name, _ in source.calls} == {"batch-prefetcher"}
        first = prefetcher.next_step()
        assert [int(x[0, 0]) for x, _ in first] == [0, 0] and [int(y[0, 0]) for _, y in first] == [0, 1]
        assert _wait_for(lambda: {step for step, *_ in source.calls} == {0, 1, 2, 3})
    finally:
        prefetcher.close()
    assert not prefetcher._thread.is_alive()
    prefetcher.close()  # twice is fine
    with pytest.raises(RuntimeError, match="after close"):
        prefetcher.next_step()


def test_a_loader_exception_surfaces_in_the_caller_at_its_step():
    source = _RecordingSource(fail_at_step=2)
    with Prefetcher(source, start_step=0, grad_accum_steps=1, device="cpu", depth=4) as prefetcher:
        prefetcher.next_step()
        prefetcher.next_step()
        with pytest.raises(OSError, match="shard read failed at step 2"):
            prefetcher.next_step()
        with pytest.raises(OSError, match="shard read failed at step 2"):  # and again, not a hang
            prefetcher.next_step()


def test_the_loader_thread_pins_itself_to_the_numa_cpus_and_the_caller_stays_free(monkeypatch):
    # this machine has no GPU: the sysfs lookup (tested in test_numa.py) is replaced by its answer
    allowed = sorted(os.sched_getaffinity(0))
    node_cpus = {allowed[0]}
    monkeypatch.setattr(data_module.numa, "loader_cpus_for_device", lambda device: node_cpus)
    source = _RecordingSource()
    with Prefetcher(source, start_step=0, grad_accum_steps=1, device="cpu", depth=1) as prefetcher:
        prefetcher.next_step()
    assert {frozenset(cpus) for *_, cpus in source.calls} == {frozenset(node_cpus)}
    assert sorted(os.sched_getaffinity(0)) == allowed


def test_numa_affinity_off_does_not_look_up_or_pin(monkeypatch):
    def fail(device):
        raise AssertionError("looked up NUMA CPUs although numa_affinity=False")

    monkeypatch.setattr(data_module.numa, "loader_cpus_for_device", fail)
    source = _RecordingSource()
    with Prefetcher(
        source, start_step=0, grad_accum_steps=1, device="cpu", numa_affinity=False
    ) as prefetcher:
        prefetcher.next_step()
    assert {frozenset(cpus) for *_, cpus in source.calls} == {frozenset(os.sched_getaffinity(0))}
