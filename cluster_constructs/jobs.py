"""JobRunner: the SSM Command document that starts, inspects and cancels training jobs on the nodes, and the
managed policy an operator needs to drive the cluster with clusterctl.

Buying a Capacity Block is not in the operator policy: that takes the purchaser policy too
(cluster_constructs/capacity_purchase.py).

The document only calls the node_bootstrap.jobs package (docs/architecture.md section 5). Its parameters reach
the script as environment variables, never as script text: every parameter has `"interpolationType":
"ENV_VAR"`, so the SSM agent sets SSM_<name> to the value and the script passes "$SSM_<name>" to the node
launcher as one quoted word (SSM documents, "Data elements and parameters": "When set to ENV_VAR, the system
creates an environment variable named SSM_parameter-name containing the parameter value"; SSM Agent >=
3.3.2746.0). Every parameter also keeps an allowedPattern or allowedValues, so SSM rejects a bad value before
anything runs; the patterns are node_bootstrap.jobs' own validation expressions, one definition for the
document and the node.
"""

from __future__ import annotations

import shlex
from typing import Any

from aws_cdk import Stack
from aws_cdk import aws_iam as iam
from aws_cdk import aws_logs as logs
from aws_cdk import aws_ssm as ssm
from constructs import Construct

from node_bootstrap import jobs as node_jobs

DEFAULT_BUNDLE_DIR = "/opt/cluster/bundle"
# aws:runShellScript's own limit for one invocation: node_bootstrap.jobs derives the longest `cancel` wait
# from it (MAX_CANCEL_TIMEOUT_SECONDS), so a cancel is never cut off by the step.
COMMAND_TIMEOUT_SECONDS = node_jobs.COMMAND_TIMEOUT_SECONDS
ENV_PREFIX = "SSM_"  # the agent's variable for parameter P is SSM_P
MIN_AGENT_VERSION = "3.3.2746.0"  # the first SSM agent that sets SSM_<name> for ENV_VAR parameters
# clusterctl's item actions on the job table (cluster_jobs/table.py): get (status, cancel, top), the whole-item
# puts and the lock's delete (submit and cancel write some in TransactWriteItems, which IAM authorizes per item
# action: Put, Delete), and Scan for the job list (`clusterctl jobs`). No ConditionCheck item is ever written.
OPERATOR_TABLE_ACTIONS = ("dynamodb:GetItem", "dynamodb:PutItem", "dynamodb:DeleteItem", "dynamodb:Scan")
# The highest attempt number the document accepts: the keeper restarts a job at most maxJobRestarts (<= 100)
# times, so a real job stays far below it; the bound only keeps the value a small number.
MAX_JOB_ATTEMPT = 1000


def _whole(pattern: str) -> str:
    """A node_bootstrap.jobs expression, anchored (they are written anchored already)."""
    assert pattern.startswith("^") and pattern.endswith("$"), pattern
    return pattern


def _optional(pattern: str) -> str:
    """The same expression, also matching the empty default of an action that does not use it."""
    return "^(" + _whole(pattern)[1:-1] + ")?$"


def integer_pattern(maximum: int, *, minimum: int = 0) -> str:
    """An anchored expression for the decimal integers minimum..maximum (no sign, no leading zeros); minimum is
    0 or 1."""
    if minimum not in (0, 1) or maximum < minimum:
        raise ValueError(f"integer_pattern covers {minimum}..{maximum}: minimum must be 0 or 1, maximum >= it")
    digits = str(maximum)
    if len(digits) == 1:
        return f"^[{minimum}-{digits}]$"
    shorter = [f"[{minimum}-9]"] + [f"[1-9][0-9]{{{n - 1}}}" for n in range(2, len(digits))]
    same_length = []
    for i, digit in enumerate(digits):
        low = 1 if i == 0 else 0
        if int(digit) > low:
            rest = len(digits) - i - 1
            upper = int(digit) - 1
            digit_class = f"[{low}-{upper}]" if upper > low else str(low)
            same_length.append(digits[:i] + digit_class + (f"[0-9]{{{rest}}}" if rest else ""))
    same_length.append(digits)
    return "^(" + "|".join(shorter + same_length) + ")$"


_OVERRIDE = node_jobs.OVERRIDE_RE.pattern[1:-1]

PARAMETERS: dict[str, dict[str, Any]] = {
    "action": {
        "type": "String",
        "description": "start: launch torchrun detached; status: print the job's state; cancel: SIGTERM, "
        "wait, then kill.",
        "allowedValues": ["start", "status", "cancel"],
    },
    "jobId": {
        "type": "String",
        "description": "Job id (clusterctl makes j-YYYYMMDD-HHMMSS-xxxx).",
        "allowedPattern": _whole(node_jobs.JOB_ID_RE.pattern),
    },
    "module": {
        "type": "String",
        "description": "start: what the job runs: training (the trainer) or training.commcheck (the "
        "all_reduce bandwidth check) under torchrun, or training.export (one process on one node: resumeFrom's "
        "checkpoint to a Hugging Face directory in this job's checkpoint directory).",
        "default": node_jobs.TRAINING_MODULE,
        "allowedValues": list(node_jobs.MODULES),
    },
    "config": {
        "type": "String",
        "description": "start: training TOML, relative to the bundle dir (training/configs/X.toml) or "
        "absolute; empty for training.commcheck.",
        "default": "",
        "allowedPattern": _optional(node_jobs.CONFIG_RE.pattern),
    },
    "nodes": {
        "type": "String",
        "description": "start: torchrun --nnodes.",
        "default": "1",
        "allowedPattern": "^[1-9][0-9]{0,3}$",
    },
    "gpusPerNode": {
        "type": "String",
        "description": "start: torchrun --nproc-per-node.",
        "default": "8",
        "allowedPattern": "^[1-9][0-9]?$",
    },
    "rendezvousHost": {
        "type": "String",
        "description": "start: private IP of the node that hosts the c10d rendezvous.",
        "default": "",
        "allowedPattern": _optional(node_jobs.HOST_RE.pattern),
    },
    "maxRestarts": {
        "type": "String",
        "description": "start: torchrun --max-restarts.",
        "default": "3",
        "allowedPattern": "^[0-9]{1,2}$",
    },
    "overrides": {
        "type": "String",
        "description": "start: space-separated key=value items: training overrides (passed as --set "
        "key=value), training.commcheck options (min_busbw_gbps=350 is passed as --min-busbw-gbps 350), or "
        "training.export's step=N.",
        "default": "",
        "allowedPattern": f"^({_OVERRIDE}( {_OVERRIDE})*)?$",
    },
    "resumeFrom": {
        "type": "String",
        "description": "start, training: another job's id; the job starts from the newest complete checkpoint "
        "in that job's directory when its own has none (it saves only to its own). Empty: only its own. "
        "training.export: the job whose checkpoint it exports.",
        "default": "",
        "allowedPattern": _optional(node_jobs.JOB_ID_RE.pattern),
    },
    "attempt": {
        "type": "String",
        "description": f"start: the job's attempt number, 1-{MAX_JOB_ATTEMPT}: 1 for a submit; the job keeper "
        "restarts a job on a new node set as attempt 2, 3, ... under the same job id.",
        "default": "1",
        "allowedPattern": integer_pattern(MAX_JOB_ATTEMPT, minimum=1),
    },
    "cancelTimeoutSeconds": {
        "type": "String",
        "description": f"cancel: seconds between SIGTERM and SIGKILL, 0-{node_jobs.MAX_CANCEL_TIMEOUT_SECONDS}.",
        "default": str(node_jobs.STOP_GRACE_SECONDS),
        "allowedPattern": integer_pattern(node_jobs.MAX_CANCEL_TIMEOUT_SECONDS),
    },
    "cancelMode": {
        "type": "String",
        "description": "cancel: save (the trainer's checkpoint after SIGTERM) or abort (SIGKILL at once, no "
        "checkpoint: the job keeper stopping the survivors of an attempt that lost a node).",
        "default": node_jobs.CANCEL_SAVE,
        "allowedValues": list(node_jobs.CANCEL_MODES),
    },
}
for _spec in PARAMETERS.values():
    _spec["interpolationType"] = "ENV_VAR"  # values reach the script as SSM_<name>, never as its text

# The node launcher's options, in order, for each action: (option, parameter).
ACTION_OPTIONS: dict[str, tuple[tuple[str, str], ...]] = {
    "start": (
        ("--job-id", "jobId"),
        ("--module", "module"),
        ("--config", "config"),
        ("--nodes", "nodes"),
        ("--gpus-per-node", "gpusPerNode"),
        ("--rendezvous-host", "rendezvousHost"),
        ("--max-restarts", "maxRestarts"),
        ("--overrides", "overrides"),
        ("--resume-from", "resumeFrom"),
        ("--attempt", "attempt"),
    ),
    "status": (("--job-id", "jobId"),),
    "cancel": (("--job-id", "jobId"), ("--timeout-seconds", "cancelTimeoutSeconds"), ("--mode", "cancelMode")),
}


def build_job_script(bundle_dir: str) -> list[str]:
    """The runShellScript lines. Parameters are read from SSM_<name> and passed as quoted words: whatever a
    value holds, bash never parses it."""
    jobs_cli = "python3 -m node_bootstrap.jobs"
    no_env = (
        f"this node's SSM agent did not pass the document's parameters as environment variables "
        f"(interpolationType ENV_VAR needs SSM Agent >= {MIN_AGENT_VERSION}): update amazon-ssm-agent"
    )
    lines = [
        "#!/bin/bash",
        "set -euo pipefail",
        f'if [ -z "${{{ENV_PREFIX}action+x}}" ]; then',
        "  printf '%s\\n' " + shlex.quote('{"error": "' + no_env + '"}'),
        f"  echo {shlex.quote('error: ' + no_env)} >&2",
        f"  exit {node_jobs.EXIT_USAGE}",
        "fi",
        f"export PYTHONPATH={shlex.quote(bundle_dir)}",
        f'case "${ENV_PREFIX}action" in',
    ]
    for action, options in ACTION_OPTIONS.items():
        words = " ".join(f'{option} "${ENV_PREFIX}{parameter}"' for option, parameter in options)
        lines.append(f"  {action}) exec {jobs_cli} {action} {words} ;;")
    lines.append("esac")
    return lines


def build_document_content(bundle_dir: str) -> dict[str, Any]:
    return {
        "schemaVersion": "2.2",
        "description": "Start, inspect or cancel a training job on the cluster nodes (node_bootstrap.jobs). "
        "Jobs run detached in a systemd unit, beyond Run Command's 48 h limit; logs go to CloudWatch Logs.",
        "parameters": PARAMETERS,
        "mainSteps": [
            {
                "action": "aws:runShellScript",
                "name": "trainingJob",
                "precondition": {"StringEquals": ["platformType", "Linux"]},
                "inputs": {
                    "timeoutSeconds": str(COMMAND_TIMEOUT_SECONDS),
                    "runCommand": build_job_script(bundle_dir),
                },
            }
        ],
    }


class JobRunner(Construct):
    """The jobs document (`document`, `document_name`) and the operators' policy (`operator_policy`).

    The document has no fixed name: CloudFormation names it, and a content change replaces it under a new
    name (a fixed name would make the replacement collide with the old document). clusterctl always reads
    the current name from the stack output JobDocumentName.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        log_group: logs.ILogGroup,
        auto_scaling_group_name: str,
        bundle_dir: str = DEFAULT_BUNDLE_DIR,
    ) -> None:
        super().__init__(scope, construct_id)
        stack = Stack.of(self)

        self.document = ssm.CfnDocument(
            self,
            "Document",
            document_type="Command",
            document_format="JSON",
            target_type="/AWS::EC2::Instance",
            content=build_document_content(bundle_dir),
        )
        self.document_name: str = self.document.ref

        document_arn = stack.format_arn(service="ssm", resource="document", resource_name=self.document_name)
        instance_arn = stack.format_arn(service="ec2", resource="instance", resource_name="*")
        stack_arn = stack.format_arn(service="cloudformation", resource="stack",
                                     resource_name=f"{stack.stack_name}/*")
        self.operator_policy = iam.ManagedPolicy(
            self,
            "OperatorPolicy",
            # Buying a Capacity Block is not in it: that is the purchaser policy's (capacity_purchase.py). The
            # description stays as it was: a new one would replace the policy, and its ARN, under attached roles.
            description="clusterctl: quota, capacity, nodes, submit/status/cancel/logs for this cluster",
            statements=[
                iam.PolicyStatement(
                    sid="SendJobDocument",
                    actions=["ssm:SendCommand"],
                    resources=[document_arn],
                ),
                iam.PolicyStatement(
                    # Only this cluster's nodes: the Auto Scaling group tags its instances with its name.
                    sid="SendToClusterNodes",
                    actions=["ssm:SendCommand"],
                    resources=[instance_arn],
                    conditions={
                        "StringEquals": {"ssm:resourceTag/aws:autoscaling:groupName": auto_scaling_group_name}
                    },
                ),
                iam.PolicyStatement(
                    # These SSM reads do not support resource-level permissions (Service Authorization
                    # Reference, "Actions defined by AWS Systems Manager").
                    sid="ReadCommandResults",
                    actions=["ssm:GetCommandInvocation", "ssm:ListCommandInvocations", "ssm:ListCommands"],
                    resources=["*"],
                ),
                iam.PolicyStatement(
                    sid="ReadJobLogs",
                    actions=["logs:FilterLogEvents", "logs:GetLogEvents", "logs:DescribeLogStreams"],
                    resources=[log_group.log_group_arn],
                ),
                iam.PolicyStatement(
                    sid="ReadStackOutputs",
                    actions=["cloudformation:DescribeStacks"],
                    resources=[stack_arn],
                ),
                iam.PolicyStatement(
                    # These Describe* calls, Service Quotas reads, Capacity Block offerings, the Spot price
                    # history and the Price List take no resource ARN (Service Authorization Reference: EC2,
                    # Auto Scaling, Service Quotas, AWS Price List). `clusterctl capacity prices` reads the last
                    # two.
                    sid="DescribeClusterAndCapacity",
                    actions=[
                        "autoscaling:DescribeAutoScalingGroups",
                        "ec2:DescribeInstances",
                        "ec2:DescribeInstanceTypes",
                        "ec2:DescribeCapacityReservations",
                        "ec2:DescribeCapacityBlockOfferings",
                        "ec2:DescribeSpotPriceHistory",
                        "pricing:GetProducts",
                        "servicequotas:GetServiceQuota",
                        "servicequotas:GetAWSDefaultServiceQuota",
                    ],
                    resources=["*"],
                ),
                iam.PolicyStatement(
                    # clusterctl top: the nodes' and the trainer's metrics. CloudWatch metric reads take no
                    # resource ARN (Service Authorization Reference, "Actions defined by Amazon CloudWatch").
                    # ListMetrics finds the job on a stack without the job table; it stays for a clusterctl
                    # older than the table's use in `top`, which still finds the job that way.
                    sid="ReadClusterMetrics",
                    actions=["cloudwatch:GetMetricData", "cloudwatch:ListMetrics"],
                    resources=["*"],
                ),
            ],
        )

    def allow_job_table(self, table_arn: str) -> None:
        """Operators may read and write the job table (clusterctl submit, jobs, status, cancel; top reads the
        lock and the active job with GetItem), on that table only."""
        self.operator_policy.add_statements(
            iam.PolicyStatement(sid="JobRecords", actions=list(OPERATOR_TABLE_ACTIONS), resources=[table_arn])
        )
