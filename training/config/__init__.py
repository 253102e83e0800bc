"""The typed training configuration: one small dataclass per section, loaded from a TOML file plus
``--set section.field=value`` overrides, validated with errors that name the field.

Precedence, lowest first (torchtitan's order): dataclass defaults -> the model preset named by
``model.preset`` -> the TOML file -> ``--set``. Each part of the package receives only its own section.
"""

from __future__ import annotations

import dataclasses
import difflib
import math
import sys
import types
import typing
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from training.config.metrics import MetricsConfig
from training.config.parallel import ParallelConfig
from training.config.sections import (
    MODEL_PRESETS,
    CheckpointConfig,
    DataConfig,
    Fp8Config,
    ModelConfig,
    OptimConfig,
    ValidationConfig,
)
from training.config.weights import ExportConfig, InitConfig
from training.errors import ConfigError

CONFIGS_DIR = Path(__file__).parent.parent / "configs"  # the packaged TOML presets (training/configs/)
DEFAULT_CONFIG = CONFIGS_DIR / "tiny-cpu.toml"  # what `python -m training` trains with no --config


@dataclass
class RunConfig:
    """The ``[run]`` section: the length and shape of a run."""

    seed: int = 0  # seeds the weight init and the synthetic data / sample order
    steps: int = 200  # optimizer steps in the whole run (a resumed run continues up to this)
    seq_len: int = 128  # tokens per sample
    micro_batch_size: int = 8  # samples per rank per forward/backward
    grad_accum_steps: int = 1  # micro-batches accumulated per optimizer step (when global_batch_tokens is 0)
    # tokens per optimizer step across all ranks (torchtitan's global_batch_size, in tokens): the accumulation is
    # then derived from the world size, so a job means the same step on 2 nodes or 64; 0: grad_accum_steps as set
    global_batch_tokens: int = 0
    log_interval_steps: int = 10  # emit metrics every this many optimizer steps (and at the first and last)

    def validate(self) -> None:
        for name in ("steps", "seq_len", "micro_batch_size", "grad_accum_steps", "log_interval_steps"):
            value = getattr(self, name)
            if isinstance(value, bool) or not isinstance(value, int) or value < 1:
                raise ConfigError(f"run.{name}={value!r}: allowed: an integer >= 1")
        if isinstance(self.seed, bool) or not isinstance(self.seed, int) or not 0 <= self.seed < 2**63:
            raise ConfigError(f"run.seed={self.seed!r}: allowed: an integer in [0, 2**63)")
        batch = self.global_batch_tokens
        per_sample_step = self.seq_len * self.micro_batch_size
        if isinstance(batch, bool) or not isinstance(batch, int) or batch < 0 or batch % per_sample_step:
            raise ConfigError(f"run.global_batch_tokens={batch!r}: allowed: 0 (off) or a multiple of seq_len x "
                              f"micro_batch_size = {per_sample_step}")
        if batch and self.grad_accum_steps != 1:
            raise ConfigError(f"run.grad_accum_steps={self.grad_accum_steps}: derived from run.global_batch_tokens="
                              f"{batch} when that is set; allowed: 1 (leave it out)")

    def accumulation_steps(self, dp_world_size: int) -> int:
        """Micro-batches per rank per optimizer step: global_batch_tokens / (seq_len x micro_batch_size x ranks)
        when it is set, else grad_accum_steps. A global batch the ranks cannot split evenly is refused."""
        if not self.global_batch_tokens:
            return self.grad_accum_steps
        per_micro_step = self.seq_len * self.micro_batch_size * dp_world_size
        if self.global_batch_tokens % per_micro_step:
            raise ConfigError(
                f"run.global_batch_tokens={self.global_batch_tokens}: not a whole number of micro-batches on "
                f"{dp_world_size} ranks (seq_len {self.seq_len} x micro_batch_size {self.micro_batch_size} x "
                f"{dp_world_size} = {per_micro_step} tokens each); allowed: a multiple of {per_micro_step}"
            )
        return self.global_batch_tokens // per_micro_step

    def tokens_per_step(self, dp_world_size: int) -> int:
        """Tokens consumed by one optimizer step across all data-parallel ranks."""
        return self.seq_len * self.micro_batch_size * self.accumulation_steps(dp_world_size) * dp_world_size


@dataclass
class TrainConfig:
    """The whole configuration; every field is one TOML table."""

    run: RunConfig = field(default_factory=RunConfig)
    model: ModelConfig = field(default_factory=ModelConfig)
    parallel: ParallelConfig = field(default_factory=ParallelConfig)
    fp8: Fp8Config = field(default_factory=Fp8Config)
    data: DataConfig = field(default_factory=DataConfig)
    optim: OptimConfig = field(default_factory=OptimConfig)
    checkpoint: CheckpointConfig = field(default_factory=CheckpointConfig)
    metrics: MetricsConfig = field(default_factory=MetricsConfig)
    validation: ValidationConfig = field(default_factory=ValidationConfig)
    init: InitConfig = field(default_factory=InitConfig)
    export: ExportConfig = field(default_factory=ExportConfig)

    def validate(self) -> None:
        for section in dataclasses.fields(self):
            getattr(self, section.name).validate()
        # Rules that span two sections.
        decay_start, decay_steps = self.optim.decay_window(self.run.steps)
        if self.optim.schedule == "wsd" and decay_start + decay_steps > self.run.steps:
            # the decay would begin inside the warmup, or not reach min_lr by the last step
            raise ConfigError(
                f"optim.decay_steps={self.optim.decay_steps}: with optim.schedule='wsd' the decay ({decay_steps} "
                f"steps) and optim.warmup_steps ({self.optim.warmup_steps}) exceed run.steps ({self.run.steps}); "
                "allowed: warmup_steps + the decay <= run.steps (decay_steps, or decay_fraction x run.steps)"
            )
        if self.parallel.compile and self.fp8.backend == "te":
            # TE refuses DelayedScaling inside torch.compile (check_recipe_support in TE's quantization.py)
            # and its modules are not written for fullgraph tracing; torchao's Float8Linear is.
            raise ConfigError(
                "parallel.compile=True: not allowed with fp8.backend='te'; set parallel.compile=false, or "
                "use fp8.backend='torchao' to compile with FP8"
            )
        if self.export.hf_dir and not (self.checkpoint.dir and self.checkpoint.save_final):
            # the export reads the final checkpoint from disk, tensor by tensor (training.hf.export)
            raise ConfigError(
                f"export.hf_dir={self.export.hf_dir!r}: needs checkpoint.dir set and checkpoint.save_final=true "
                "(the export reads the final checkpoint)"
            )
        if self.metrics.tensorboard == "on" and not self.checkpoint.dir:
            raise ConfigError("metrics.tensorboard='on': needs checkpoint.dir set (the event files go to "
                              "<checkpoint.dir>/tensorboard/); allowed without it: 'auto' or 'off'")

    def to_dict(self) -> dict[str, dict[str, Any]]:
        """Plain data (TOML/JSON-serialisable), e.g. to store next to a checkpoint."""
        return dataclasses.asdict(self)


SECTIONS: dict[str, type] = {f.name: f.default_factory for f in dataclasses.fields(TrainConfig)}  # type: ignore[misc]


def packaged_config_names() -> list[str]:
    """The names of the packaged configs (configs/<name>.toml): the one set of names that `python -m training
    --config`, `clusterctl plan --model` and the README use for a model and its run."""
    return sorted(p.stem for p in CONFIGS_DIR.glob("*.toml"))


def did_you_mean(name: str) -> str:
    """"; did you mean 1b?" with the packaged names closest to a mistyped one (difflib), "" when none is close."""
    close = difflib.get_close_matches(name, packaged_config_names(), n=2)
    return f"; did you mean {' or '.join(close)}?" if close else ""


def resolve_config_path(config: str | Path | None) -> Path:
    """The TOML file for ``--config``: a path, or the name of a packaged config ("1b" -> configs/1b.toml);
    None gives the embedded default (tiny-cpu)."""
    if config is None:
        return DEFAULT_CONFIG
    path = Path(config)
    if path.is_file():
        return path
    packaged = CONFIGS_DIR / f"{config}.toml"
    if packaged.is_file():
        return packaged
    names = ", ".join(packaged_config_names())
    raise ConfigError(f"--config={str(config)!r}: no such file; allowed: a TOML path or one of: {names}"
                      f"{did_you_mean(str(config))}")


def load_config(path: str | Path | None, overrides: Sequence[str] = ()) -> TrainConfig:
    """Load and validate a TrainConfig from ``path`` (see resolve_config_path) and ``section.field=value``
    overrides. Unknown sections or keys, wrongly typed values and invalid values raise ConfigError."""
    config_path = resolve_config_path(path)
    raw = _read_toml(config_path)
    tables: dict[str, dict[str, Any]] = {}
    for section, table in raw.items():
        if section not in SECTIONS:
            raise ConfigError(
                f"[{section}] in {config_path}: unknown section; allowed: {', '.join(SECTIONS)}"
            )
        if not isinstance(table, dict):
            raise ConfigError(f"{section}={table!r} in {config_path}: allowed: a table [{section}]")
        tables[section] = {
            key: _typed(SECTIONS[section], section, key, value) for key, value in table.items()
        }
    for section, values in parse_overrides(overrides).items():
        if section == "data" and values.get("source") == "synthetic" and "path" not in values:
            tables.get("data", {}).pop("path", None)  # --set data.source=synthetic: the file's shards are not read
        tables.setdefault(section, {}).update(values)
    _refuse_shape_beside_hf_init(tables)
    _fill_model_preset(tables.setdefault("model", {}))
    cfg = TrainConfig(**{section: SECTIONS[section](**tables.get(section, {})) for section in SECTIONS})
    cfg.validate()
    return cfg


def parse_overrides(overrides: Sequence[str]) -> dict[str, dict[str, Any]]:
    """``section.field=value`` items as typed values per section (a later item for the same field wins); a
    ConfigError names the first unknown section or key, or a value of the wrong type. The rules that span
    fields (TrainConfig.validate) need the whole config: load_config."""
    tables: dict[str, dict[str, Any]] = {}
    for override in overrides:
        section, key, text = _split_override(override)
        tables.setdefault(section, {})[key] = _typed(SECTIONS[section], section, key, text, from_text=True)
    return tables


def _read_toml(path: Path) -> dict[str, Any]:
    tomllib = _tomllib()
    try:
        with path.open("rb") as fh:
            return tomllib.load(fh)
    except tomllib.TOMLDecodeError as exc:
        raise ConfigError(f"{path}: invalid TOML: {exc}") from exc


def _tomllib() -> Any:
    # training runs on the nodes' Python >= 3.10 (docs/architecture.md), where tomllib is 3.11+; tomli is
    # the same parser, backported
    if sys.version_info >= (3, 11):  # noqa: UP036 (pyproject's py311 target is the CDK app's, not training's)
        import tomllib

        return tomllib
    try:
        import tomli
    except ImportError as exc:
        raise ConfigError("reading TOML on Python 3.10 needs tomli: pip install tomli") from exc
    return tomli


def _split_override(override: str) -> tuple[str, str, str]:
    dotted, sep, text = override.partition("=")
    section, dot, key = dotted.strip().partition(".")
    if not sep or not dot or not key:
        raise ConfigError(f"--set {override!r}: allowed: section.field=value, e.g. run.steps=100")
    if section not in SECTIONS:
        raise ConfigError(f"--set {override!r}: unknown section {section!r}; allowed: {', '.join(SECTIONS)}")
    return section, key, text.strip()


def _parse_text(text: str) -> Any:
    """A ``--set`` value: a TOML literal when it is one (10, 3e-4, true, [0.9, 0.95], "x"), else the raw
    string (``fp8.backend=te``)."""
    tomllib = _tomllib()
    try:
        return tomllib.loads(f"v = {text}")["v"]
    except tomllib.TOMLDecodeError:
        return text


def _typed(cls: type, section: str, key: str, value: Any, *, from_text: bool = False) -> Any:
    """``value`` converted to the declared type of ``cls.key``, or a ConfigError naming the field.
    ``from_text``: value is a ``--set`` string; a string field takes it verbatim (``data.path=2024``)."""
    names = [f.name for f in dataclasses.fields(cls)]
    if key not in names:
        raise ConfigError(f"{section}.{key}: unknown key; allowed: {', '.join(names)}")
    tp = typing.get_type_hints(cls)[key]
    if from_text:
        value = value if tp is str else _parse_text(value)
    converted, ok = _convert(tp, value)
    if not ok:
        raise ConfigError(f"{section}.{key}={value!r}: allowed: {_describe(tp)}")
    return converted


def _convert(tp: Any, value: Any) -> tuple[Any, bool]:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        if value is None or (isinstance(value, str) and value.lower() in ("none", "null")):
            return None, type(None) in args
        for arg in args:
            if arg is not type(None):
                converted, ok = _convert(arg, value)
                if ok:
                    return converted, True
        return value, False
    if origin in (tuple, list):
        if isinstance(value, str):  # "--set optim.betas=0.9,0.95"
            value = [_parse_text(part.strip()) for part in value.split(",")]
        if not isinstance(value, list | tuple):
            return value, False
        item_types = args if origin is tuple and args and args[-1] is not Ellipsis else (args[:1] or (Any,))
        if origin is tuple and len(item_types) > 1 and len(item_types) != len(value):
            return value, False
        items = []
        for i, item in enumerate(value):
            converted, ok = _convert(item_types[min(i, len(item_types) - 1)], item)
            if not ok:
                return value, False
            items.append(converted)
        return origin(items), True
    if tp is Any:
        return value, True
    if tp is bool:
        if isinstance(value, str) and value.lower() in ("true", "yes", "on", "1", "false", "no", "off", "0"):
            return value.lower() in ("true", "yes", "on", "1"), True
        return value, isinstance(value, bool)
    if tp is int:
        return value, isinstance(value, int) and not isinstance(value, bool)
    if tp is float:
        if isinstance(value, int | float) and not isinstance(value, bool) and not math.isnan(value):
            return float(value), True
        return value, False
    if tp is str:
        return value, isinstance(value, str)
    return value, isinstance(value, tp) if isinstance(tp, type) else True


def _describe(tp: Any) -> str:
    origin, args = typing.get_origin(tp), typing.get_args(tp)
    if origin in (typing.Union, types.UnionType):
        return " or ".join(_describe(a) for a in args)
    if origin in (tuple, list):
        return f"a list [{', '.join(_describe(a) for a in args)}]"
    names = {bool: "true or false", int: "an integer", float: "a number", str: "a string", type(None): "none"}
    return names.get(tp, getattr(tp, "__name__", str(tp)))


def _refuse_shape_beside_hf_init(tables: dict[str, dict[str, Any]]) -> None:
    """With init.hf_dir the shape is its config.json's (training.hf.config, read when the run starts, where
    the directory is): a shape field given as well would be ignored or contradict it, so it is refused here.
    model.preset stays allowed: the run checks config.json against the preset's shape."""
    if not tables.get("init", {}).get("hf_dir"):
        return
    given = [key for key in tables.get("model", {}) if key not in ("preset", "init_std")]
    if given:
        raise ConfigError(
            f"model.{given[0]}: not allowed with init.hf_dir (the model's shape comes from its config.json); "
            "allowed: model.preset, which the run checks against config.json"
        )


def _fill_model_preset(model_table: dict[str, Any]) -> None:
    """Shape fields the file and --set did not give come from the named preset."""
    preset = model_table.get("preset", "")
    if not preset:
        return
    if preset not in MODEL_PRESETS:
        raise ConfigError(f"model.preset={preset!r}: allowed: {', '.join(MODEL_PRESETS)} or '' (custom)")
    for key, value in MODEL_PRESETS[preset].items():
        model_table.setdefault(key, value)


__all__ = [
    "DEFAULT_CONFIG",
    "ModelConfig",
    "RunConfig",
    "TrainConfig",
    "load_config",
    "parse_overrides",
    "packaged_config_names",
    "did_you_mean",
    "resolve_config_path",
]
