"""training: the FSDP2 + FP8 training package the nodes run (torchrun entry: python -m training).

Shipped to the nodes in the node bundle and run on the AMI's PyTorch. May import: instance_catalog (the GPU's
peak for MFU, optional). clusterctl and the job keeper import its config loader (training.config), which
imports no torch.
"""
