"""`clusterctl plan`: memory per GPU, nodes, time and cost per instance type for a training config, before
anything is bought. Needs no AWS access."""
