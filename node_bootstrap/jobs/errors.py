"""How a job command fails: its exit codes, and the error whose message it prints as one line. Both are part of
the job contract with the cluster (node_bootstrap/job_contract.py), which defines them."""

from node_bootstrap.job_contract import EXIT_FAILED, EXIT_NOT_FOUND, EXIT_OK, EXIT_USAGE, JobError

__all__ = ["EXIT_FAILED", "EXIT_NOT_FOUND", "EXIT_OK", "EXIT_USAGE", "JobError"]
