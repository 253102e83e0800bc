"""cluster_jobs: the job model, shared by clusterctl (submit, status, cancel) and the job keeper (restarts).

- job_parameters.py: what the nodes are asked to run (the jobs document's parameters), checked against the job
  contract; what the keeper's restarts send;
- request.py: a job's id and the request a submit makes: the parameters, validated with the trainer's own
  config loader too;
- table.py: the job table in DynamoDB, its records and the one-job lock (conditional writes);
- records.py: how a record changes (started, failed, cancelled, node answers copied in, cost so far);
- ssm_commands.py: one command to many nodes through SSM Run Command, and the nodes' JSON answers;
- node_answer.py: the one parser, with its schema, of what a node answers (what a job printed is untrusted);
- node_states.py: a job as its nodes report it (through node_answer), and the job's overall state;
- record_schema.py: a record read back from the table, each value checked against its field's type;
- document.py: the stack's jobs document: start a job on its nodes, find it in SSM's history, ask or stop it;
- cost.py: what nodes cost over time, from the instance catalog's on-demand prices.

May import: cluster_aws, instance_catalog, node_bootstrap (the job contract, node_bootstrap/job_contract.py;
records.py also node_bootstrap.jobs' paths) and training (request.py: training.config, which imports no torch).
Never clusterctl or job_keeper, which import it. The keeper ships only the modules it imports (the contract,
not node_bootstrap.jobs nor training): a module the keeper imports stays off those two.
"""
