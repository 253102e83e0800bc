"""cluster_constructs: the CDK constructs the stack wires, one per logical unit (network, capacity, storage,
compute, node config, jobs document, job keeper, observability, dashboard), and the staging of the two code
assets (bundle.py).

May import: cluster_spec (each construct takes only its own typed settings), instance_catalog and
node_bootstrap (the jobs document's parameters). Never stacks, which imports it.
"""
