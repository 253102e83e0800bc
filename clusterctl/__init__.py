"""clusterctl: the operator CLI of the P5 training cluster (quota, capacity, nodes, jobs, logs, cost)."""
