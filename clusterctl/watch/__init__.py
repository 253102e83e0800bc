"""`clusterctl top`: a live view of the cluster from CloudWatch metrics and the job table."""
