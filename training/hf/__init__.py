"""Hugging Face Llama weights in and out of the trainer: the name table (``names``), config.json <-> the
model's shape (``config``), the checks of a model directory before anything is loaded (``files``), the
sharded load at a fresh start (``load``) and the export of a checkpoint (``export``; ``python -m
training.export``). ``names``, ``config`` and ``files`` import no torch: clusterctl's machine may read them.
docs/weights.md describes the behaviour.
"""
