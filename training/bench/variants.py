"""The rows of a bench run: what one row trains (``Variant``), what it measured (``BenchResult``), the order of
the rows (``expand_variants``) and our tokens/s over torchtitan's (``add_torchtitan_ratios``)."""

from __future__ import annotations

from dataclasses import dataclass


@dataclass(frozen=True)
class Variant:
    """What one row trains: whose model (ours or torchtitan's), which FP8 backend, which scaling recipe."""

    backend: str  # none | torchao | te
    recipe: str = ""  # torchao: tensorwise | rowwise; te: delayed | current; none: ""
    torchtitan: bool = False

    @property
    def name(self) -> str:
        name = f"{self.backend}-{self.recipe}" if self.recipe else self.backend
        return f"titan:{name}" if self.torchtitan else name


@dataclass
class BenchResult:
    """One row."""

    backend: str  # the row name (Variant.name)
    status: str  # ok | skipped | failed
    reason: str = ""  # why it was skipped or how it failed
    tokens_per_s: float | None = None  # tokens per second through the timed steps
    tflops: float | None = None  # model TFLOP/s (flops_per_token x tokens/s)
    mfu: float | None = None  # tflops / the GPU's dense BF16 peak; None on a CPU or an unknown GPU
    step_time_ms: float | None = None  # mean wall time of one timed step
    peak_memory_gib: float | None = None  # GPU: max allocated; CPU: the process's max RSS so far
    final_loss: float | None = None  # loss of the last timed step (a sanity check of the numerics)
    vs_torchtitan: float | None = None  # our tokens/s over torchtitan's for the same backend and recipe
    # wall time from building the model to the end of the warm-up steps: with --compile it holds the compile
    # (python -m training.bench twice with one TORCHINDUCTOR_CACHE_DIR: cold, then warm)
    warmup_s: float | None = None


def expand_variants(
    backends: list[str], torchao_recipes: list[str], te_recipes: list[str], *, compare_torchtitan: bool
) -> list[Variant]:
    """The rows, in order: each backend with each of its recipes, then torchtitan's none/torchao rows."""
    ours = []
    for backend in backends:
        recipes = {"torchao": torchao_recipes, "te": te_recipes}.get(backend, [""])
        ours += [Variant(backend, recipe) for recipe in recipes]
    if not compare_torchtitan:
        return ours
    # torchtitan has no TE path; its float8 converter is torchao's
    return ours + [Variant(v.backend, v.recipe, torchtitan=True) for v in ours if v.backend != "te"]


def add_torchtitan_ratios(variants: list[Variant], results: list[BenchResult]) -> None:
    """Our tokens/s over torchtitan's, on our row, where both rows ran."""
    by_variant = dict(zip(variants, results, strict=True))
    for variant, result in by_variant.items():
        if variant.torchtitan:
            continue
        theirs = by_variant.get(Variant(variant.backend, variant.recipe, torchtitan=True))
        if theirs is not None and result.tokens_per_s and theirs.tokens_per_s:
            result.vs_torchtitan = result.tokens_per_s / theirs.tokens_per_s

