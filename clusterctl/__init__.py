"""clusterctl: the operator CLI of the P5 training cluster.

- cli.py: the parser and `main`, the one place errors become exit codes; runtime.py: what a command touches
  outside itself (Runtime) and the helpers every command shares; arguments.py: argparse value types;
  render.py: tables, JSON, times and prices for people.
- One package or module per command group, each adding its own subcommands (add_parsers):
  plan/ (plan: memory, MFU, time and cost per instance type), capacity/ (quota, capacity, cost),
  nodes.py (nodes), jobs/ (submit, commcheck, jobs, status, logs, cancel), watch/ (top).

May import: cluster_jobs, cluster_aws, cluster_spec, instance_catalog, training (its config loader and
shapes) and node_bootstrap (the jobs document's constants). Command modules import clusterctl.runtime, never
clusterctl.cli. Nothing else in the project imports clusterctl.
"""
