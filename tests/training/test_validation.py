"""The held-out loss ([validation], training/validation.py) in one process: its settings, the held-out set each
rank reads, and an evaluation that repeats exactly and leaves the model and the random streams as they were.
The 2-rank runs (every rank's value, training unchanged, a bit-exact resume) are in test_validation_torchrun.py."""

from __future__ import annotations

import io
import json
import math

import numpy as np
import pytest
import torch
from torch.distributed.tensor import DTensor

from training.config import load_config
from training.config.parallel import ParallelConfig
from training.config.sections import DataConfig, Fp8Config, ModelConfig, ValidationConfig
from training.data.shards import ShardWriter
from training.errors import ConfigError
from training.fp8 import build_fp8_backend
from training.loss import IGNORE_INDEX, cross_entropy_loss
from training.metrics import MetricsConfig, MetricsLogger, ThroughputModel
from training.train import build_model
from training.validation import ValidationResult, Validator, build_validator, open_validation_shards

pytestmark = pytest.mark.usefixtures("one_torch_thread")

BYTE_TOKENIZER = {"kind": "byte", "vocab_size": 257, "eos_id": 256}


def write_shards(path, tokens, *, vocab_size=257, eos_id=256, tokenizer=BYTE_TOKENIZER):
    path.mkdir(exist_ok=True)
    writer = ShardWriter(path, vocab_size=vocab_size, eos_id=eos_id, tokenizer=tokenizer, shard_size_tokens=300)
    writer.add_document(tokens)
    writer.finish()
    return path


@pytest.fixture(scope="module")
def held_out(tmp_path_factory):
    """1001 tokens whose value at stream position p is p % 251: 31 windows of 32 + 1 tokens."""
    return write_shards(tmp_path_factory.mktemp("held-out"), np.arange(1000) % 251)


# ----- settings ---------------------------------------------------------------------------------------------
def test_validation_is_off_by_default_and_on_with_a_path_an_interval_and_a_size(held_out):
    assert not load_config(None).validation.enabled
    cfg = load_config(None, [f"validation.path={held_out}", "validation.interval_steps=50",
                             "validation.windows=12"])
    assert cfg.validation == ValidationConfig(path=str(held_out), interval_steps=50, windows=12)
    assert cfg.validation.enabled and cfg.to_dict()["validation"]["windows"] == 12
    assert cfg.validation.num_windows(micro_batch_size=4) == 12  # the micro-batch does not size the set
    # the older spelling stays valid (a job submitted with it keeps running): batches x run.micro_batch_size
    older = load_config(None, [f"validation.path={held_out}", "validation.interval_steps=50",
                               "validation.batches=4"]).validation
    assert older.windows == 0 and older.num_windows(micro_batch_size=3) == 12


@pytest.mark.parametrize(("overrides", "message"), [
    (["validation.path=/fsx/data/held-out", "validation.windows=4"],
     "validation.interval_steps=0: allowed: an integer >= 1 (with validation.path set)"),
    (["validation.path=/fsx/data/held-out", "validation.interval_steps=-5", "validation.windows=4"],
     "validation.interval_steps=-5: allowed: an integer >= 1 (with validation.path set)"),
    (["validation.path=/fsx/data/held-out", "validation.interval_steps=50"],
     "validation.windows=0, validation.batches=0: allowed: one of them >= 1 (with validation.path set), the "
     "other 0"),
    (["validation.path=/fsx/data/held-out", "validation.interval_steps=50", "validation.windows=8",
      "validation.batches=2"],
     "validation.windows=8, validation.batches=2: allowed: one of them >= 1 (with validation.path set), the "
     "other 0"),
    (["validation.path=/fsx/data/held-out", "validation.interval_steps=50", "validation.windows=-3"],
     "validation.windows=-3: allowed: an integer >= 1 (with validation.path set), or 0"),
    (["validation.interval_steps=50"],
     "validation.path='': allowed: a held-out shard directory (with index.json) when validation.interval_steps "
     "is set (50)"),
    (["validation.windows=16"],
     "validation.path='': allowed: a held-out shard directory (with index.json) when validation.windows is set "
     "(16)"),
    (["validation.batches=2.5"], "validation.batches=2.5: allowed: an integer"),
    (["validation.every=5"],
     "validation.every: unknown key; allowed: path, interval_steps, windows, batches, at_start"),
])
def test_bad_settings_are_one_line_naming_the_field(overrides, message):
    # load_config is what clusterctl submit runs offline, without torch: these fail before anything is sent
    with pytest.raises(ConfigError) as caught:
        load_config(None, overrides)
    assert str(caught.value) == message


# ----- the held-out set -------------------------------------------------------------------------------------
def validator(path, *, rank=0, world_size=2, windows=6, batches=0, micro_batch_size=2, seq_len=32,
              loss_chunk_tokens=0):
    """Data-parallel rank ``rank`` of ``world_size``, in this one process: it gathers over itself alone."""
    cfg = ValidationConfig(path=str(path), interval_steps=10, windows=0 if batches else windows, batches=batches)
    shards = open_validation_shards(cfg, vocab_size=320, data=DataConfig())
    return Validator(cfg, shards, seq_len=seq_len, micro_batch_size=micro_batch_size, rank=rank,
                     world_size=world_size, loss_chunk_tokens=loss_chunk_tokens, gather_size=1)


def window_number(row: torch.Tensor, seq_len=32) -> int:
    """The stream window a row holds: the token at position p < 1000 is p % 251, so a window's first token
    names it (32 w mod 251 differs for every w < 251)."""
    (window,) = [w for w in range(31) if w * seq_len % 251 == int(row[0])]
    assert np.array_equal(row.numpy(), np.arange(window * seq_len, (window + 1) * seq_len) % 251)
    return window


def scored_windows(v: Validator) -> list[int]:
    """The windows a validator scores, batch by batch: the rows whose targets count; the others are padding
    (IGNORE_INDEX targets throughout) and hold a window of the set."""
    found = []
    for (inputs, targets), scored in zip(v.batches, v.scored, strict=True):
        assert inputs.shape == targets.shape
        for i, row in enumerate(inputs):
            window = window_number(row)
            if i < scored:
                assert torch.equal(row[1:], targets[i, :-1]) and int(targets[i, -1]) == (window + 1) * 32 % 251
                found.append(window)
            else:
                assert bool((targets[i] == IGNORE_INDEX).all())
    assert found == v.scored_windows
    return found


def test_the_ranks_read_disjoint_parts_of_one_fixed_set_spread_over_the_stream(held_out):
    rank0, rank1 = validator(held_out, rank=0, windows=12), validator(held_out, rank=1, windows=12)
    assert len(rank0.batches) == 3 and rank0.batches[0][0].shape == (2, 32) and rank0.scored == [2, 2, 2]
    a, b = scored_windows(rank0), scored_windows(rank1)
    assert len(set(a)) == len(set(b)) == 6 and not set(a) & set(b)
    assert scored_windows(validator(held_out, rank=0, windows=12)) == a  # built again: the same windows
    assert max(a + b) > 12  # not just the stream's first 12 windows: spread over all 31
    # one rank alone reads the same set as the two together
    assert sorted(scored_windows(validator(held_out, world_size=1, windows=12))) == sorted(a + b)


@pytest.mark.parametrize("micro_batch_size", [1, 2, 4])
def test_the_set_is_the_same_windows_whatever_the_ranks_each_scored_once(held_out, micro_batch_size):
    # 13 windows divide over none of 2-5 ranks: the ranks short of a window pad their last micro-batch (or run
    # one of padding alone) so that every rank runs as many forwards of one shape, as FSDP's gathers need
    alone = scored_windows(validator(held_out, world_size=1, windows=13, micro_batch_size=micro_batch_size))
    assert len(set(alone)) == 13
    for world_size in (2, 3, 4, 5, 16):
        ranks = [validator(held_out, rank=r, world_size=world_size, windows=13, micro_batch_size=micro_batch_size)
                 for r in range(world_size)]
        scored = [w for v in ranks for w in scored_windows(v)]
        assert sorted(scored) == sorted(alone), world_size  # the same windows, none twice, none left out
        assert len({(len(v.batches), v.batches[0][0].shape) for v in ranks}) == 1, world_size
        assert sum(sum(v.scored) for v in ranks) == 13
    assert [v.scored for v in (validator(held_out, rank=r, world_size=16, windows=13) for r in (12, 13))] == [
        [1], [0]]  # more ranks than windows: rank 13 runs one forward of padding alone and scores nothing


def test_batches_is_the_set_one_rank_scored_before_windows(held_out):
    # validation.batches=3 at micro-batch 2: the 6 windows one process scored, in the same micro-batches
    older = validator(held_out, world_size=1, batches=3)
    assert scored_windows(older) == scored_windows(validator(held_out, world_size=1, windows=6))
    assert [len(x) for x, _ in older.batches] == [2, 2, 2]
    # on 2 ranks the set no longer doubles: 3 x 2 windows in all, not 3 x 2 x 2
    two = [validator(held_out, rank=r, world_size=2, batches=3) for r in (0, 1)]
    assert sorted(w for v in two for w in scored_windows(v)) == sorted(scored_windows(older))


def test_a_set_larger_than_the_held_out_stream_names_its_setting(held_out):
    with pytest.raises(ConfigError) as caught:
        validator(held_out, windows=32)
    assert str(caught.value) == (
        f"validation.windows=32: needs 32 windows of run.seq_len + 1 = 33 tokens; validation.path="
        f"{str(held_out)!r} holds 31; allowed: at most 31")
    with pytest.raises(ConfigError) as caught:
        validator(held_out, batches=16)
    assert str(caught.value) == (
        f"validation.batches=16: needs 16 x run.micro_batch_size 2 = 32 windows of run.seq_len + 1 = 33 tokens; "
        f"validation.path={str(held_out)!r} holds 31; allowed: at most 15")


def test_held_out_shards_that_do_not_fit_the_model_or_the_training_data(held_out, tmp_path):
    cfg = ValidationConfig(path=str(tmp_path / "missing"), interval_steps=10, windows=1)
    with pytest.raises(ConfigError, match=r"^validation.path='.*missing': not a usable shard directory: .*is not "
                                          r"a directory"):
        open_validation_shards(cfg, vocab_size=320, data=DataConfig())
    cfg = ValidationConfig(path=str(held_out), interval_steps=10, windows=1)
    with pytest.raises(ConfigError) as caught:
        open_validation_shards(cfg, vocab_size=256, data=DataConfig())
    assert str(caught.value) == (f"validation.path={str(held_out)!r}: vocab_size=257 in its index; allowed: at "
                                 "most model.vocab_size=256")
    other = {"kind": "tokenizer.json", "sha256": "ab" * 32, "vocab_size": 300, "eos_id": 0}
    train = write_shards(tmp_path / "train-300", np.arange(500) % 300, vocab_size=300, eos_id=0, tokenizer=other)
    with pytest.raises(ConfigError) as caught:
        open_validation_shards(cfg, vocab_size=320, data=DataConfig(source="shards", path=str(train)))
    assert str(caught.value) == (
        f"validation.path={str(held_out)!r}: vocab_size=257, but the training shards' is 300; allowed: held-out "
        f"shards prepared with the tokenizer of data.path={str(train)!r}")
    same_size = write_shards(tmp_path / "train-257", np.arange(500) % 251,
                             tokenizer={**other, "vocab_size": 257, "eos_id": 256})
    with pytest.raises(ConfigError, match="tokenizer kind='byte', but the training shards' is 'tokenizer.json'"):
        open_validation_shards(cfg, vocab_size=320, data=DataConfig(source="shards", path=str(same_size)))
    byte_train = write_shards(tmp_path / "train-bytes", np.arange(500) % 251)
    assert open_validation_shards(cfg, vocab_size=320, data=DataConfig(source="shards", path=str(byte_train)))


def test_build_validator_is_none_without_a_path_and_raises_a_rank_s_error(held_out):
    assert build_validator(load_config(None), rank=0, world_size=1) is None
    cfg = load_config(None, [f"validation.path={held_out}", "validation.interval_steps=5",
                             "validation.windows=99"])
    with pytest.raises(ConfigError, match=r"^validation.windows=99: needs"):
        build_validator(cfg, rank=0, world_size=1)


# ----- an evaluation ----------------------------------------------------------------------------------------
TINY = ModelConfig(**{"dim": 64, "n_layers": 2, "n_heads": 4, "n_kv_heads": 2, "ffn_dim": 192, "vocab_size": 320})


@pytest.fixture(scope="module")
def model(dist_info):
    return build_model(TINY, ParallelConfig(), build_fp8_backend(Fp8Config()), dist_info, seed=3)


def local(tensor: torch.Tensor) -> torch.Tensor:
    return tensor.to_local() if isinstance(tensor, DTensor) else tensor


def test_an_evaluation_repeats_exactly_and_changes_nothing(model, held_out, dist_info):
    v = validator(held_out, world_size=1, windows=8)
    before = {k: local(t).clone() for k, t in model.state_dict().items()}
    torch.manual_seed(1234)
    rng = torch.get_rng_state()
    first = v.evaluate(model, step=10, device=dist_info.device)
    assert torch.equal(torch.get_rng_state(), rng)  # the training streams are where they were
    second = v.evaluate(model, step=20, device=dist_info.device)
    assert first.loss == second.loss and (first.step, second.step) == (10, 20)
    assert model.training  # back in train mode
    assert all(p.grad is None for p in model.parameters())
    for key, tensor in model.state_dict().items():
        assert torch.equal(local(tensor), before[key]), key
    # training's loss, batch by batch: cross-entropy on the full logits, the mean of the batch means
    with torch.no_grad():
        expected = [float(cross_entropy_loss(model(x), y)) for x, y in v.batches]
    assert first.loss == pytest.approx(sum(expected) / 4, rel=1e-6)
    assert math.log(320) - 1 < first.loss < math.log(320) + 1  # an untrained model: about ln(vocab)
    assert first.perplexity == pytest.approx(math.exp(first.loss))


def test_the_fused_loss_gives_the_same_held_out_loss(model, held_out, dist_info):
    full = validator(held_out, world_size=1, windows=4)
    fused = validator(held_out, world_size=1, windows=4, loss_chunk_tokens=24)
    a = full.evaluate(model, step=1, device=dist_info.device)
    b = fused.evaluate(model, step=1, device=dist_info.device)
    assert b.loss == pytest.approx(a.loss, rel=1e-6)


@pytest.mark.parametrize("loss_chunk_tokens", [0, 24])
def test_padding_counts_nowhere_the_loss_is_the_mean_over_the_windows(model, held_out, dist_info,
                                                                      loss_chunk_tokens):
    # 7 windows on 3 ranks, micro-batch 2: rank 0 scores 2 + 1 (a padding row), ranks 1 and 2 score 2 and then
    # run a micro-batch of padding alone. Each rank's value is its own mean (it gathers over itself here): the
    # ranks' sums together are the mean over the 7 windows, each counted once, the full set's in one process
    ranks = [validator(held_out, rank=r, world_size=3, windows=7, loss_chunk_tokens=loss_chunk_tokens)
             for r in range(3)]
    assert [v.scored for v in ranks] == [[2, 1], [2, 0], [2, 0]]
    together = sum(v.evaluate(model, step=1, device=dist_info.device).loss * sum(v.scored) for v in ranks) / 7
    with torch.no_grad():
        per_window = [float(cross_entropy_loss(model(x[i:i + 1]), y[i:i + 1]))
                      for v in ranks for (x, y), scored in zip(v.batches, v.scored, strict=True)
                      for i in range(scored)]
    assert len(per_window) == 7
    assert together == pytest.approx(sum(per_window) / 7, rel=1e-6)
    alone = validator(held_out, world_size=1, windows=7, micro_batch_size=4, loss_chunk_tokens=loss_chunk_tokens)
    assert together == pytest.approx(alone.evaluate(model, step=1, device=dist_info.device).loss, rel=1e-6)


def test_due_every_interval_and_after_the_last_step(held_out):
    v = validator(held_out)  # interval_steps=10
    assert [s for s in range(1, 36) if v.due(s, 35)] == [10, 20, 30, 35]


# ----- the step record --------------------------------------------------------------------------------------
def test_the_step_record_carries_the_held_out_loss_only_where_it_was_evaluated():
    out, err = io.StringIO(), io.StringIO()
    model = ThroughputModel(tokens_per_step=512, world_size=1, flops_per_token=1e6, peak_tflops_per_gpu=None)
    metrics = MetricsLogger(MetricsConfig(nvml=False, emf="off"), rank=0, world_size=1, device=torch.device("cpu"),
                            model=model, stdout=out, stderr=err)
    common = {"total_steps": 100, "loss": torch.tensor(2.5), "lr": 1e-4, "grad_norm": torch.tensor(1.0),
              "step_time_s": 0.5}
    metrics.log_step(step=9, **common)
    metrics.log_step(step=10, validation=ValidationResult(step=10, loss=2.0, time_s=0.25), **common)
    metrics.log_step(step=11, validation=ValidationResult(step=11, loss=1000.0, time_s=0.25), **common)
    plain, evaluated, diverged = [json.loads(line) for line in out.getvalue().splitlines()]
    assert "val_loss" not in plain and "val_perplexity" not in plain
    assert evaluated["val_loss"] == 2.0 and evaluated["val_perplexity"] == pytest.approx(math.exp(2.0))
    assert evaluated["val_time_s"] == 0.25
    assert diverged["val_loss"] == 1000.0 and diverged["val_perplexity"] is None  # inf: strict JSON has none
    progress = err.getvalue().splitlines()
    assert "val_loss" not in progress[0] and progress[1].endswith("val_loss 2.0000 (perplexity 7.39)")


def test_the_baseline_before_the_first_step_is_a_step_0_record_and_emf():
    out, err = io.StringIO(), io.StringIO()
    model = ThroughputModel(tokens_per_step=512, world_size=1, flops_per_token=1e6, peak_tflops_per_gpu=None)
    metrics = MetricsLogger(MetricsConfig(nvml=False, emf="on"), rank=0, world_size=1, device=torch.device("cpu"),
                            model=model, stdout=out, stderr=err)
    record = metrics.log_validation(ValidationResult(step=0, loss=2.0, time_s=0.25), total_steps=100)
    assert json.loads(out.getvalue()) == record == {"event": "validation", "step": 0, "val_loss": 2.0,
                                                   "val_perplexity": pytest.approx(math.exp(2.0)), "val_time_s": 0.25}
    progress, emf = err.getvalue().splitlines()
    assert progress == "step 0/100 val_loss 2.0000 (perplexity 7.39), before the first step"
    emf = json.loads(emf)
    assert {m["Name"] for m in emf["_aws"]["CloudWatchMetrics"][0]["Metrics"]} == {
        "Step", "RunSteps", "ValidationLoss", "ValidationPerplexity"}
    assert (emf["Step"], emf["ValidationLoss"]) == (0.0, 2.0)
