"""The held-out loss (``[validation]``): the mean loss of a fixed set of held-out samples, the same ones at every
evaluation and whatever the layout, each data-parallel rank on its own part, reduced so that every rank gets the
same value.

The set is a function of the config alone (validation.path, run.seq_len and validation.windows, or
validation.batches x run.micro_batch_size), never of the layout or the number of ranks: a run resumed as HSDP
2 x 2 or TP 2 x FSDP 2 from FSDP 4, or the same job on 2 or 4 nodes, scores the same windows. They are the
held-out shards' token stream cut into windows of seq_len + 1 tokens (as training cuts its shards), the first
``windows`` in a fixed pseudo-random order (data.permute with a constant seed, so they are spread over the
whole held-out stream and are the same whatever run.seed is). Data-parallel rank r of D scores order positions
r, r + D, r + 2D, ... (the ranks of a tp group the same ones), in micro-batches of run.micro_batch_size rows
(fewer where every rank has fewer windows). Every rank runs the same number of forwards, as FSDP's gathers
need: where the windows do not divide evenly, a rank's last micro-batch is filled with padding rows (a copy of
a window, targets IGNORE_INDEX) that count nowhere, and a micro-batch of padding alone is run and dropped. The
loss is the sum over the scored windows of their mean token loss, over the number of windows scored: each
window counted once. One process with batches x micro_batch_size windows scores exactly the micro-batches it
scored before ``windows`` existed. Each rank reads its tokens once, at start-up, where a bad setting fails
before any step.

An evaluation must leave training exactly as it was (tests/training/test_validation_torchrun.py compares the
losses and the final weights, bit for bit, with a run without validation and across a resume):
- it reads no training batch: the training loader's order is a function of the step alone (training.data.batches);
- it runs in eval mode under no_grad (no gradient, no autograd state) and restores the mode after;
- the FP8 modules run outside the backend's autocast: Transformer Engine's delayed scaling updates its amax
  history in every forward under its autocast, which would change the next training step; torchao's dynamic
  scaling keeps no state. So the held-out loss of an FP8 run comes from the same weights in bf16;
- the random number generators are forked around it (torch.random.fork_rng), so nothing it might draw shifts
  the streams training draws from.
The loss is training's: cross-entropy on the full fp32 logits, or fused with the output head over
``parallel.loss_chunk_tokens`` (training.loss).
"""

from __future__ import annotations

import logging
import math
import time
from dataclasses import dataclass

import numpy as np
import torch
import torch.distributed as dist
from torch import nn
from torch.distributed.tensor import DTensor

from training.config import TrainConfig
from training.config.sections import DataConfig, ValidationConfig
from training.data.batches import Batch, permute
from training.data.shards import ShardFormatError, TokenShards, open_shards
from training.errors import ConfigError
from training.loss import IGNORE_INDEX, cross_entropy_loss
from training.parallel.tp import maybe_loss_parallel

log = logging.getLogger(__name__)

ORDER_SEED = 0x7A11D  # the held-out windows' order: a constant, so runs with other seeds see the same set


@dataclass(frozen=True)
class ValidationResult:
    """One evaluation, the same on every rank."""

    step: int  # completed optimizer steps when it ran
    loss: float  # mean token cross-entropy over the whole held-out set (nats)
    time_s: float  # wall time of the evaluation on this rank

    @property
    def perplexity(self) -> float:
        """exp(loss); inf where that overflows a float (a diverged model)."""
        return math.exp(self.loss) if self.loss < 709.0 else math.inf


def open_validation_shards(cfg: ValidationConfig, *, vocab_size: int, data: DataConfig) -> TokenShards:
    """The held-out shard directory, checked against its index, the model's vocabulary and, when training reads
    shards too, their tokenizer: a held-out loss over other token ids measures nothing."""
    try:
        shards = open_shards(cfg.path)
    except ShardFormatError as exc:
        raise ConfigError(f"validation.path={cfg.path!r}: not a usable shard directory: {exc}") from exc
    if shards.vocab_size > vocab_size:
        raise ConfigError(f"validation.path={cfg.path!r}: vocab_size={shards.vocab_size} in its index; allowed: "
                          f"at most model.vocab_size={vocab_size}")
    if data.source == "shards":
        train = open_shards(data.path)  # valid: preflight opened it before
        mismatch = _tokenizer_mismatch(shards, train)
        if mismatch:
            raise ConfigError(f"validation.path={cfg.path!r}: {mismatch}; allowed: held-out shards prepared with "
                              f"the tokenizer of data.path={data.path!r}")
    return shards


def _tokenizer_mismatch(held_out: TokenShards, train: TokenShards) -> str:
    """What differs between the two indexes' tokenizers ("" when nothing does): vocab_size, eos_id and, where
    both recorded one, the tokenizer.json's sha256 and kind."""
    if held_out.vocab_size != train.vocab_size:
        return f"vocab_size={held_out.vocab_size}, but the training shards' is {train.vocab_size}"
    if held_out.eos_id != train.eos_id:
        return f"eos_id={held_out.eos_id}, but the training shards' is {train.eos_id}"
    for key in ("kind", "sha256"):
        a, b = held_out.tokenizer.get(key), train.tokenizer.get(key)
        if a is not None and b is not None and a != b:
            return f"tokenizer {key}={a!r}, but the training shards' is {b!r}"
    return ""


class Validator:
    """This rank's part of the held-out set, read once, and the evaluation over it.

    ``rank`` and ``world_size`` are data-parallel (which windows this rank reads: the ranks of a tp group read
    the same); ``gather_size``: the ranks of the default group the losses are gathered over (default
    ``world_size``). Each data-parallel rank's sum and count then come tp times, so their ratio is still the
    mean over the set. ``loss_parallel``: the logits are vocabulary-sharded (tp > 1)."""

    def __init__(self, cfg: ValidationConfig, shards: TokenShards, *, seq_len: int, micro_batch_size: int,
                 rank: int, world_size: int, loss_chunk_tokens: int = 0, gather_size: int | None = None,
                 loss_parallel: bool = False):
        self.cfg = cfg
        self.gather_size = world_size if gather_size is None else gather_size
        self.loss_chunk_tokens = loss_chunk_tokens
        self.loss_parallel = loss_parallel
        available = (shards.num_tokens - 1) // seq_len
        self.windows = cfg.num_windows(micro_batch_size)  # in the whole set, on every rank together
        if self.windows > available:
            raise ConfigError(_too_few(cfg, micro_batch_size, self.windows, seq_len, available))
        order = permute(np.arange(self.windows, dtype=np.int64), available, seed=ORDER_SEED, epoch=0)
        mine = order[rank::world_size]  # order positions rank, rank + world_size, ...
        per_rank = -(-self.windows // world_size)  # the most any rank scores
        rows = min(micro_batch_size, per_rank)  # every rank's micro-batches have this shape
        padding = int(mine[0] if len(mine) else order[0])  # a rank with no window of its own runs this one
        self.batches: list[Batch] = []
        self.scored: list[int] = []  # per micro-batch: its rows that are windows of the set; the rest are padding
        self.scored_windows = [int(w) for w in mine]  # the held-out stream's windows this rank scores, in order
        for b in range(-(-per_rank // rows)):
            windows = [int(w) for w in mine[b * rows:(b + 1) * rows]]
            filled = windows + [padding] * (rows - len(windows))
            tokens = np.stack([shards.read(w * seq_len, seq_len + 1) for w in filled])
            if int(tokens.max()) >= shards.vocab_size:  # an id past the embedding: a device assert on a GPU
                raise ConfigError(
                    f"validation.path={cfg.path!r}: token id {int(tokens.max())} in batch {b}; allowed: ids "
                    f"below the index's vocab_size={shards.vocab_size}"
                )
            window = torch.from_numpy(tokens)
            targets = window[:, 1:].clone()
            targets[len(windows):] = IGNORE_INDEX  # padding rows count nowhere (F.cross_entropy's ignore_index)
            self.batches.append((window[:, :-1].contiguous(), targets))
            self.scored.append(len(windows))

    def due(self, done: int, total_steps: int) -> bool:
        """Whether to evaluate after ``done`` completed steps: every interval_steps, and after the last."""
        return done % self.cfg.interval_steps == 0 or done == total_steps

    def evaluate(self, model: nn.Module, *, step: int, device: torch.device) -> ValidationResult:
        """The mean loss over the whole set with the current weights. Collective: every rank calls it."""
        started = time.perf_counter()
        was_training = model.training
        total = torch.zeros((), dtype=torch.float64, device=device)  # sum over this rank's windows of their mean
        devices = [device.index or 0] if device.type == "cuda" else []
        with torch.random.fork_rng(devices=devices, device_type=device.type if devices else None), torch.no_grad():
            model.eval()
            try:
                for (inputs, targets), scored in zip(self.batches, self.scored, strict=True):
                    loss = self._loss(model, inputs.to(device), targets.to(device))  # collective: every rank runs it
                    if scored:  # the mean over the scored rows' tokens (all windows hold seq_len of them)
                        total += loss.double() * scored
            finally:
                model.train(was_training)
        # Every rank gathers the same per-rank (sum, windows) pairs and adds them exactly (fsum), so all ranks
        # hold the same bits; a tp group's ranks add theirs tp times to both, which leaves the ratio as it is.
        scored = torch.tensor(float(sum(self.scored)), dtype=torch.float64, device=device)
        pairs = _gather(torch.stack([total, scored]), self.gather_size)
        loss = math.fsum(s for s, _ in pairs) / math.fsum(n for _, n in pairs)
        result = ValidationResult(step=step, loss=loss, time_s=time.perf_counter() - started)
        log.info("validation after step %d: loss %r, perplexity %.4f (%.2f s)", step, result.loss,
                 result.perplexity, result.time_s)
        return result

    def _loss(self, model: nn.Module, inputs: torch.Tensor, targets: torch.Tensor) -> torch.Tensor:
        # training's loss (step.forward_backward), without the FP8 autocast: see the module docstring
        if self.loss_chunk_tokens > 0:
            return model(inputs, targets, loss_chunk_tokens=self.loss_chunk_tokens)
        with maybe_loss_parallel(self.loss_parallel):
            loss = cross_entropy_loss(model(inputs), targets)
        return loss.to_local() if isinstance(loss, DTensor) else loss


def _too_few(cfg: ValidationConfig, micro_batch_size: int, windows: int, seq_len: int, available: int) -> str:
    if cfg.windows:
        setting, needs, most = f"validation.windows={cfg.windows}", f"{windows}", available
    else:
        setting = f"validation.batches={cfg.batches}"
        needs = f"{cfg.batches} x run.micro_batch_size {micro_batch_size} = {windows}"
        most = available // micro_batch_size
    return (f"{setting}: needs {needs} windows of run.seq_len + 1 = {seq_len + 1} tokens; validation.path="
            f"{cfg.path!r} holds {available}; allowed: at most {most}")


def _gather(local: torch.Tensor, world_size: int) -> list[list[float]]:
    if world_size > 1 and dist.is_available() and dist.is_initialized():
        gathered = [torch.empty_like(local) for _ in range(world_size)]
        dist.all_gather(gathered, local)
        return [t.tolist() for t in gathered]
    return [local.tolist()]


def build_validator(cfg: TrainConfig, *, rank: int, world_size: int, gather_size: int | None = None,
                    loss_parallel: bool = False) -> Validator | None:
    """The Validator for a TrainConfig ``cfg`` on this rank (``rank`` of ``world_size`` data-parallel ranks;
    the Validator's other arguments as there); None without a validation.path. Collective: a
    ConfigError on any rank (a bad token id in its part, a path missing on its node) is raised on every rank,
    so none is left waiting in the next collective until its timeout."""
    if not cfg.validation.enabled:
        return None
    validator, error = None, None
    try:
        shards = open_validation_shards(cfg.validation, vocab_size=cfg.model.vocab_size, data=cfg.data)
        validator = Validator(cfg.validation, shards, seq_len=cfg.run.seq_len,
                              micro_batch_size=cfg.run.micro_batch_size, rank=rank, world_size=world_size,
                              loss_chunk_tokens=cfg.parallel.loss_chunk_tokens, gather_size=gather_size,
                              loss_parallel=loss_parallel)
    except ConfigError as exc:
        error = str(exc)
    errors: list[str | None] = [error]
    ranks = world_size if gather_size is None else gather_size
    if ranks > 1 and dist.is_available() and dist.is_initialized():
        errors = [None] * ranks
        dist.all_gather_object(errors, error)
    first = next((e for e in errors if e), None)
    if first is not None:
        raise ConfigError(first)
    return validator
