"""instance_catalog: per-instance-type facts (GPUs, memory, EFA interfaces, NVMe, peak TFLOP/s, price), the
project's single source of truth for them (instance_types.py).

The bottom floor: imports nothing of this project, standard library only, Python >= 3.9, because it is shipped
to the nodes in the node bundle (training reads the GPU peak for MFU) and to the job keeper. Everything above
imports it: cluster_spec, cluster_constructs, training, cluster_jobs, clusterctl.
"""
