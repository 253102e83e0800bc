"""JobRunner in a bare Stack: the SSM document (parameters, patterns, script) and the operator policy."""

import json
import re
import subprocess

import aws_cdk as cdk
import pytest
from aws_cdk import aws_logs as logs
from aws_cdk.assertions import Match, Template

from cluster_constructs.jobs import MAX_JOB_ATTEMPT, PARAMETERS, JobRunner, build_job_script, integer_pattern
from node_bootstrap import jobs as node_jobs

ASG_NAME = "training-cluster-nodes"
JOB_TABLE_ARN = "arn:aws:dynamodb:us-east-1:111122223333:table/TrainingClusterStack-JobKeeperTable-X1"


def parse_node_args(argv):
    """node_bootstrap.jobs' own parser on the argv the script hands it: nothing is left over."""
    args, unknown = node_jobs.build_parser().parse_known_args(argv)
    assert unknown == [], unknown
    return args


@pytest.fixture(scope="module")
def built():
    app = cdk.App()
    env = cdk.Environment(account="111122223333", region="us-east-1")
    stack = cdk.Stack(app, "TrainingClusterStack", env=env)
    log_group = logs.LogGroup(stack, "Logs", log_group_name="/training-cluster/TrainingClusterStack")
    runner = JobRunner(stack, "Jobs", log_group=log_group, auto_scaling_group_name=ASG_NAME)
    runner.allow_job_table(JOB_TABLE_ARN)
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
                               "rendezvousHost", "maxRestarts", "overrides", "resumeFrom", "attempt",
                               "cancelTimeoutSeconds", "cancelMode"}
    assert parameters["action"]["allowedValues"] == ["start", "status", "cancel"]
    assert parameters["cancelMode"]["allowedValues"] == ["save", "abort"]
    assert parameters["cancelMode"]["default"] == "save"  # a cancel that omits it saves a checkpoint
    assert parameters["module"]["allowedValues"] == ["training", "training.commcheck", "training.export"]
    assert parameters["module"]["default"] == "training"
    for name, spec in parameters.items():
        if name not in ("action", "module", "cancelMode"):
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
        ("gpusPerNode", "8 "), ("cancelTimeoutSeconds", "999"), ("cancelTimeoutSeconds", "681"),
        ("resumeFrom", "../j-1"), ("resumeFrom", "j-1;id"),
        ("attempt", "0"), ("attempt", "01"), ("attempt", "1001"), ("attempt", "-1"), ("attempt", "2;id"),
        ("attempt", ""),
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
        ("maxRestarts", "3"), ("cancelTimeoutSeconds", "120"), ("cancelTimeoutSeconds", "0"),
        ("gpusPerNode", "8"), ("resumeFrom", ""), ("resumeFrom", "j-20261119-101500-0a0b"),
        ("attempt", "1"), ("attempt", "2"), ("attempt", "1000"),
    ],
)
def test_patterns_accept_what_clusterctl_sends(name, value):
    assert re.fullmatch(PARAMETERS[name]["allowedPattern"], value)


# A python3 that records the argv the script hands it: what node_bootstrap.jobs would receive.
RECORDING_PYTHON = """#!/bin/sh
printf '%s\\0' "$@" > "$ARGV_FILE"
"""


def run_script(tmp_path, values, lines=None, env_prefix="SSM_"):
    """Runs the document's script as the SSM agent does with interpolationType ENV_VAR: every parameter (its
    value, else its default) in the environment as SSM_<name>. Returns the node launcher's argv after
    `-m node_bootstrap.jobs`, or None when it was not called, and the completed process."""
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir(exist_ok=True)
    (bin_dir / "python3").write_text(RECORDING_PYTHON)
    (bin_dir / "python3").chmod(0o755)
    argv_file = tmp_path / "argv"
    argv_file.unlink(missing_ok=True)
    env = {"PATH": f"{bin_dir}:/usr/bin:/bin", "ARGV_FILE": str(argv_file)}
    for name, spec in PARAMETERS.items():
        value = values.get(name, spec.get("default"))
        if value is not None:
            env[env_prefix + name] = value
    script = "\n".join(lines or build_job_script("/opt/cluster/bundle")) + "\n"
    done = subprocess.run(["bash", "-c", script], env=env, capture_output=True, text=True, timeout=30,
                          cwd=tmp_path)
    if not argv_file.exists():
        return None, done
    argv = argv_file.read_text().split("\0")[:-1]
    assert argv[:2] == ["-m", "node_bootstrap.jobs"], argv
    return argv[2:], done


def test_every_parameter_reaches_the_script_as_an_environment_variable(built):
    _, _, template = built
    content = document_content(template)
    assert {spec["interpolationType"] for spec in content["parameters"].values()} == {"ENV_VAR"}
    script = "\n".join(content["mainSteps"][0]["inputs"]["runCommand"])
    assert "{{" not in script  # no value is pasted into the script's text
    for name in content["parameters"]:
        assert f'"$SSM_{name}"' in script, name


def test_script_passes_every_parameter_to_the_node_launcher(built, tmp_path):
    _, _, template = built
    lines = document_content(template)["mainSteps"][0]["inputs"]["runCommand"]
    assert lines == build_job_script("/opt/cluster/bundle")
    assert "export PYTHONPATH=/opt/cluster/bundle" in lines
    values = {"action": "start", "jobId": "j-20261120-231502-ab12", "config": "training/configs/tiny.toml",
              "nodes": "4", "gpusPerNode": "8", "rendezvousHost": "10.0.1.17", "maxRestarts": "2",
              "overrides": "optim.lr=3e-4 train.steps=10", "cancelTimeoutSeconds": "60", "cancelMode": "save",
              "resumeFrom": "j-20261119-101500-0a0b", "attempt": "3"}
    start = parse_node_args(run_script(tmp_path, values, lines)[0])
    assert (start.command, start.job_id, start.module, start.config, start.nodes, start.gpus_per_node,
            start.rendezvous_host, start.max_restarts, start.overrides, start.resume_from, int(start.attempt)) == (
        "start", "j-20261120-231502-ab12", "training", "training/configs/tiny.toml", 4, 8, "10.0.1.17", 2,
        "optim.lr=3e-4 train.steps=10", "j-20261119-101500-0a0b", 3)
    status = parse_node_args(run_script(tmp_path, {**values, "action": "status"}, lines)[0])
    assert (status.command, status.job_id) == ("status", "j-20261120-231502-ab12")
    cancel = parse_node_args(run_script(tmp_path, {**values, "action": "cancel"}, lines)[0])
    assert (cancel.command, cancel.job_id, cancel.timeout_seconds, cancel.mode) == (
        "cancel", "j-20261120-231502-ab12", 60.0, "save")
    abort = parse_node_args(run_script(tmp_path, {**values, "action": "cancel", "cancelTimeoutSeconds": "10",
                                                  "cancelMode": "abort"}, lines)[0])
    assert (abort.command, abort.timeout_seconds, abort.mode) == ("cancel", 10.0, "abort")


@pytest.mark.parametrize("value", ["$(touch pwned)", "`touch pwned`", 'x"; touch pwned; echo "',
                                   "x' ; touch pwned #", "a b\nc", "${IFS}touch${IFS}pwned"])
def test_a_value_is_one_word_that_bash_never_parses(tmp_path, value):
    # Past the allowedPattern (which SSM checks first): even then the value is data, not script.
    argv, done = run_script(tmp_path, {"action": "start", "jobId": "j-1", "overrides": value,
                                       "rendezvousHost": value, "config": value})
    assert done.returncode == 0, done.stderr
    assert not (tmp_path / "pwned").exists()
    start = parse_node_args(argv)
    assert (start.overrides, start.rendezvous_host, start.config) == (value, value, value)


def test_an_agent_without_environment_interpolation_fails_with_one_json_line(tmp_path):
    argv, done = run_script(tmp_path, {"action": "status", "jobId": "j-1"}, env_prefix="OLD_")
    assert argv is None and done.returncode == node_jobs.EXIT_USAGE
    (line,) = done.stdout.splitlines()
    assert "SSM Agent >= 3.3.2746.0" in json.loads(line)["error"]


def test_script_starts_a_commcheck_without_a_config(tmp_path):
    values = {"action": "start", "jobId": "j-20261120-231502-cc01", "module": "training.commcheck",
              "nodes": "2", "rendezvousHost": "10.0.1.17", "maxRestarts": "0",
              "overrides": "sizes_mib=64,1024 min_busbw_gbps=350.0"}
    start = parse_node_args(run_script(tmp_path, values)[0])
    assert (start.module, start.config, start.nodes, start.gpus_per_node, start.max_restarts, int(start.attempt)) == (
        "training.commcheck", "", 2, 8, 0, 1)  # a start that does not send an attempt is attempt 1
    spec = node_jobs.JobSpec(job_id=start.job_id, config=start.config, nodes=start.nodes,
                             gpus_per_node=start.gpus_per_node, rendezvous_host=start.rendezvous_host,
                             max_restarts=start.max_restarts, overrides=tuple(start.overrides.split()),
                             module=start.module)
    spec.validate()  # what the node would accept
    assert node_jobs.build_option_args(spec.overrides) == [
        "--sizes-mib", "64,1024", "--min-busbw-gbps", "350.0"]


def test_the_deployed_document_starts_an_export_of_another_job_on_one_node(built, tmp_path):
    """What `clusterctl export` sends passes the synthesized document's patterns, and reaches the node as an
    export whose paths the node makes from the two job ids: none is sent."""
    _, _, template = built
    content = document_content(template)
    values = {"action": "start", "jobId": "j-20261120-231502-ab12-hf-9f3c", "module": "training.export",
              "nodes": "1", "gpusPerNode": "8", "rendezvousHost": "10.0.1.17", "maxRestarts": "0",
              "overrides": "step=40", "resumeFrom": "j-20261120-231502-ab12"}
    for name, value in values.items():
        spec = content["parameters"][name]
        assert (value in spec["allowedValues"] if "allowedValues" in spec
                else re.fullmatch(spec["allowedPattern"], value)), (name, value)
    start = parse_node_args(run_script(tmp_path, values, content["mainSteps"][0]["inputs"]["runCommand"])[0])
    assert (start.module, start.job_id, start.resume_from, start.overrides, start.nodes) == (
        "training.export", "j-20261120-231502-ab12-hf-9f3c", "j-20261120-231502-ab12", "step=40", 1)


def test_a_status_that_sends_only_action_and_job_id_runs_with_the_defaults(tmp_path):
    argv, done = run_script(tmp_path, {"action": "status", "jobId": "j-x-1"})
    assert parse_node_args(argv).job_id == "j-x-1", done.stderr


def test_the_longest_cancel_fits_in_the_command_timeout(built):
    _, _, template = built
    content = document_content(template)
    step_timeout = int(content["mainSteps"][0]["inputs"]["timeoutSeconds"])
    pattern = re.compile(content["parameters"]["cancelTimeoutSeconds"]["allowedPattern"])
    allowed = [n for n in range(0, 10_000) if pattern.fullmatch(str(n))]
    assert allowed == list(range(node_jobs.MAX_CANCEL_TIMEOUT_SECONDS + 1))
    # the SIGTERM wait, then what cancel does after it, within the step's own limit
    assert max(allowed) + node_jobs.CANCEL_AFTER_WAIT_SECONDS <= step_timeout


def test_attempt_allows_1_to_1000_and_defaults_to_1(built):
    _, _, template = built
    attempt = document_content(template)["parameters"]["attempt"]
    pattern = re.compile(attempt["allowedPattern"])
    assert [n for n in range(0, 10_000) if pattern.fullmatch(str(n))] == list(range(1, MAX_JOB_ATTEMPT + 1))
    assert attempt["default"] == "1" and attempt["interpolationType"] == "ENV_VAR"


@pytest.mark.parametrize("maximum", [1, 7, 9, 10, 99, 100, 680, 1000, 4321])
@pytest.mark.parametrize("minimum", [0, 1])
def test_integer_pattern_matches_exactly_its_range(minimum, maximum):
    pattern = re.compile(integer_pattern(maximum, minimum=minimum))
    assert [n for n in range(0, 10_000) if pattern.fullmatch(str(n))] == list(range(minimum, maximum + 1))
    assert not pattern.fullmatch("0" + str(maximum))  # no leading zeros


def test_integer_pattern_refuses_a_range_it_cannot_write():
    with pytest.raises(ValueError, match="minimum must be 0 or 1"):
        integer_pattern(10, minimum=2)


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


def test_operator_cannot_buy_capacity_blocks(built):
    """A purchase is paid upfront and cannot be cancelled: it takes the separate purchaser policy
    (tests/cluster_constructs/test_capacity_purchase.py)."""
    _, _, template = built
    (policy,) = template.find_resources("AWS::IAM::ManagedPolicy").values()
    document = json.dumps(policy["Properties"]["PolicyDocument"])
    assert "Purchase" not in document and "capacity-reservation" not in document


def test_operator_may_read_and_write_the_job_table_only(built):
    _, _, template = built
    records = statement(template, "JobRecords")
    assert sorted(records["Action"]) == ["dynamodb:DeleteItem", "dynamodb:GetItem", "dynamodb:PutItem",
                                         "dynamodb:Scan"]
    assert records["Resource"] == JOB_TABLE_ARN and "Condition" not in records
    (policy,) = template.find_resources("AWS::IAM::ManagedPolicy").values()
    dynamodb = [s for s in policy["Properties"]["PolicyDocument"]["Statement"] if "dynamodb:" in json.dumps(s)]
    assert dynamodb == [records]  # no other statement touches DynamoDB


def test_custom_bundle_dir_reaches_the_script():
    stack = cdk.Stack(cdk.App(), "S")
    runner = JobRunner(stack, "Jobs", log_group=logs.LogGroup(stack, "L"), auto_scaling_group_name="asg",
                       bundle_dir="/srv/bundle")
    content = stack.resolve(runner.document.content)
    assert "export PYTHONPATH=/srv/bundle" in content["mainSteps"][0]["inputs"]["runCommand"]
