"""JobRunner in a bare Stack: the SSM document (parameters, patterns, script) and the operator policy."""

import re
import shlex
import subprocess

import aws_cdk as cdk
import pytest
from aws_cdk import aws_logs as logs
from aws_cdk.assertions import Match, Template

from cluster_constructs.jobs import PARAMETERS, JobRunner, build_job_script
from node_bootstrap import jobs as node_jobs

ASG_NAME = "training-cluster-nodes"


@pytest.fixture(scope="module")
def built():
    app = cdk.App()
    env = cdk.Environment(account="111122223333", region="us-east-1")
    stack = cdk.Stack(app, "TrainingClusterStack", env=env)
    log_group = logs.LogGroup(stack, "Logs", log_group_name="/training-cluster/TrainingClusterStack")
    runner = JobRunner(stack, "Jobs", log_group=log_group, auto_scaling_group_name=ASG_NAME)
    return stack, runner, Template.from_stack(stack)


def document_content(template):
    (document,) = template.find_resources("AWS::SSM::Document").values()
    return document["Properties"]["Content"]


def test_document_is_a_command_document_running_the_node_launcher(built):
    stack, runner, template = built
    template.resource_count_is("AWS::SSM::Document", 1)
    template.has_resource_properties("AWS::SSM::Document", {
        "DocumentType": "Command",
        "DocumentFormat": "JSON",
        "Name": Match.absent(),  # CloudFormation names it; clusterctl reads the JobDocumentName output
        "Content": Match.object_like({
            "schemaVersion": "2.2",
            "mainSteps": [Match.object_like({
                "action": "aws:runShellScript",
                "inputs": {"timeoutSeconds": "900", "runCommand": Match.any_value()},
            })],
        }),
    })
    assert stack.resolve(runner.document_name) == {"Ref": stack.get_logical_id(runner.document)}


def test_every_parameter_is_constrained(built):
    _, _, template = built
    parameters = document_content(template)["parameters"]
    assert set(parameters) == {"action", "jobId", "module", "config", "nodes", "gpusPerNode",
                               "rendezvousHost", "maxRestarts", "overrides", "cancelTimeoutSeconds"}
    assert parameters["action"]["allowedValues"] == ["start", "status", "cancel"]
    assert parameters["module"]["allowedValues"] == ["training", "training.commcheck"]
    assert parameters["module"]["default"] == "training"
    for name, spec in parameters.items():
        if name not in ("action", "module"):
            pattern = re.compile(spec["allowedPattern"])
            # A default must itself be allowed, or SSM would reject a status/cancel that omits it.
            assert "default" not in spec or pattern.match(spec["default"]), name


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("jobId", "j-1;reboot"), ("jobId", "$(id)"), ("jobId", "J-UPPER"),
        ("config", "a.toml; rm -rf /"), ("config", "`id`.toml"), ("config", "x.yaml"),
        ("rendezvousHost", "10.0.0.1 && id"), ("rendezvousHost", "$HOST"),
        ("overrides", "a=1;id"), ("overrides", "a=$(id)"), ("overrides", 'a="x y"'),
        ("overrides", "a=1  b=2"),
        ("overrides", "a=1\nid"), ("nodes", "0"), ("nodes", "1|id"), ("maxRestarts", "-1"),
        ("gpusPerNode", "8 "),
    ],
)
def test_patterns_reject_shell_metacharacters(name, value):
    # Python's re and SSM's Java regexes agree on these simple classes and anchors; fullmatch also rules
    # out Python's `$` matching before a trailing newline.
    assert not re.fullmatch(PARAMETERS[name]["allowedPattern"], value)


@pytest.mark.parametrize(
    ("name", "value"),
    [
        ("jobId", "j-20261120-231502-ab12"), ("config", "training/configs/llama3-8b.toml"), ("config", ""),
        ("config", "/fsx/configs/run_7.toml"), ("rendezvousHost", "10.0.12.34"), ("nodes", "16"),
        ("overrides", "optim.lr=3e-4 train.steps=1000 data.path=/fsx/data/tok-v2"), ("overrides", ""),
        ("overrides", "sizes_mib=64,1024 min_busbw_gbps=350.0 iters=20"),
        ("maxRestarts", "3"), ("cancelTimeoutSeconds", "120"), ("gpusPerNode", "8"),
    ],
)
def test_patterns_accept_what_clusterctl_sends(name, value):
    assert re.fullmatch(PARAMETERS[name]["allowedPattern"], value)


def render(script_lines, values):
    """SSM's substitution: each {{ name }} replaced by the parameter value, text for text."""
    script = "\n".join(script_lines)
    for name, spec in PARAMETERS.items():
        script = script.replace("{{ " + name + " }}", values.get(name, spec.get("default", "")))
    return script


def command_for(script, action):
    (line,) = [line for line in script.splitlines() if line.strip().startswith(action + ")")]
    words = shlex.split(line.split(")", 1)[1].rstrip(" ;"))
    assert words[:4] == ["exec", "python3", "-m", "node_bootstrap.jobs"]
    return words[4:]


def test_script_passes_every_parameter_to_the_node_launcher(built):
    _, _, template = built
    lines = document_content(template)["mainSteps"][0]["inputs"]["runCommand"]
    assert lines == build_job_script("/opt/cluster/bundle")
    values = {"action": "start", "jobId": "j-20261120-231502-ab12", "config": "training/configs/tiny.toml",
              "nodes": "4", "gpusPerNode": "8", "rendezvousHost": "10.0.1.17", "maxRestarts": "2",
              "overrides": "optim.lr=3e-4 train.steps=10", "cancelTimeoutSeconds": "60"}
    script = render(lines, values)
    assert "export PYTHONPATH=/opt/cluster/bundle" in script
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)

    parser = node_jobs.build_parser()
    start = parser.parse_args(command_for(script, "start"))
    assert (start.command, start.job_id, start.module, start.config, start.nodes, start.gpus_per_node,
            start.rendezvous_host, start.max_restarts, start.overrides) == (
        "start", "j-20261120-231502-ab12", "training", "training/configs/tiny.toml", 4, 8, "10.0.1.17", 2,
        "optim.lr=3e-4 train.steps=10")
    status = parser.parse_args(command_for(script, "status"))
    assert (status.command, status.job_id) == ("status", "j-20261120-231502-ab12")
    cancel = parser.parse_args(command_for(script, "cancel"))
    assert (cancel.command, cancel.job_id, cancel.timeout_seconds) == (
        "cancel", "j-20261120-231502-ab12", 60.0)


def test_script_starts_a_commcheck_without_a_config():
    values = {"action": "start", "jobId": "j-20261120-231502-cc01", "module": "training.commcheck",
              "nodes": "2", "rendezvousHost": "10.0.1.17", "maxRestarts": "0",
              "overrides": "sizes_mib=64,1024 min_busbw_gbps=350.0"}
    script = render(build_job_script("/opt/cluster/bundle"), values)
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    start = node_jobs.build_parser().parse_args(command_for(script, "start"))
    assert (start.module, start.config, start.nodes, start.gpus_per_node, start.max_restarts) == (
        "training.commcheck", "", 2, 8, 0)
    spec = node_jobs.JobSpec(job_id=start.job_id, config=start.config, nodes=start.nodes,
                             gpus_per_node=start.gpus_per_node, rendezvous_host=start.rendezvous_host,
                             max_restarts=start.max_restarts, overrides=tuple(start.overrides.split()),
                             module=start.module)
    spec.validate()  # what the node would accept
    assert node_jobs.build_option_args(spec.overrides) == [
        "--sizes-mib", "64,1024", "--min-busbw-gbps", "350.0"]


def test_script_with_defaults_parses_for_status(built):
    script = render(build_job_script("/opt/cluster/bundle"), {"action": "status", "jobId": "j-x-1"})
    subprocess.run(["bash", "-n"], input=script, text=True, check=True)
    start = node_jobs.build_parser().parse_args(command_for(script, "start"))
    assert (start.overrides, start.module) == ("", "training")


def statement(template, sid):
    (policy,) = template.find_resources("AWS::IAM::ManagedPolicy").values()
    matches = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if s.get("Sid") == sid]
    assert len(matches) == 1, sid
    return matches[0]


def test_operator_may_send_the_document_only_to_this_clusters_nodes(built):
    stack, runner, template = built
    template.resource_count_is("AWS::IAM::ManagedPolicy", 1)
    send_doc = statement(template, "SendJobDocument")
    assert send_doc["Action"] == "ssm:SendCommand"
    document_ref = {"Ref": stack.get_logical_id(runner.document)}
    assert send_doc["Resource"] == {"Fn::Join": ["", [
        "arn:", {"Ref": "AWS::Partition"}, ":ssm:us-east-1:111122223333:document/", document_ref]]}
    send_nodes = statement(template, "SendToClusterNodes")
    assert send_nodes["Action"] == "ssm:SendCommand"
    assert send_nodes["Condition"] == {
        "StringEquals": {"ssm:resourceTag/aws:autoscaling:groupName": ASG_NAME}}
    assert send_nodes["Resource"] == {"Fn::Join": ["", [
        "arn:", {"Ref": "AWS::Partition"}, ":ec2:us-east-1:111122223333:instance/*"]]}


def test_operator_reads_results_logs_stack_and_capacity(built):
    stack, _, template = built
    assert set(statement(template, "ReadCommandResults")["Action"]) == {
        "ssm:GetCommandInvocation", "ssm:ListCommandInvocations", "ssm:ListCommands"}
    logs_statement = statement(template, "ReadJobLogs")
    assert set(logs_statement["Action"]) == {"logs:FilterLogEvents", "logs:GetLogEvents",
                                             "logs:DescribeLogStreams"}
    (log_group_id,) = template.find_resources("AWS::Logs::LogGroup")
    assert logs_statement["Resource"] == {"Fn::GetAtt": [log_group_id, "Arn"]}
    stack_statement = statement(template, "ReadStackOutputs")
    assert stack_statement["Action"] == "cloudformation:DescribeStacks"
    assert stack_statement["Resource"]["Fn::Join"][1][-1] == (
        ":cloudformation:us-east-1:111122223333:stack/TrainingClusterStack/*")
    assert set(statement(template, "DescribeClusterAndCapacity")["Action"]) == {
        "autoscaling:DescribeAutoScalingGroups", "ec2:DescribeInstances", "ec2:DescribeInstanceTypes",
        "ec2:DescribeCapacityReservations", "ec2:DescribeCapacityBlockOfferings",
        "ec2:DescribeSpotPriceHistory", "pricing:GetProducts",
        "servicequotas:GetServiceQuota", "servicequotas:GetAWSDefaultServiceQuota"}
    purchase = statement(template, "PurchaseCapacityBlocks")
    assert purchase["Action"] == "ec2:PurchaseCapacityBlock"
    assert purchase["Resource"]["Fn::Join"][1][-1] == ":ec2:us-east-1:111122223333:capacity-reservation/*"


def test_custom_bundle_dir_reaches_the_script():
    stack = cdk.Stack(cdk.App(), "S")
    runner = JobRunner(stack, "Jobs", log_group=logs.LogGroup(stack, "L"), auto_scaling_group_name="asg",
                       bundle_dir="/srv/bundle")
    content = stack.resolve(runner.document.content)
    assert "export PYTHONPATH=/srv/bundle" in content["mainSteps"][0]["inputs"]["runCommand"]
