"""What `clusterctl plan` plans for: a model and the shape of its training step, from a preset name or a
training config file, read without torch (training.shapes, tomllib) so the operator's machine needs no
PyTorch to plan a run.

A preset name stands for the packaged config of that preset (`llama3-70b` -> training/configs/llama3-70b.toml),
so the plan uses the sequence length, micro-batch and settings that `clusterctl submit` would run.
"""

from __future__ import annotations

import tomllib
from dataclasses import dataclass, fields
from pathlib import Path
from typing import Any

import training.shapes
from clusterctl.aws import EXIT_USAGE, ClusterctlError
from training.errors import ConfigError
from training.shapes import MODEL_PRESETS, ModelConfig, fill_model_preset

CONFIGS_DIR = Path(training.shapes.__file__).parent / "configs"
_MODEL_FIELDS = {f.name for f in fields(ModelConfig)}
_RUN_INT_FIELDS = ("seq_len", "micro_batch_size", "grad_accum_steps")


@dataclass(frozen=True)
class Workload:
    model: ModelConfig
    config: str  # the --config to submit: training/configs/<name>.toml (in the node bundle) or the path given
    seq_len: int  # tokens per sample
    micro_batch_size: int  # samples per GPU per forward/backward
    grad_accum_steps: int  # micro-batches per optimizer step
    activation_checkpointing: bool  # as the config file has it (the plan may need to change it)
    reshard_after_forward: bool
    fp8_backend: str  # "none", "torchao" or "te", as the config file has it

    @property
    def preset(self) -> str:
        return self.model.preset

    @property
    def name(self) -> str:
        return self.model.preset or Path(self.config).stem


def load_workload(model: str, seq_len: int | None = None, micro_batch_size: int | None = None) -> Workload:
    """The workload for `--model`: a preset name or a training TOML; --seq-len and --micro-batch-size win."""
    path, config = _config_path(model)
    tables = _read_toml(path)
    model_table = dict(tables.get("model", {}))
    unknown = sorted(set(model_table) - _MODEL_FIELDS)
    if unknown:
        raise _usage(f"model.{unknown[0]} in {path}: unknown key; allowed: {', '.join(sorted(_MODEL_FIELDS))}")
    try:
        fill_model_preset(model_table)
        model_cfg = ModelConfig(**model_table)
        model_cfg.validate()
    except (ConfigError, TypeError) as error:
        raise _usage(f"{path}: {error}") from None
    run = tables.get("run", {})
    parallel = tables.get("parallel", {})
    values = {name: run.get(name, default) for name, default in
              (("seq_len", 128), ("micro_batch_size", 8), ("grad_accum_steps", 1))}  # RunConfig's defaults
    if seq_len is not None:
        values["seq_len"] = seq_len
    if micro_batch_size is not None:
        values["micro_batch_size"] = micro_batch_size
    for name in _RUN_INT_FIELDS:
        value = values[name]
        if isinstance(value, bool) or not isinstance(value, int) or value < 1:
            raise _usage(f"run.{name}={value!r} in {path}: allowed: an integer >= 1")
    param_dtype = parallel.get("param_dtype", "bfloat16")
    if param_dtype != "bfloat16":
        raise _usage(
            f"parallel.param_dtype={param_dtype!r} in {path}: the planner models bf16 mixed precision (the GPU "
            "configs' setting); allowed: 'bfloat16'"
        )
    return Workload(
        model=model_cfg,
        config=config,
        seq_len=values["seq_len"],
        micro_batch_size=values["micro_batch_size"],
        grad_accum_steps=values["grad_accum_steps"],
        activation_checkpointing=_bool(parallel, "activation_checkpointing", False, path),
        reshard_after_forward=_bool(parallel, "reshard_after_forward", True, path),
        fp8_backend=str(tables.get("fp8", {}).get("backend", "none")),
    )


def packaged_config_for(preset: str) -> Path | None:
    """The packaged config whose [model] preset is `preset` (its own name first: 1b -> 1b.toml)."""
    candidates = sorted(CONFIGS_DIR.glob("*.toml"), key=lambda p: (p.stem != preset, p.name))
    for path in candidates:
        if _read_toml(path).get("model", {}).get("preset") == preset:
            return path
    return None


def _config_path(model: str) -> tuple[Path, str]:
    """(the file to read, the --config to print for submit)."""
    if model in MODEL_PRESETS:
        packaged = packaged_config_for(model)
        if packaged is None:
            raise _usage(f"--model {model}: no config in {CONFIGS_DIR} uses this preset")
        return packaged, f"training/configs/{packaged.name}"
    path = Path(model)
    if path.is_file():
        return path, model
    packaged = CONFIGS_DIR / f"{model}.toml"
    if packaged.is_file():
        return packaged, f"training/configs/{packaged.name}"
    raise _usage(
        f"--model {model!r}: allowed: a preset ({', '.join(MODEL_PRESETS)}) or a training config TOML file"
    )


def _read_toml(path: Path) -> dict[str, Any]:
    try:
        with path.open("rb") as handle:
            return tomllib.load(handle)
    except tomllib.TOMLDecodeError as error:
        raise _usage(f"{path}: invalid TOML: {error}") from None
    except OSError as error:
        raise _usage(f"{path}: {error.strerror}") from None


def _bool(table: dict[str, Any], key: str, default: bool, path: Path) -> bool:
    value = table.get(key, default)
    if not isinstance(value, bool):
        raise _usage(f"parallel.{key}={value!r} in {path}: allowed: true or false")
    return value


def _usage(message: str) -> ClusterctlError:
    return ClusterctlError(message, EXIT_USAGE)
