"""job_keeper: the job keeper, a Lambda function that keeps the cluster's running job alive without a person
(docs/architecture.md, "The job keeper").

- keeper.py: one reconcile round: read the job table, the group and the nodes' answers, and act on the
  difference (a lost or hung node: stop the survivors, wait for full strength, start the next attempt);
- settings.py: what a round is given (the stack's names, the clients, its trigger) and what it returns;
- handler.py: the Lambda entry point (job_keeper.handler.handler), which builds the keeper from its environment.

May import: cluster_jobs and cluster_aws (and, through them, node_bootstrap's job contract). Its Lambda asset
holds exactly the modules the handler imports, directly or not (cluster_constructs/bundle.py, KEEPER_CODE;
tests/test_architecture.py): not clusterctl, not the nodes' launcher, not the trainer.
"""
