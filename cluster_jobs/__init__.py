"""cluster_jobs: the job model, shared by clusterctl (submit, status, cancel) and the job keeper (restarts).

- request.py: a job's id and the request the nodes get, validated with the trainer's own config loader;
- table.py: the job table in DynamoDB, its records and the one-job lock (conditional writes);
- records.py: how a record changes (started, failed, cancelled, node answers copied in, cost so far);
- ssm_commands.py: one command to many nodes through SSM Run Command, and the nodes' JSON answers;
- node_states.py: a job as its nodes report it, and the job's overall state;
- document.py: the stack's jobs document: start a job on its nodes, find it in SSM's history, ask or stop it;
- cost.py: what nodes cost over time, from the instance catalog's on-demand prices.

May import: cluster_aws, instance_catalog, node_bootstrap (the jobs document's contract, node_bootstrap.jobs)
and training (training.config, which imports no torch). Never clusterctl or job_keeper, which import it.
"""
