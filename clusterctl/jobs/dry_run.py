"""`clusterctl submit --dry-run`: what a submit would send, from the checked request alone. No AWS call (no
stack, no nodes, no credentials), so what only the stack knows is named, not guessed: the node count without
--nodes, the GPUs per node, the rendezvous host and the job id."""

from __future__ import annotations

import argparse
import dataclasses
from typing import TYPE_CHECKING

from cluster_aws.errors import EXIT_OK, EXIT_USAGE, ClusterctlError
from cluster_jobs.request import JobRequest
from clusterctl.render import to_json
from clusterctl.runtime import say, warn
from instance_catalog.instance_types import get_instance_type

if TYPE_CHECKING:
    from clusterctl.runtime import Runtime

# The settings a reader checks before a costly run, in the order shown (section.key of training.config).
KEY_SETTINGS = (
    "model.preset", "model.dim", "model.n_layers", "model.n_heads", "model.n_kv_heads", "model.vocab_size",
    "run.steps", "run.seq_len", "run.micro_batch_size", "run.grad_accum_steps", "run.global_batch_tokens",
    "parallel.dp_replicate", "parallel.dp_shard", "parallel.tp", "parallel.param_dtype",
    "parallel.activation_checkpointing", "parallel.compile", "fp8.backend",
    "data.source", "data.path", "optim.lr", "optim.warmup_steps", "checkpoint.interval_steps", "init.hf_dir",
    "export.hf_dir",
)
# What the jobs document's parameters hold that only the stack and the submit itself decide.
FROM_THE_STACK = {
    "jobId": "<assigned at submit: j-YYYYMMDD-HHMMSS-xxxx>",
    "nodes": "<the stack's NodeCount>",
    "gpusPerNode": "<the GPUs of the stack's InstanceType>",
    "rendezvousHost": "<the first ready node's private IP>",
}


def show(args: argparse.Namespace, runtime: Runtime, request: JobRequest) -> int:
    """Prints the checked request: the resolved config's key settings and the jobs document's parameters; with
    --nodes and --instance-type, the layout checked as a submit checks it."""
    if getattr(args, "instance_type", None) and request.nodes:
        request = dataclasses.replace(request, gpus_per_node=get_instance_type(args.instance_type).gpu_count)
    if request.local_config_path() is None and not getattr(args, "remote_path", False):
        # "valid" would claim a check that never ran (issue 44: a TOML with `stpes = 100` was called valid)
        raise ClusterctlError(f"dry run: {request.config}: not checked (no such file on this machine); pass "
                              "--remote-path if it is a path on the nodes (the --set items alone are then "
                              "checked)", EXIT_USAGE)
    layout = request.check_layout()  # refused in the trainer's words, exit 2, as a submit would be
    for warning in request.run_length_warnings():  # the trainer's start-up warnings, as a submit says them
        warn(runtime, warning)
    settings = key_settings(request)
    sent = parameters(request)
    if args.json:
        say(runtime, to_json({"dryRun": True, "config": request.config, "overrides": list(request.overrides),
                              "settings": settings, "parameters": sent,
                              **({"layout": layout.settings()} if layout else {})}))
        return EXIT_OK
    overrides = f" with --set {' '.join(request.overrides)}" if request.overrides else ""
    say(runtime, f"dry run: {request.config}{overrides} is valid; nothing was sent (no AWS call)")
    if settings is None:
        say(runtime, f"{request.config} is a path on the nodes: not read here (the --set items were checked on "
                     "their own)")
    else:
        say(runtime, "settings:")
        width = max(map(len, settings))
        for key, value in settings.items():
            say(runtime, f"  {key:<{width}}  {value!r}" if isinstance(value, str) else f"  {key:<{width}}  {value}")
    if layout is not None:
        say(runtime, f"layout: {layout.name} on {request.nodes} x {args.instance_type} (checked)")
    say(runtime, "jobs document parameters (one ssm:SendCommand per 50 nodes):")
    width = max(map(len, sent))
    for key, values in sent.items():
        say(runtime, f"  {key:<{width}}  {' '.join(values)}")
    return EXIT_OK


def key_settings(request: JobRequest) -> dict[str, object] | None:
    """section.key -> value of the resolved config; None for a config on the nodes (not readable here)."""
    config = request.resolved_config()
    if config is None:
        return None
    tables = config.to_dict()
    return {key: tables[key.split(".")[0]][key.split(".")[1]] for key in KEY_SETTINGS}


def parameters(request: JobRequest) -> dict[str, list[str]]:
    """The jobs document's parameters as submit would send them, with the stack's part named."""
    sent = request.parameters(FROM_THE_STACK["jobId"], FROM_THE_STACK["rendezvousHost"])
    sent["gpusPerNode"] = [FROM_THE_STACK["gpusPerNode"]]
    if not request.nodes:
        sent["nodes"] = [FROM_THE_STACK["nodes"]]
    return sent
