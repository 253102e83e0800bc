"""Checkpoints: sharded saves of the model and optimizer state with torch.distributed.checkpoint (DCP).

One concept per module; imports point down this list and never back up:

- ``layout``: the on-disk layout of a checkpoint directory (``step-<N>``, the ``train_state.json`` marker),
  when a checkpoint is complete, the newest complete one; no torch.
- ``resume``: which checkpoint a run starts from (``--resume``, ``--resume-from-dir``).
- ``state``: what a checkpoint holds (the model and optimizer state in a form DCP stages, writes and reads).
- ``verify``: the check every save passes before DCP writes it.
- ``staging``: the copy of an asynchronous save into CPU memory, beside the training loop.
- ``checkpointer``: the ``Checkpointer`` a training run saves and loads with (blocking and async saves,
  completion, pruning).

These are the durable checkpoints (``checkpoint.dir`` on the shared file system). Another tier with its own
placement (for example node-local saves copied to a partner node) belongs beside them as modules of its own,
reusing ``layout``, ``state`` and ``verify``.

Every module logs as ``training.checkpoint``. This file imports nothing: import the module you need.
"""
