"""``python -m training.bench``: tokens/s, model TFLOP/s, MFU and peak memory of full training steps
(forward + backward + gradient clipping + AdamW step, the training loop's own functions) for the FP8
backends none, torchao (each recipe) and te, on the same model and shapes in one run; with
``--compare-torchtitan`` the same rows trained by torchtitan's own Llama 3 model and float8 converter
(``torchtitan_model``), and our tokens/s over theirs.

Each backend gets a fresh model built in the training order (meta device -> FP8 conversion -> activation
checkpointing -> compile -> FSDP2 on a one-rank mesh -> to_empty -> init_weights -> AdamW), then runs
``--warmup-steps`` untimed steps (compilation, allocator warm-up, FP8 scale history) and ``--steps`` timed
ones on random tokens, so data loading is not measured. Timing: CUDA events on a GPU, perf_counter on the
CPU. FLOPs per token follow training.model.flops_per_token (attention counted), MFU is against the GPU's
dense BF16 peak from the instance catalog, also for the FP8 backends, so the columns compare directly.
On a CPU it runs the tiny preset by default, with torchao in emulate mode (a smoke test of the path, not a
speed measurement).

Rows are named by backend and recipe: ``none``, ``torchao-tensorwise``, ``torchao-rowwise``, ``te-delayed``,
``te-current``; torchtitan's rows carry a ``titan:`` prefix.

One concept per module:

- ``cli``: the command line (``build_parser``) and the run (``main``): defaults, the header, exit codes.
- ``variants``: what one row is (``Variant``), what it measured (``BenchResult``), the row order, the
  torchtitan ratio.
- ``measure``: building, warming up and timing one row (``run_backend``), the optional profile.
- ``report``: the printed table and the software versions the JSON records.
- ``torchtitan_model``: torchtitan's model and float8 converter, built for its rows.

This file imports nothing; ``__main__`` runs ``cli.main``.
"""
