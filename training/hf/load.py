"""Hugging Face weights into the sharded model at a fresh start, and the shape a run builds with init.hf_dir.

The load (``load_hf_weights``) runs on the model as train.build_model leaves it: built on the meta device,
FP8-converted, wrapped with fully_shard, allocated with to_empty. Every rank asks DCP for its own FSDP2
shards only, under their Hugging Face names, and DCP's HuggingFaceStorageReader reads those row ranges
straight from the safetensors files (safetensors' get_slice): no rank reads or holds a whole tensor it does
not own, so an import fits wherever training fits. The bf16 values on disk are copied into the fp32 master
shards (the exact conversion). The FP8 modules were swapped in before sharding (torchtitan's order): torchao's
Float8Linear and Transformer Engine's Linear keep ``.weight``, so the names are the same as without FP8, and
training.checkpoint.state.model_state hands DCP the plain tensor under torchao's FP8 all-gather wrapper.

Which weights a run starts from: the init directory's only at a fresh start. A restart finds the job's own
checkpoint and loads that (train._train_in_group decides), and takes the shape from the copy of config.json
the fresh start left in ``<checkpoint.dir>/hf-init/`` (``resolve_init_model``): attempt 2 never reads the
init directory, which may be gone by then. That copy also holds the tokenizer files, for the export.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
from dataclasses import replace
from pathlib import Path

import torch.distributed as dist
import torch.distributed.checkpoint as dcp
from torch import nn
from torch.distributed.checkpoint import HuggingFaceStorageReader

from training.checkpoint.layout import write_atomic
from training.checkpoint.state import model_state
from training.config import TrainConfig
from training.config.sections import ModelConfig
from training.data.shards import ShardFormatError, open_shards
from training.errors import ConfigError
from training.hf.config import CONFIG_FILE, check_preset, model_config_from_hf, read_hf_config, same_shape
from training.hf.files import check_hf_dir
from training.hf.names import expected_shapes, to_hf

log = logging.getLogger(__name__)

INIT_COPY_DIR = "hf-init"  # under checkpoint.dir: the init directory's small files, copied at a fresh start
SOURCE_FILE = "source.json"  # in it: which directory they came from
# What a model directory holds besides its weights, copied to hf-init/ and into an export (when present)
SIDE_FILES = ("config.json", "generation_config.json", "tokenizer.json", "tokenizer_config.json",
              "special_tokens_map.json", "tokenizer.model", "chat_template.jinja")
READ_THREADS = 4  # safetensors files each rank reads at once (HuggingFaceStorageReader's thread_count)


def init_copy_dir(checkpoint_dir: str | Path) -> Path:
    return Path(checkpoint_dir) / INIT_COPY_DIR


def resolve_init_model(cfg: TrainConfig) -> TrainConfig:
    """``cfg`` with the model shape of init.hf_dir's config.json (unchanged without init.hf_dir). The job's
    own copy in checkpoint.dir wins over the directory: it is what the first start built, and a restart must
    not depend on the init directory. A [model] preset must agree (training.hf.config.check_preset)."""
    if not cfg.init.hf_dir:
        return cfg
    copy = init_copy_dir(cfg.checkpoint.dir) if cfg.checkpoint.dir else None
    source = copy if copy is not None and (copy / CONFIG_FILE).is_file() else Path(cfg.init.hf_dir)
    model = model_config_from_hf(read_hf_config(source), str(source / CONFIG_FILE), init_std=cfg.model.init_std)
    check_preset(cfg.model.preset, model, str(source / CONFIG_FILE))
    _check_data_vocab(cfg, model.vocab_size, source / CONFIG_FILE)
    return replace(cfg, model=replace(model, preset=cfg.model.preset))


def _check_data_vocab(cfg: TrainConfig, vocab_size: int, config_path: Path) -> None:
    """The shards' token ids fit the init model's vocabulary (their index records the tokenizer's vocab_size,
    an upper bound of every id: docs/data-format.md). Said here, naming config.json, rather than as the
    preflight's model.vocab_size line, which the user did not set. An unreadable index is the preflight's."""
    if cfg.data.source != "shards":
        return
    try:
        shards = open_shards(cfg.data.path)
    except (ShardFormatError, OSError):
        return
    if shards.vocab_size > vocab_size:
        raise ConfigError(
            f"data.path={cfg.data.path!r}: token ids up to {shards.vocab_size - 1} (its tokenizer's vocab_size "
            f"{shards.vocab_size}), but {config_path} has vocab_size={vocab_size}; allowed: data prepared with "
            "that model's own tokenizer.json (python -m training.data.prepare --tokenizer <init.hf_dir>/tokenizer.json)"
        )


def load_hf_weights(model: nn.Module, cfg: TrainConfig, *, rank: int) -> None:
    """Load init.hf_dir's weights into ``model`` (sharded, built with ``cfg.model``), then, on rank 0, copy its
    config and tokenizer files to ``<checkpoint.dir>/hf-init/``. Collective: every rank calls it. Bad input
    (config.json of another shape than the model's, a missing or truncated file, a tensor of the wrong shape)
    is a ConfigError on every rank, before any tensor is read."""
    hf_dir = Path(cfg.init.hf_dir)
    started = time.monotonic()
    _on_rank0_for_all(lambda: _check(hf_dir, cfg.model), rank)
    state = model_state(model)
    wanted = expected_shapes(cfg.model)  # a tied model's output.weight is tok_embeddings.weight: read once
    missing = sorted(set(wanted) - set(state))
    if missing:  # the model and the name table disagree: a bug here, not bad input
        raise RuntimeError(f"the model has no parameter {missing[0]} for the Hugging Face load")
    dcp.load({to_hf(name): state[name] for name in wanted},
             storage_reader=HuggingFaceStorageReader(str(hf_dir), thread_count=READ_THREADS))
    log.info("loaded %d tensors from init.hf_dir=%s in %.1fs (each rank its own shards)", len(wanted), hf_dir,
             time.monotonic() - started)
    if rank == 0 and cfg.checkpoint.dir:
        copy_side_files(hf_dir, init_copy_dir(cfg.checkpoint.dir), source=str(hf_dir))
    if dist.is_initialized():
        dist.barrier()  # the copy is in place before any rank can save a checkpoint a restart would find


def _check(hf_dir: Path, model_cfg: ModelConfig) -> None:
    source = str(hf_dir / CONFIG_FILE)
    on_disk = model_config_from_hf(read_hf_config(hf_dir), source, init_std=model_cfg.init_std)
    if not same_shape(on_disk, model_cfg):
        # the shape came from an hf-init/ copy an earlier run with another init directory left in checkpoint.dir
        raise ConfigError(f"{source}: describes another model than checkpoint.dir's {INIT_COPY_DIR}/{CONFIG_FILE} "
                          "(left by an earlier run with another init.hf_dir); allowed: a new checkpoint.dir")
    check_hf_dir(hf_dir, model_cfg)


def copy_side_files(src: Path, dest: Path, *, source: str) -> None:
    """Copy the directory's config and tokenizer files to ``dest`` (replaced whole: written beside it, then
    renamed), with a ``source.json`` naming where they came from."""
    partial = dest.with_name(dest.name + ".partial")
    shutil.rmtree(partial, ignore_errors=True)
    partial.mkdir(parents=True)
    for name in SIDE_FILES:
        if (src / name).is_file():
            shutil.copyfile(src / name, partial / name)
    write_atomic(partial / SOURCE_FILE, json.dumps({"hf_dir": source}) + "\n")
    shutil.rmtree(dest, ignore_errors=True)
    partial.rename(dest)


def _on_rank0_for_all(check, rank: int) -> None:
    """Run ``check`` on rank 0 and raise its ConfigError on every rank (one reading of the headers, one
    answer: the ranks never disagree about whether to load)."""
    outcome: list[object] = [None]
    if rank == 0:
        try:
            check()
        except ConfigError as exc:
            outcome[0] = exc
    if dist.is_initialized():
        dist.broadcast_object_list(outcome, src=0)
    if isinstance(outcome[0], ConfigError):
        raise outcome[0]
