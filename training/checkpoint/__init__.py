"""Checkpoints: sharded saves of the model and optimizer state with torch.distributed.checkpoint (DCP).

One concept per module; imports point down this list and never back up:

- ``layout``: the on-disk layout of a checkpoint directory (``step-<N>``, the ``train_state.json`` marker),
  when a checkpoint is complete, the newest complete one; no torch.
- ``compat``: which config changes a resume can take (its saved config against the run's), and whether the
  learning-rate schedule still continues the one that ran.
- ``resume``: which checkpoint a run starts from (``--resume``, ``--resume-from-dir``), and whether a start
  may save into a checkpoint.dir that holds newer checkpoints (``--overwrite-checkpoints``).
- ``state``: what a checkpoint holds (the model and optimizer state in a form DCP stages, writes and reads).
- ``verify``: the check every save passes before DCP writes it.
- ``staging``: the copy of an asynchronous save into CPU memory, beside the training loop.
- ``checkpointer``: the ``Checkpointer`` a training run saves and loads with (blocking and async saves,
  completion, pruning).

These are the durable checkpoints (``checkpoint.dir`` on the shared file system). The local tier (each rank's
shard on its node's own storage, a replica on the next node) reuses ``layout``, ``state``, ``verify`` and
``staging`` in modules of its own:

- ``local_layout``: its on-disk layout (``step-<N>/rank-<R>/``, the ``shard.json`` marker with a sha256 per
  file), what a node holds, pruning; no torch.
- ``shard_transfer``: one shard from rank to rank over gloo (the replica ring, a resume's fetches).
- ``local_tier``: the ``LocalCheckpointer`` that saves, replicates and counts local steps.
- ``local_resume``: which local step a restart takes, fetching what a node lacks, and the load.

Every module logs as ``training.checkpoint``. This file imports nothing: import the module you need.
"""
