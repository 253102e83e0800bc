"""What `clusterctl plan` plans for: a model and the shape of its training step, from a packaged config's name
(the names `python -m training --config` takes) or a training config file, read by the trainer's own loader
(training.config.load_config, which imports no torch) so a config means the same model and step to the plan as
to the run.

A name stands for its packaged config (`llama3-70b` -> training/configs/llama3-70b.toml), so the plan uses the
sequence length, micro-batch and settings that `clusterctl submit` would run.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from pathlib import Path

from cluster_aws.errors import EXIT_USAGE, ClusterctlError
from clusterctl.plan.step_time import fp8_all_gather_applies
from training.config import CONFIGS_DIR, TrainConfig, did_you_mean, load_config, packaged_config_names
from training.config.sections import ModelConfig
from training.errors import ConfigError


@dataclass(frozen=True)
class Workload:
    model: ModelConfig
    config: str  # the --config to submit: training/configs/<name>.toml (in the node bundle) or the path given
    seq_len: int  # tokens per sample
    micro_batch_size: int  # samples per GPU per forward/backward
    grad_accum_steps: int  # micro-batches per optimizer step, as the config file has it
    global_batch_tokens: int  # run.global_batch_tokens: tokens per optimizer step at any node count; 0: unset
    activation_checkpointing: bool  # as the config file has it (the plan may need to change it)
    reshard_after_forward: bool
    fp8_backend: str  # "none", "torchao" or "te", as the config file has it
    fp8_recipe: str  # the backend's scaling recipe (torchao_recipe, te_recipe); "" with none
    compile: bool  # torch.compile per block, as the config file has it
    # FSDP all-gathers the Float8 linears in FP8 (fp8.fsdp_float8_all_gather with torchao tensorwise), where the
    # GPU runs the config's FP8 backend (clusterctl.plan.step_time.fp8_all_gather_applies)
    fp8_all_gather: bool = False
    path: Path = Path()  # the file read, to read it again with the plan's --set items
    run_config: TrainConfig | None = field(default=None, compare=False)  # the config as read (with --seq-len ...)
    overrides: tuple[str, ...] = ()  # the --set items --seq-len and --micro-batch-size stand for

    @property
    def preset(self) -> str:
        return self.model.preset

    @property
    def name(self) -> str:
        """A packaged config by its name (llama3-8b-finetune), as training names it; a file by its preset."""
        if self.config.startswith("training/configs/"):
            return Path(self.config).stem
        return self.model.preset or Path(self.config).stem


def load_workload(model: str, seq_len: int | None = None, micro_batch_size: int | None = None) -> Workload:
    """The workload for `--model`: a packaged config's name or a training TOML; --seq-len and --micro-batch-size win (as
    `--set run.seq_len=...` would on the nodes)."""
    path, config = _config_path(model)
    overrides = [f"run.{key}={value}" for key, value in
                 (("seq_len", seq_len), ("micro_batch_size", micro_batch_size)) if value is not None]
    cfg = _load(path, overrides)
    if cfg.parallel.param_dtype != "bfloat16":
        raise ClusterctlError(
            f"parallel.param_dtype={cfg.parallel.param_dtype!r} in {path}: the planner models bf16 mixed "
            "precision (the GPU configs' setting); allowed: 'bfloat16'",
            EXIT_USAGE,
        )
    return Workload(
        model=cfg.model,
        config=config,
        seq_len=cfg.run.seq_len,
        micro_batch_size=cfg.run.micro_batch_size,
        grad_accum_steps=cfg.run.grad_accum_steps,
        global_batch_tokens=cfg.run.global_batch_tokens,
        activation_checkpointing=cfg.parallel.activation_checkpointing,
        reshard_after_forward=cfg.parallel.reshard_after_forward,
        fp8_backend=cfg.fp8.backend,
        fp8_recipe={"torchao": cfg.fp8.torchao_recipe, "te": cfg.fp8.te_recipe}.get(cfg.fp8.backend, ""),
        compile=cfg.parallel.compile,
        fp8_all_gather=fp8_all_gather_applies(cfg.fp8.backend, cfg.fp8.torchao_recipe, cfg.fp8.fsdp_float8_all_gather),
        path=path,
        run_config=cfg,
        overrides=tuple(overrides),
    )


def run_config(workload: Workload, overrides: list[str]) -> TrainConfig:
    """The config the plan's submit line runs: the file with its own --set items and `overrides` (the trainer's
    loader and validation: a bad item is the plan's bug, said as a usage error rather than sent to the nodes)."""
    return _load(workload.path, [*workload.overrides, *overrides])


def _config_path(model: str) -> tuple[Path, str]:
    """(the file to read, the --config to print for submit)."""
    if model in packaged_config_names():
        return CONFIGS_DIR / f"{model}.toml", f"training/configs/{model}.toml"
    path = Path(model)
    if path.is_file():
        return path, model
    raise ClusterctlError(
        f"--model {model!r}: allowed: a packaged config ({', '.join(packaged_config_names())}) or a training "
        f"config TOML file{did_you_mean(model)}",
        EXIT_USAGE,
    )


def _load(path: Path, overrides: list[str]) -> TrainConfig:
    try:
        return load_config(path, overrides)
    except ConfigError as error:
        raise ClusterctlError(f"{path}: {error}", EXIT_USAGE) from None
