"""The job commands: submit and commcheck, jobs, status, logs and cancel, on the job model in cluster_jobs."""
