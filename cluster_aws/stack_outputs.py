"""The deployed stack's outputs (docs/architecture.md section 6): everything clusterctl knows about a
cluster comes from here, so it never needs its own configuration file."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

import botocore.exceptions

from cluster_aws.errors import EXIT_STACK, ClusterctlError

DEFAULT_STACK_NAME = "TrainingClusterStack"
REQUIRED_OUTPUTS = (
    "AutoScalingGroupName",
    "LogGroupName",
    "JobDocumentName",
    "InstanceType",
    "NodeCount",
    "CapacityMode",
)
# The job table's outputs (cluster_constructs: the job keeper). A stack deployed before them has neither: then
# submit refuses (redeploy), and status and cancel find jobs in SSM's command history as before.
JOB_TABLE_OUTPUT = "JobTableName"
MAX_JOB_RESTARTS_OUTPUT = "MaxJobRestarts"
# The node config's training.checkpointRoot: a job's record names its checkpoint directory from it
# (node_bootstrap.jobs.checkpoint_dir). A stack deployed before this output has none: the record's is then "".
CHECKPOINT_ROOT_OUTPUT = "CheckpointRoot"
# The fp8.backend values the nodes' training environment provides ("none,torchao"), from the training lock the
# bundle carries. A stack deployed before this output has none: nothing is checked then.
FP8_BACKENDS_OUTPUT = "Fp8Backends"
# The spareNodes setting: the group holds NodeCount + SpareNodes nodes (0 when a stack predates the output).
SPARE_NODES_OUTPUT = "SpareNodes"


@dataclass(frozen=True)
class StackOutputs:
    stack_name: str
    region: str
    auto_scaling_group_name: str
    log_group_name: str
    job_document_name: str
    instance_type: str
    node_count: int  # the nodes a job runs on (the nodeCount setting)
    capacity_mode: str  # on-demand, odcr or capacity-block
    outputs: dict[str, str]  # every output, for the rest (bucket names, FSx ids)
    job_table_name: str | None = None  # None: the stack predates the job table
    max_job_restarts: int | None = None  # the keeper's restarts of a job on a new node set (maxJobRestarts)

    @property
    def checkpoint_root(self) -> str | None:
        return self.outputs.get(CHECKPOINT_ROOT_OUTPUT) or None

    @property
    def spare_nodes(self) -> int:
        """Hot spares the group holds beyond a job's nodes (0 for a stack deployed before the output)."""
        value = self.outputs.get(SPARE_NODES_OUTPUT, "0")
        return int(value) if value.isdigit() else 0

    @property
    def group_size(self) -> int:
        """Every node the Auto Scaling group holds: a job's nodes and the spares."""
        return self.node_count + self.spare_nodes

    @property
    def fp8_backends(self) -> tuple[str, ...] | None:
        value = self.outputs.get(FP8_BACKENDS_OUTPUT)
        return tuple(b for b in value.split(",") if b) if value else None


def read_stack_outputs(cloudformation: Any, stack_name: str, region: str | None) -> StackOutputs:
    try:
        response = cloudformation.describe_stacks(StackName=stack_name)
    except botocore.exceptions.ClientError as e:
        error = e.response.get("Error", {})
        # CloudFormation answers a missing stack with ValidationError "Stack with id X does not exist".
        if error.get("Code") == "ValidationError" and "does not exist" in error.get("Message", ""):
            raise ClusterctlError(
                f"stack {stack_name} is not deployed in {region} (deploy it with `cdk deploy`, or pass "
                "--region/--stack)",
                EXIT_STACK,
            ) from None
        raise
    stack = response["Stacks"][0]
    outputs = {o["OutputKey"]: o["OutputValue"] for o in stack.get("Outputs", [])}
    missing = [key for key in REQUIRED_OUTPUTS if key not in outputs]
    if missing:
        raise ClusterctlError(
            f"stack {stack_name} ({stack['StackStatus']}) has no output {', '.join(missing)}: wait for the "
            "deployment to finish, or redeploy with this version",
            EXIT_STACK,
        )
    node_count = _number(stack_name, outputs, "NodeCount")
    job_table_name = outputs.get(JOB_TABLE_OUTPUT) or None
    max_job_restarts = None
    if job_table_name is not None:
        if MAX_JOB_RESTARTS_OUTPUT not in outputs:
            raise ClusterctlError(
                f"stack {stack_name} ({stack['StackStatus']}) has output {JOB_TABLE_OUTPUT} but no "
                f"{MAX_JOB_RESTARTS_OUTPUT}: wait for the deployment to finish, or redeploy with this version",
                EXIT_STACK,
            )
        max_job_restarts = _number(stack_name, outputs, MAX_JOB_RESTARTS_OUTPUT)
    return StackOutputs(
        stack_name=stack_name,
        region=region or "",
        auto_scaling_group_name=outputs["AutoScalingGroupName"],
        log_group_name=outputs["LogGroupName"],
        job_document_name=outputs["JobDocumentName"],
        instance_type=outputs["InstanceType"],
        node_count=node_count,
        capacity_mode=outputs["CapacityMode"],
        outputs=outputs,
        job_table_name=job_table_name,
        max_job_restarts=max_job_restarts,
    )


def _number(stack_name: str, outputs: dict[str, str], key: str) -> int:
    try:
        return int(outputs[key])
    except ValueError:
        raise ClusterctlError(
            f"stack {stack_name}: output {key}={outputs[key]!r} is not a number", EXIT_STACK
        ) from None
