"""torchtitan's own Llama 3 model and float8 converter, built for ``python -m training.bench
--compare-torchtitan`` so both implementations are timed by the same loop on the same machine.

Two torchtitan APIs are supported, since a release pairs with a PyTorch release: 0.2.x (PyTorch 2.10/2.11:
``llama3_args`` + ``Transformer``, SDPA attention, the JobConfig-driven ``Float8LinearConverter``,
``apply_compile`` / ``apply_fsdp`` from ``models/llama3/infra/parallelize.py``) and 0.3.x (PyTorch >= 2.12).
The figures in docs/benchmarks.md come from 0.2.2 on an H100. The 0.3.x path has run only on a CPU, as far as
FlexAttention's backward, which has no CPU kernel: it is untested on a GPU.

What comes from torchtitan with 0.3.x: the model (``llama3_configs[flavor]``:
fused wqkv, its RoPE, its default FlexAttention with a causal block mask (0.3 no longer offers SDPA for
language models), its init), its ``Float8LinearConverter`` (which swaps
``Linear.Config`` for torchao's Float8Linear, ``lm_head`` filtered out as in its 405B recipe), its per-block
``apply_compile`` and its FSDP2 wrapping (``apply_fsdp_to_decoder``). What stays ours, identically for both
rows: the tokens, the loss (fp32 cross-entropy on the full logits), gradient clipping, the optimizer
(training.optim: AdamW, fused on CUDA) and the timing. So the ratio compares the model and its parallelism,
not two different training recipes. Differences that remain and are torchtitan's choices: fused wqkv,
FlexAttention instead of SDPA; weight tying is turned OFF here to match our untied "1b" shape (torchtitan's
own 1B ties; the FLOPs are the same). Every sample is one document (positions 0..T-1), as in our rows.

torchtitan is imported lazily and only here: the package trains without it.
"""

from __future__ import annotations

import types
from typing import Any

import torch
from torch import nn

from training.config.parallel import ParallelConfig
from training.errors import ConfigError
from training.model import ModelConfig, count_params
from training.parallel.fsdp import DTYPES
from training.parallel.parallelize import build_data_parallel_mesh
from training.parallel.process_group import DistInfo

TORCHTITAN_INSTALL = (
    "pip install torchtitan (0.3.x with PyTorch >= 2.12, 0.2.2 with PyTorch 2.10/2.11; it needs tyro, "
    "and 0.3.x spmd_types, 0.2.x datasets and torchdata)"
)

# our preset -> torchtitan's llama3 flavor with the same blocks (dim, layers, heads, kv heads, FFN, vocab)
FLAVORS = {"1b": "1B", "llama3-8b": "8B", "llama3-70b": "70B"}


def import_torchtitan() -> types.SimpleNamespace:
    """The torchtitan pieces the comparison uses, or a ConfigError that says what is missing."""
    try:
        import torchtitan.models.llama3 as llama3
    except ImportError as exc:
        raise ConfigError(f"torchtitan is not importable ({exc}); install it with: {TORCHTITAN_INSTALL}") from exc
    if hasattr(llama3, "llama3_args"):  # the 0.2.x API
        from torchtitan.components.quantization.float8 import Float8LinearConverter
        from torchtitan.config import JobConfig
        from torchtitan.models.llama3.infra.parallelize import apply_compile, apply_fsdp

        return types.SimpleNamespace(
            api="0.2", version=torchtitan_version(), llama3=llama3, JobConfig=JobConfig,
            Float8LinearConverter=Float8LinearConverter, apply_compile=apply_compile, apply_fsdp=apply_fsdp,
        )
    try:
        import torchtitan
        from torchtitan.components.quantization.float8 import Float8LinearConverter
        from torchtitan.config import CompileConfig
        from torchtitan.distributed.compile import apply_compile
        from torchtitan.distributed.fsdp import apply_fsdp_to_decoder
        from torchtitan.models.llama3 import llama3_configs
    except ImportError as exc:
        raise ConfigError(f"torchtitan is not importable ({exc}); install it with: {TORCHTITAN_INSTALL}") from exc
    return types.SimpleNamespace(
        api="0.3",
        version=getattr(torchtitan, "__version__", None) or torchtitan_version(),
        Float8LinearConverter=Float8LinearConverter,
        CompileConfig=CompileConfig,
        apply_compile=apply_compile,
        apply_fsdp_to_decoder=apply_fsdp_to_decoder,
        llama3_configs=llama3_configs,
    )


def build_torchtitan_model(
    model_cfg: ModelConfig,
    parallel_cfg: ParallelConfig,
    info: DistInfo,
    *,
    float8_recipe: str | None,
    emulate: bool = False,
) -> nn.Module:
    """torchtitan's Llama 3 of the same shape as ``model_cfg``, float8-converted when ``float8_recipe`` is
    set, compiled per block when ``parallel_cfg.compile``, FSDP2-wrapped on a one-rank mesh, initialised.
    Its forward takes tokens [B, T] and returns logits [B, T, vocab], like training.model.Transformer."""
    titan = import_torchtitan()
    if parallel_cfg.activation_checkpointing:
        raise ConfigError("--compare-torchtitan: not with --activation-checkpointing (compared without AC)")
    flavor = FLAVORS.get(model_cfg.preset)
    if flavor is None:
        raise ConfigError(
            f"--compare-torchtitan: preset {model_cfg.preset!r} has no torchtitan flavor; allowed: "
            + ", ".join(FLAVORS)
        )
    if titan.api == "0.2":
        return _build_v02(titan, model_cfg, parallel_cfg, info, float8_recipe=float8_recipe, emulate=emulate)
    config = titan.llama3_configs[flavor](attn_backend="flex")  # model_registry's default
    config.enable_weight_tying = False  # our presets keep the output head separate
    if float8_recipe is not None:
        converter = titan.Float8LinearConverter.Config(
            recipe_name=float8_recipe,
            filter_fqns=["lm_head"],
            emulate=emulate,
            model_compile_enabled=parallel_cfg.compile,
        ).build()
        config = converter.convert(config)
    with torch.device("meta"):
        model = config.build()
    _check_same_shape(model, model_cfg)
    if parallel_cfg.compile:
        parallel_dims = types.SimpleNamespace(tp_enabled=False)  # apply_compile only asks about TP
        titan.apply_compile(model, compile_config=titan.CompileConfig(enable=True), parallel_dims=parallel_dims)
    titan.apply_fsdp_to_decoder(
        model,
        build_data_parallel_mesh(info),
        param_dtype=DTYPES[parallel_cfg.param_dtype],
        reduce_dtype=DTYPES[parallel_cfg.reduce_dtype],
        pp_enabled=False,
    )
    model.to_empty(device=info.device)
    with torch.no_grad():
        model.init_states(buffer_device=info.device)
    model.train()
    return TorchtitanForward(model)


def _build_v02(
    titan: types.SimpleNamespace,
    model_cfg: ModelConfig,
    parallel_cfg: ParallelConfig,
    info: DistInfo,
    *,
    float8_recipe: str | None,
    emulate: bool,
) -> nn.Module:
    """The same with torchtitan 0.2.x: TransformerModelArgs of our shape (its SwiGLU sizing rule
    reproduces our FFN width for the Llama 3 presets), SDPA attention, its converter and wrappers."""
    multiple_of, multiplier = {"1b": (1024, 1.5), "llama3-8b": (1024, 1.3), "llama3-70b": (4096, 1.3)}[
        model_cfg.preset
    ]
    args = titan.llama3.TransformerModelArgs(
        dim=model_cfg.dim, n_layers=model_cfg.n_layers, n_heads=model_cfg.n_heads,
        n_kv_heads=model_cfg.n_kv_heads, vocab_size=model_cfg.vocab_size, multiple_of=multiple_of,
        ffn_dim_multiplier=multiplier, rope_theta=model_cfg.rope_theta, norm_eps=model_cfg.norm_eps,
    )
    with torch.device("meta"):
        model = titan.llama3.Transformer(args)
    _check_same_shape(model, model_cfg)
    job = titan.JobConfig()
    job.compile.enable = parallel_cfg.compile
    job.compile.components = ["model"]
    if float8_recipe is not None:
        float8 = job.quantize.linear.float8
        float8.recipe_name = float8_recipe
        float8.filter_fqns = ["output"]
        float8.emulate = emulate
        parallel_dims = types.SimpleNamespace(dp_shard_enabled=False)  # one rank: nothing to all-gather
        titan.Float8LinearConverter(job, parallel_dims).convert(model)
    if parallel_cfg.compile:
        titan.apply_compile(model, job.compile)
    titan.apply_fsdp(
        model, build_data_parallel_mesh(info), param_dtype=DTYPES[parallel_cfg.param_dtype],
        reduce_dtype=DTYPES[parallel_cfg.reduce_dtype], pp_enabled=False,
    )
    model.to_empty(device=info.device)
    with torch.no_grad():
        model.init_weights(buffer_device=info.device)
    model.train()
    return model


class TorchtitanForward(nn.Module):
    """Calls torchtitan's decoder as its trainer does for one-document samples: positions 0..T-1 and the
    attention masks the model builds from them (cached per shape: they do not change between steps)."""

    def __init__(self, model: nn.Module) -> None:
        super().__init__()
        self.model = model
        self._masks: dict[tuple[int, int], tuple[torch.Tensor, Any]] = {}

    def forward(self, tokens: torch.Tensor) -> torch.Tensor:
        key = tuple(tokens.shape)
        if key not in self._masks:
            batch, seq_len = key
            positions = torch.arange(seq_len, device=tokens.device).expand(batch, seq_len)
            self._masks[key] = (positions, self.model.get_attention_masks(positions=positions))
        positions, masks = self._masks[key]
        return self.model(tokens, positions=positions, attention_masks=masks)


def _check_same_shape(model: nn.Module, model_cfg: ModelConfig) -> None:
    """A torchtitan release that changed a flavor's shape must not be compared silently."""
    theirs = sum(p.numel() for p in model.parameters())
    ours = count_params(model_cfg)
    if theirs != ours:
        raise ConfigError(
            f"--compare-torchtitan: torchtitan's {model_cfg.preset} has {theirs} parameters, ours {ours}; "
            "the shapes differ, so the comparison would not be like for like"
        )


def torchtitan_version() -> str | None:
    """The installed torchtitan distribution's version, or None."""
    from importlib.metadata import PackageNotFoundError, version

    try:
        return version("torchtitan")
    except PackageNotFoundError:
        return None
