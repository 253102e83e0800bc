"""The parallelism, apart from the model (torchtitan's distributed/): the process groups (process_group), the
layout's degrees and what can run (layout: no torch, clusterctl checks a job with it), the named device mesh
(mesh), and what is applied to the plain model, in one order (parallelize: tensor parallelism, activation
checkpointing, compile, FSDP2).
"""
