"""`clusterctl nodes`: the cluster's nodes (id, private IP, AZ, lifecycle, health, bootstrap readiness) from its
Auto Scaling group and their tags."""

from __future__ import annotations

import argparse

from cluster_aws.errors import EXIT_OK
from cluster_aws.nodes import list_nodes
from clusterctl.arguments import AddCommand
from clusterctl.render import format_table, to_json
from clusterctl.runtime import Runtime, say, stack_outputs


def nodes(args: argparse.Namespace, runtime: Runtime) -> int:
    assert runtime.context is not None
    outputs = stack_outputs(args, runtime)
    found = list_nodes(
        runtime.context.client("autoscaling"), runtime.context.client("ec2"), outputs.auto_scaling_group_name
    )
    if args.json:
        say(
            runtime,
            to_json([{**n.__dict__, "ready": n.ready, "notReadyReason": n.not_ready_reason} for n in found]),
        )
        return EXIT_OK
    rows = [
        (
            n.instance_id,
            n.private_ip,
            n.availability_zone,
            n.lifecycle_state,
            n.health_status,
            n.bootstrap or "-",
            "yes" if n.ready else f"no: {n.not_ready_reason}",
        )
        for n in found
    ]
    if rows:
        say(
            runtime,
            format_table(("INSTANCE", "PRIVATE IP", "AZ", "LIFECYCLE", "HEALTH", "BOOTSTRAP", "READY"), rows),
        )
    ready = sum(n.ready for n in found)
    spares = f" for jobs + {outputs.spare_nodes} spare" if outputs.spare_nodes else ""
    say(
        runtime,
        f"{ready} of {outputs.group_size} nodes ready ({outputs.stack_name}: {outputs.node_count} x "
        f"{outputs.instance_type}{spares}, capacity {outputs.capacity_mode})",
    )
    return EXIT_OK


def add_parsers(add: AddCommand) -> None:
    """`nodes`."""
    nodes_parser = add(
        "nodes", "The cluster's nodes: id, private IP, AZ, lifecycle, health and bootstrap readiness.",
        example="clusterctl nodes --stack TrainingClusterStack",
    )
    nodes_parser.set_defaults(handler=nodes)
