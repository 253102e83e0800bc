"""The checks of a Hugging Face model directory before any weight is read: every file the index names is
there, no safetensors file is truncated, and every tensor the model needs is present with its shape.

Each problem is one line (a ConfigError naming the file or tensor), raised before the load starts, so a bad
directory ends the job at start-up instead of inside DCP's reader with a traceback per rank. Only the files'
headers are read (the 8-byte length and the JSON table of the safetensors format), no tensor data: seconds
for a 70B model. No torch here.
"""

from __future__ import annotations

import json
import struct
from dataclasses import dataclass
from pathlib import Path

from training.config.sections import ModelConfig
from training.errors import ConfigError
from training.hf.names import expected_shapes, to_hf

INDEX_FILE = "model.safetensors.index.json"
SUFFIX = ".safetensors"
LOADABLE_DTYPES = ("BF16", "F16", "F32")  # what becomes the fp32 master weights without loss
_MAX_HEADER_BYTES = 100 << 20  # safetensors' own limit on the JSON header


@dataclass(frozen=True)
class StoredTensor:
    file: str  # file name in the directory
    dtype: str  # safetensors' name: BF16, F32, ...
    shape: tuple[int, ...]


def read_header(path: Path) -> dict[str, StoredTensor]:
    """The tensors a safetensors file declares; a ConfigError when it is no safetensors file or is shorter
    than its header says (a truncated copy)."""
    size = path.stat().st_size
    with path.open("rb") as fh:
        head = fh.read(8)
        if len(head) < 8:
            raise ConfigError(f"{path}: truncated ({size} bytes): not a safetensors file; allowed: a complete copy")
        (header_len,) = struct.unpack("<Q", head)
        if header_len > min(_MAX_HEADER_BYTES, size - 8):
            raise ConfigError(f"{path}: truncated or not a safetensors file ({size} bytes, header of "
                              f"{header_len} bytes declared); allowed: a complete copy")
        try:
            header = json.loads(fh.read(header_len))
        except ValueError:
            raise ConfigError(f"{path}: its safetensors header is not JSON; allowed: a complete copy") from None
    tensors, data_end = {}, 0
    for name, entry in header.items():
        if name == "__metadata__":
            continue
        begin, end = entry["data_offsets"]
        data_end = max(data_end, end)
        tensors[name] = StoredTensor(path.name, entry["dtype"], tuple(entry["shape"]))
    expected_size = 8 + header_len + data_end
    if size < expected_size:
        raise ConfigError(f"{path}: truncated: {size} bytes, its header describes {expected_size}; allowed: a "
                          "complete copy")
    return tensors


def scan(hf_dir: str | Path) -> dict[str, StoredTensor]:
    """Every tensor of the directory's safetensors files, by Hugging Face name, after checking the index
    (when there is one) names only files that are there."""
    root = Path(hf_dir)
    index_path = root / INDEX_FILE
    if index_path.is_file():
        try:
            weight_map = json.loads(index_path.read_text())["weight_map"]
        except (ValueError, KeyError, TypeError):
            raise ConfigError(f"{index_path}: no JSON object with a weight_map; allowed: the index "
                              "save_pretrained writes") from None
        for name, file in weight_map.items():
            if not (root / file).is_file():
                raise ConfigError(f"{index_path}: names {file} (for {name}), which is not in {root}; allowed: "
                                  "an index whose every file is present (a complete copy of the model)")
    files = sorted(p for p in root.glob(f"*{SUFFIX}") if p.is_file())
    if not files:
        raise ConfigError(f"init.hf_dir={str(hf_dir)!r}: no *{SUFFIX} file; allowed: a Hugging Face model "
                          "directory with its safetensors weights")
    found: dict[str, StoredTensor] = {}
    for path in files:
        found.update(read_header(path))
    return found


def check_hf_dir(hf_dir: str | Path, cfg: ModelConfig) -> None:
    """``hf_dir`` holds every weight of Transformer(cfg) (the shape its config.json gave), each with its
    shape and a dtype that loads as it is; a ConfigError names the first tensor that does not."""
    found = scan(hf_dir)
    for ours, shape in expected_shapes(cfg).items():
        name = to_hf(ours)
        stored = found.get(name)
        if stored is None:
            raise ConfigError(f"init.hf_dir={str(hf_dir)!r}: no tensor {name} in its safetensors files; "
                              "config.json implies it")
        if stored.shape != shape:
            raise ConfigError(f"{Path(hf_dir) / stored.file}: tensor {name} has shape {list(stored.shape)}; "
                              f"config.json implies {list(shape)}")
        if stored.dtype not in LOADABLE_DTYPES:
            raise ConfigError(f"{Path(hf_dir) / stored.file}: tensor {name} is {stored.dtype}; allowed: "
                              f"{', '.join(LOADABLE_DTYPES)}")
