"""A checkpoint of the durable tier -> a Hugging Face model directory that transformers and vLLM load.

What is written into the output directory:

    model-00001-of-0000N.safetensors ...   bf16 weights under Hugging Face's names, at most max_shard_bytes each
    model.safetensors.index.json           which file holds which tensor (written last)
    config.json, generation_config.json    the init directory's, with the shape and dtype set; else made here
    tokenizer.json, tokenizer_config.json, special_tokens_map.json, ...   copied from the init directory; for a
                                           run without one, the tokenizer its data was prepared with
                                           (training.hf.tokenizer_files)

The checkpoint is never loaded whole: DCP's metadata says every tensor's shape, and the weights are read one
group at a time (at most CHUNK_BYTES of fp32) with dcp.load on a partial state dict, converted to bf16 and
collected into one output file, which is written before the next is begun. Peak memory is about one output
file plus one chunk, whatever the model's size; no process group, no GPU. The init directory's files come
from ``<checkpoint.dir>/hf-init/`` (copied there at the run's fresh start), else from the init.hf_dir the
checkpoint's train_state.json records, when it still exists.
"""

from __future__ import annotations

import json
import logging
import shutil
import time
import warnings
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import torch
import torch.distributed.checkpoint as dcp
from safetensors.torch import save_file
from torch.distributed.checkpoint import FileSystemReader

from training.checkpoint.layout import MARKER_FILE, find_latest_complete, is_complete, step_dir
from training.config.sections import ModelConfig
from training.errors import ConfigError
from training.hf.config import CONFIG_FILE, hf_config, read_hf_config
from training.hf.files import INDEX_FILE
from training.hf.load import INIT_COPY_DIR, SIDE_FILES
from training.hf.names import expected_shapes, to_hf
from training.hf.tokenizer_files import write_run_tokenizer

log = logging.getLogger(__name__)

DEFAULT_MAX_SHARD_BYTES = 5 << 30  # Meta's published Llama 3 shards are about 5 GB each
CHUNK_BYTES = 1 << 30  # fp32 read from the checkpoint at once
GENERATION_FILE = "generation_config.json"
MODEL_PREFIX = "model."  # the checkpoint's model entries: training.checkpoint.state.build_state's "model" key


@dataclass(frozen=True)
class ExportResult:
    step: int
    out_dir: Path
    files: int  # safetensors files written
    bytes_written: int  # of tensor data
    seconds: float


def find_step(checkpoint: str | Path, step: int | None = None) -> Path:
    """The complete checkpoint to export: ``checkpoint`` is a job's checkpoint directory (with ``step``, or the
    newest complete step when None) or a step-<N> directory itself."""
    path = Path(checkpoint)
    if is_complete(path) and step is None:
        return path
    if step is not None:
        chosen = step_dir(path, step)
        if not is_complete(chosen):
            raise ConfigError(f"--step={step}: {chosen} is not a complete checkpoint (needs .metadata and "
                              f"{MARKER_FILE}); allowed: a complete step under {path}")
        return chosen
    latest = find_latest_complete(path) if path.is_dir() else None
    if latest is None:
        raise ConfigError(f"--checkpoint={str(checkpoint)!r}: no complete checkpoint there; allowed: a job's "
                          "checkpoint directory (step-<N>/ inside) or a complete step-<N> directory")
    return latest


def export_checkpoint(checkpoint: str | Path, out_dir: str | Path, *, step: int | None = None,
                      max_shard_bytes: int = DEFAULT_MAX_SHARD_BYTES) -> ExportResult:
    """Write the Hugging Face directory of one complete checkpoint (see the module docstring)."""
    started = time.monotonic()
    source = find_step(checkpoint, step)
    marker = json.loads((source / MARKER_FILE).read_text())
    config = marker.get("config", {})
    known = {f.name for f in fields(ModelConfig)}
    model_cfg = ModelConfig(**{k: v for k, v in config.get("model", {}).items() if k in known})
    reader = FileSystemReader(str(source))
    stored = reader.read_metadata().state_dict_metadata
    shapes = expected_shapes(model_cfg)
    for name, shape in shapes.items():
        entry = stored.get(MODEL_PREFIX + name)
        if entry is None or tuple(getattr(entry, "size", ())) != shape:
            found = "absent" if entry is None else f"of shape {list(entry.size)}"
            raise ConfigError(f"{source}: model entry {name} is {found}; its train_state.json's model implies "
                              f"{list(shape)}")
    out = Path(out_dir)
    out.mkdir(parents=True, exist_ok=True)
    (out / INDEX_FILE).unlink(missing_ok=True)  # the index marks a whole export: written again last
    groups = _shard_groups(shapes, max_shard_bytes)
    weight_map: dict[str, str] = {}
    total = 0
    for number, group in enumerate(groups, start=1):
        file_name = f"model-{number:05d}-of-{len(groups):05d}.safetensors"
        tensors: dict[str, torch.Tensor] = {}
        for chunk in _chunks(group, shapes, stored):
            part = {MODEL_PREFIX + name: torch.empty(shapes[name], dtype=stored[MODEL_PREFIX + name].properties.dtype)
                    for name in chunk}
            with warnings.catch_warnings():  # DCP warns that it loads without a process group, as asked
                warnings.simplefilter("ignore", UserWarning)
                dcp.load(part, storage_reader=FileSystemReader(str(source)), no_dist=True)
            for name in chunk:
                tensors[to_hf(name)] = part.pop(MODEL_PREFIX + name).to(torch.bfloat16).contiguous()
        save_file(tensors, str(out / file_name), metadata={"format": "pt"})
        total += sum(t.numel() * t.element_size() for t in tensors.values())
        weight_map.update(dict.fromkeys(tensors, file_name))
        del tensors
    init_dir = _init_files_dir(source, config)
    _write_side_files(out, model_cfg, init_dir)
    tokenizer_note = ""
    if init_dir is None:
        seq_len = config.get("run", {}).get("seq_len")
        written = write_run_tokenizer(out, config.get("data", {}),
                                      max_length=seq_len if isinstance(seq_len, int) else None)
        tokenizer_note = f"; tokenizer: {written}"
    index = {"metadata": {"total_size": total}, "weight_map": weight_map}
    (out / INDEX_FILE).write_text(json.dumps(index, indent=2) + "\n")
    result = ExportResult(step=int(marker["step"]), out_dir=out, files=len(groups), bytes_written=total,
                          seconds=time.monotonic() - started)
    log.info("exported step %d of %s to %s: %d file(s), %.2f GB of bf16 weights, %.1fs%s", result.step, source,
             out, result.files, total / 1e9, result.seconds,
             f"; config and tokenizer from {init_dir}" if init_dir else tokenizer_note)
    return result


def _shard_groups(shapes: dict[str, tuple[int, ...]], max_shard_bytes: int) -> list[list[str]]:
    """Consecutive tensors (the model's order) packed into files of at most max_shard_bytes of bf16 (a
    tensor larger than that gets a file of its own)."""
    groups: list[list[str]] = [[]]
    size = 0
    for name, shape in shapes.items():
        nbytes = 2 * _numel(shape)
        if groups[-1] and size + nbytes > max_shard_bytes:
            groups.append([])
            size = 0
        groups[-1].append(name)
        size += nbytes
    return groups


def _chunks(group: list[str], shapes: dict[str, tuple[int, ...]], stored: dict[str, Any]) -> list[list[str]]:
    chunks: list[list[str]] = [[]]
    size = 0
    for name in group:
        nbytes = _numel(shapes[name]) * stored[MODEL_PREFIX + name].properties.dtype.itemsize
        if chunks[-1] and size + nbytes > CHUNK_BYTES:
            chunks.append([])
            size = 0
        chunks[-1].append(name)
        size += nbytes
    return chunks


def _numel(shape: tuple[int, ...]) -> int:
    n = 1
    for dim in shape:
        n *= dim
    return n


def _init_files_dir(source: Path, config: dict[str, Any]) -> Path | None:
    """Where the run's init directory's config and tokenizer files are: the job's hf-init/ copy beside the
    step directories, else the recorded init.hf_dir if it still exists; None for a run from random weights."""
    copy = source.parent / INIT_COPY_DIR
    if (copy / CONFIG_FILE).is_file():
        return copy
    recorded = config.get("init", {}).get("hf_dir", "")
    if recorded and (Path(recorded) / CONFIG_FILE).is_file():
        return Path(recorded)
    return None


def _write_side_files(out: Path, model_cfg: ModelConfig, init_dir: Path | None) -> None:
    base = read_hf_config(init_dir) if init_dir is not None else None
    (out / CONFIG_FILE).write_text(json.dumps(hf_config(model_cfg, base), indent=2, sort_keys=True) + "\n")
    if init_dir is not None:
        for name in SIDE_FILES:
            if name != CONFIG_FILE and (init_dir / name).is_file():
                shutil.copyfile(init_dir / name, out / name)
    if not (out / GENERATION_FILE).is_file():
        generation = {"_from_model_config": True}
        generation.update({k: base[k] for k in ("bos_token_id", "eos_token_id") if base and k in base})
        (out / GENERATION_FILE).write_text(json.dumps(generation, indent=2) + "\n")
