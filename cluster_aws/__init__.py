"""cluster_aws: talking to a deployed cluster through the AWS APIs, shared by clusterctl and the job keeper.

- session.py: one boto3 session and its clients (the seam tests fill with moto or stubbed clients);
- errors.py: ClusterctlError and the mapping of AWS errors to one-line messages with documented exit codes;
- stack_outputs.py: the stack's CloudFormation outputs (group, job table, log group, documents, ...);
- nodes.py: the Auto Scaling group's nodes, their health and readiness tags, and which are ready for a job.

May import: nothing of this project (boto3 and the standard library).
"""
