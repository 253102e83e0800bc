"""FP8 training backends behind one small seam: ``none`` (bf16 matmuls), ``torchao`` (torchao.float8) and
``te`` (NVIDIA Transformer Engine).

A backend converts the model in place before activation checkpointing, compile and sharding (torchtitan's
order: the float8 modules must exist before FSDP2 wraps their weights), wraps each forward in its autocast
context, and may act after each optimizer step. Both FP8 backends keep the same linears in high precision:
the output head (its logits feed the loss directly; torchtitan and TE's recipes leave it in bf16) and any
linear whose in/out features are not multiples of 16, which FP8 GEMMs (torch._scaled_mm, cuBLASLt) cannot
take. Optional packages are imported only when their backend is asked for, so the package imports and trains
without them.
"""

from __future__ import annotations

import contextlib
import dataclasses
import functools
import importlib.metadata
from collections.abc import Callable
from contextlib import AbstractContextManager
from typing import Any, Protocol

import torch
from torch import nn

from training.config.sections import Fp8Config
from training.errors import ConfigError

TE_MIN_VERSION = (2, 16)  # the first Transformer Engine release whose modules work under FSDP2
TE_INSTALL = 'pip install --no-build-isolation "transformer_engine[pytorch]>=2.16"'
ON_THE_NODES = "the training lock training/node-requirements.txt says what they install; README, 'FP8 on the nodes'"
# Transformer Engine combinations (te_recipe, feature) that a GPU run has checked end to end with FSDP2
# (benchmarks/te_checkpoint_check.py, results in docs/benchmarks.md). TE cannot be installed without CUDA, so
# the CPU tests cannot; every combination a run uses that is not listed is named at start-up.
TE_FEATURES = {
    "resume": "save and resume through DCP (FP8 metadata in _extra_state carried as bytes)",
    "activation_checkpointing": "activation checkpointing through te.checkpoint under FSDP2",
}
TE_VERIFIED_ON_GPU: frozenset[tuple[str, str]] = frozenset()
HIGH_PRECISION_MODULES = ("output",)  # module names (last FQN part) never converted: the output head
FP8_DIM_MULTIPLE = 16  # FP8 GEMMs need in/out features divisible by 16 (torch._scaled_mm, TE Linear docs)


class Fp8Backend(Protocol):
    """What the training loop and the bench call; see the module docstring for the order."""

    name: str
    # whether tensor parallelism uses torchao's Float8 column/row-wise styles (training.parallel.tp)
    float8_tensor_parallel: bool

    def convert(self, model: nn.Module) -> None:
        """Swap eligible linears in place (before AC, compile and fully_shard)."""

    def autocast(self) -> AbstractContextManager[Any]:
        """The context each forward runs in (backward needs none)."""

    def post_optimizer_step(self, model: nn.Module) -> None:
        """Called after every optimizer.step() (and after a checkpoint is loaded into the weights)."""

    def activation_checkpoint_fn(self) -> Callable[..., Any] | None:
        """The function activation checkpointing must recompute blocks with; None: torch.utils.checkpoint."""


def fp8_eligible(module: nn.Module, fqn: str) -> bool:
    """True for a linear that may run in FP8: not the output head, both dimensions multiples of 16.

    The module filter of both backends (torchao's ``module_filter_fn(module, fqn)`` signature)."""
    if not isinstance(module, nn.Linear) or fqn.rsplit(".", 1)[-1] in HIGH_PRECISION_MODULES:
        return False
    return module.in_features % FP8_DIM_MULTIPLE == 0 and module.out_features % FP8_DIM_MULTIPLE == 0


class NoFp8:
    """``none``: matmuls in the FSDP2 param dtype (bf16 on GPU)."""

    name = "none"
    float8_tensor_parallel = False

    def convert(self, model: nn.Module) -> None:
        pass

    def autocast(self) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()

    def post_optimizer_step(self, model: nn.Module) -> None:
        pass

    def activation_checkpoint_fn(self) -> Callable[..., Any] | None:
        return None


class TorchaoFp8:
    """``torchao``: torchao.float8's Float8Linear with dynamic scaling (tensorwise or rowwise).

    Composes with torch.compile and FSDP2; with tensorwise scaling FSDP2 can all-gather the weights already
    cast to FP8, and then the per-weight scales are computed for all layers in one all-reduce after each
    optimizer step (``precompute_float8_dynamic_scale_for_fsdp``, as torchtitan does)."""

    name = "torchao"

    def __init__(self, cfg: Fp8Config) -> None:
        self.float8 = _import_torchao_float8()
        if not cfg.emulate:
            _require_fp8_gpu("torchao")
        base = self.float8.Float8LinearConfig.from_recipe_name(cfg.torchao_recipe)
        self.fsdp_float8_all_gather = cfg.fsdp_float8_all_gather and cfg.torchao_recipe == "tensorwise"
        self.config = dataclasses.replace(
            base, emulate=cfg.emulate, enable_fsdp_float8_all_gather=self.fsdp_float8_all_gather
        )
        # torchao's Float8 TP styles cast with tensorwise scales before the collectives; rowwise scaling runs
        # under the plain styles (torchtitan makes the same choice)
        self.float8_tensor_parallel = cfg.torchao_recipe == "tensorwise"

    def convert(self, model: nn.Module) -> None:
        self.float8.convert_to_float8_training(model, module_filter_fn=fp8_eligible, config=self.config)

    def autocast(self) -> AbstractContextManager[Any]:
        return contextlib.nullcontext()  # Float8Linear casts inside its own forward

    def post_optimizer_step(self, model: nn.Module) -> None:
        if self.fsdp_float8_all_gather:
            self.float8.precompute_float8_dynamic_scale_for_fsdp(model)

    def activation_checkpoint_fn(self) -> Callable[..., Any] | None:
        return None  # Float8Linear casts inside its own forward, so a plain recompute repeats it exactly


class TransformerEngineFp8:
    """``te``: nn.Linear swapped for ``te.Linear`` (same filter), forwards under TE's autocast with a
    DelayedScaling or Float8CurrentScaling recipe (HYBRID format: E4M3 forward, E5M2 gradients)."""

    name = "te"
    float8_tensor_parallel = False  # te with tp > 1 is refused (training.parallel.layout)

    def __init__(self, cfg: Fp8Config) -> None:
        self.te = import_transformer_engine()
        _require_fp8_gpu("te")
        from transformer_engine.common import recipe

        if cfg.te_recipe == "delayed":
            self.recipe = recipe.DelayedScaling(
                fp8_format=recipe.Format.HYBRID,
                amax_history_len=cfg.te_amax_history_len,
                amax_compute_algo="max",
            )
        else:
            self.recipe = recipe.Float8CurrentScaling(fp8_format=recipe.Format.HYBRID)

    def convert(self, model: nn.Module) -> None:
        apply_linear_swap(model, self._te_linear)

    def _te_linear(self, linear: nn.Linear) -> nn.Module:
        # Created on the linear's device (meta in the training build: FSDP2 shards it, then to_empty and
        # Transformer.init_weights give it values, as for nn.Linear).
        return self.te.Linear(
            linear.in_features,
            linear.out_features,
            bias=linear.bias is not None,
            params_dtype=linear.weight.dtype,
            device=linear.weight.device,
        )

    def autocast(self) -> AbstractContextManager[Any]:
        # TE 2.x renamed fp8_autocast(fp8_recipe=) to autocast(recipe=); older releases only have the former.
        if hasattr(self.te, "autocast"):
            return self.te.autocast(enabled=True, recipe=self.recipe)
        return self.te.fp8_autocast(enabled=True, fp8_recipe=self.recipe)

    def post_optimizer_step(self, model: nn.Module) -> None:
        pass  # TE updates amax histories and scales when the autocast region exits

    def activation_checkpoint_fn(self) -> Callable[..., Any] | None:
        # torch's checkpoint recomputes a block in backward outside te.autocast, so the recompute runs
        # without the FP8 recipe (and delayed scaling's amax bookkeeping sees a second forward). TE's
        # checkpoint re-enters the recipe and TE's recompute context; this is how TE's own FSDP example
        # wraps blocks (examples/pytorch/fsdp/fsdp.py: checkpoint_wrapper(m,
        # checkpoint_fn=te.distributed.checkpoint, use_reentrant=False)).
        return functools.partial(self.te.checkpoint, use_reentrant=False)


def te_unverified_combinations(cfg: Fp8Config, *, activation_checkpointing: bool) -> list[str]:
    """The Transformer Engine combinations this run uses that no GPU run has verified (see TE_FEATURES)."""
    if cfg.backend != "te":
        return []
    features = ["resume"] + (["activation_checkpointing"] if activation_checkpointing else [])
    return [f"te_recipe={cfg.te_recipe}: {TE_FEATURES[f]}" for f in features
            if (cfg.te_recipe, f) not in TE_VERIFIED_ON_GPU]


def build_fp8_backend(cfg: Fp8Config) -> Fp8Backend:
    """The backend ``cfg.backend`` names; a missing package or unsuitable hardware fails here, at start-up."""
    if cfg.backend == "torchao":
        return TorchaoFp8(cfg)
    if cfg.backend == "te":
        return TransformerEngineFp8(cfg)
    return NoFp8()


def describe_fp8(cfg: Fp8Config, *, param_dtype: str, reduce_dtype: str) -> str:
    """One line for the trainer's first log lines: the backend, its recipe and the package version it runs, and
    the dtypes of everything else (``parallel.param_dtype``, the dtype FSDP2 gathers the weights in for
    compute, and ``parallel.reduce_dtype``, its gradient reduction's; the sharded weights stay float32)."""
    dtypes = f"gradients reduced in {reduce_dtype}, weights kept in float32"
    if cfg.backend == "none":
        return f"none (matmuls in {param_dtype}; {dtypes})"
    dist = {"torchao": "torchao", "te": "transformer_engine"}[cfg.backend]
    try:
        version = importlib.metadata.version(dist)
    except importlib.metadata.PackageNotFoundError:
        version = "not installed"
    # the FP8 linears compute in FP8 (emulated: in their high precision), the output head and the rest in
    # param_dtype
    rest = f"other matmuls in {param_dtype}; {dtypes}"
    if cfg.backend == "torchao":
        recipe = cfg.torchao_recipe + (", emulate" if cfg.emulate else "")
        return f"torchao {version} ({recipe}; {rest})"
    return f"Transformer Engine {version} ({cfg.te_recipe} scaling; {rest})"


def apply_linear_swap(model: nn.Module, make: Callable[[nn.Linear], nn.Module]) -> list[str]:
    """Replace every fp8_eligible nn.Linear with ``make(linear)``; returns the swapped FQNs."""
    swapped = []
    for fqn, module in list(model.named_modules()):
        if fp8_eligible(module, fqn):
            parent_fqn, _, child = fqn.rpartition(".")
            setattr(model.get_submodule(parent_fqn), child, make(module))
            swapped.append(fqn)
    return swapped


def import_transformer_engine() -> Any:
    """``transformer_engine.pytorch``, or a ConfigError with the install command."""
    try:
        import transformer_engine
        import transformer_engine.pytorch as te
    except ImportError as exc:  # also OSError-free ImportErrors from a TE built against another torch
        raise ConfigError(
            f"fp8.backend='te': Transformer Engine is not importable ({exc}); install it with: {TE_INSTALL} "
            f"(on the cluster's nodes: {ON_THE_NODES}), or set fp8.backend to torchao or none"
        ) from exc
    version = _version_tuple(getattr(transformer_engine, "__version__", "0"))
    if version < TE_MIN_VERSION:
        raise ConfigError(
            f"fp8.backend='te': Transformer Engine {transformer_engine.__version__} is too old for FSDP2; "
            f"allowed: >= {'.'.join(map(str, TE_MIN_VERSION))}; upgrade with: {TE_INSTALL}"
        )
    return te


def _import_torchao_float8() -> Any:
    try:
        import torchao.float8 as float8
    except ImportError as exc:
        raise ConfigError(
            f"fp8.backend='torchao': torchao is not importable ({exc}); install it with: pip install torchao "
            f"(on the cluster's nodes: {ON_THE_NODES}), or set fp8.backend to te or none"
        ) from exc
    return float8


def _require_fp8_gpu(backend: str) -> None:
    """FP8 tensor cores arrived with compute capability 8.9 (Ada) and 9.0 (Hopper)."""
    if not torch.cuda.is_available():
        hint = " or set fp8.emulate=true (CPU tests)" if backend == "torchao" else ""
        raise ConfigError(f"fp8.backend={backend!r}: needs a CUDA GPU with FP8 (H100, ...); found none{hint}")
    capability = torch.cuda.get_device_capability()
    if capability < (8, 9):
        name = torch.cuda.get_device_name()
        raise ConfigError(
            f"fp8.backend={backend!r}: {name} (compute capability {capability[0]}.{capability[1]}) has no "
            "FP8 tensor cores; allowed: compute capability >= 8.9 (L4, L40S, H100, H200, B200)"
        )


def _version_tuple(version: str) -> tuple[int, ...]:
    parts = []
    for part in version.split("+")[0].split("."):
        digits = "".join(ch for ch in part if ch.isdigit())
        if not digits:
            break
        parts.append(int(digits))
    return tuple(parts)
