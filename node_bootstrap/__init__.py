"""node_bootstrap: turns a freshly booted GPU instance into a cluster node, and verifies nodes later.

Runs on the node's system Python (>= 3.9, standard library only) from the bundle user-data unpacks at
/opt/cluster/bundle. `python3 -m node_bootstrap run` is the boot sequence (bootstrap.py lists the steps);
`python3 -m node_bootstrap check` is the health check users run before a costly job. docs/node-bootstrap.md
describes both.

Imports nothing else of the project (the bottom floor; tests/test_architecture.py holds it to that).
"""
