"""The whole TrainingClusterStack, for every variant (capacity modes, EFA layouts, imported buckets): cdk-nag
AwsSolutions clean, cfn-lint clean, the outputs clusterctl reads, user-data that bash accepts, no account id."""

import json
import re
import shutil
import subprocess

import pytest
from aws_cdk.assertions import Annotations, Match
from cdk_support import STACK_VARIANTS

VARIANTS = sorted(STACK_VARIANTS)
OUTPUT_KEYS = {
    "DataBucketName",
    "CheckpointBucketName",
    "FileSystemId",
    "FileSystemDnsName",
    "FileSystemMountName",
    "CheckpointRoot",
    "AutoScalingGroupName",
    "LaunchTemplateId",
    "LogGroupName",
    "JobDocumentName",
    "JobTableName",
    "MaxJobRestarts",
    "JobKeeperLogGroupName",
    "OperatorPolicyArn",
    "CapacityPurchaserPolicyArn",
    "AlarmTopicArn",
    "DashboardName",
    "DashboardUrl",
    "MetricsIntervalSeconds",
    "InstanceType",
    "NodeCount",
    "CapacityMode",
    "VpcId",
    "FileSystemSubnetId",
    "FileSystemSecurityGroupId",
}
USER_DATA_LIMIT_BYTES = 16 * 1024  # EC2 rejects larger user-data


@pytest.mark.parametrize("variant", VARIANTS)
def test_cdk_nag_has_no_unsuppressed_findings(synth, variant):
    annotations = Annotations.from_stack(synth(variant).stack)
    findings = [
        f"{e.id}: {e.entry.data}"
        for kind in ("error", "warning")
        for e in getattr(annotations, f"find_{kind}")("*", Match.string_like_regexp(".*"))
    ]
    assert findings == []


@pytest.fixture(scope="module")
def cfn_lint(synth) -> tuple[subprocess.CompletedProcess, dict[str, list[str]]]:
    """cfn-lint once over every variant's template (each start loads its specs: ~1.5 s of CPU), and its
    findings by variant (a parseable line starts with the template's path)."""
    paths = {variant: str(synth(variant).template_path) for variant in VARIANTS}
    result = subprocess.run(["cfn-lint", "--format", "parseable", *paths.values()], capture_output=True, text=True,
                            executable=shutil.which("cfn-lint"))
    lines = result.stdout.splitlines()
    return result, {variant: [line for line in lines if line.startswith(f"{path}:")] for variant, path in paths.items()}


@pytest.mark.parametrize("variant", VARIANTS)
def test_cfn_lint_is_clean(cfn_lint, variant):
    result, findings = cfn_lint
    assert findings[variant] == [], result.stdout
    assert result.returncode == 0 or any(findings.values()), result.stdout + result.stderr  # no crash either


@pytest.mark.parametrize("variant", VARIANTS)
def test_outputs_for_clusterctl(synth, variant):
    stack = synth(variant)
    outputs = stack.template_json["Outputs"]
    assert OUTPUT_KEYS <= set(outputs)
    assert outputs["InstanceType"]["Value"] == stack.settings.compute.instance_type.name
    assert outputs["NodeCount"]["Value"] == str(stack.settings.compute.node_count)
    assert outputs["CapacityMode"]["Value"] == stack.settings.capacity.mode.value
    assert set(outputs["AutoScalingGroupName"]["Value"]) == {"Ref"}  # the group's name, resolved at deploy
    # the nodes' rule for where checkpoints go, the one clusterctl records in each job
    assert outputs["CheckpointRoot"]["Value"] == _node_config(stack)["training"]["checkpointRoot"]
    assert outputs["CheckpointRoot"]["Value"] == f"{stack.settings.storage.fsx_mount_point}/checkpoints"


def _keeper_rules(stack) -> dict[str, dict]:
    """The job keeper's EventBridge rules by the name their logical id starts with."""
    return {k: r["Properties"] for k, r in stack.resources("AWS::Events::Rule").items() if k.startswith("JobKeeper")}


@pytest.mark.parametrize("variant", ["default-p5-on-demand", "odcr-created", "capacity-block-p5en"])
def test_the_job_keeper_is_wired_to_this_clusters_table_document_group_and_topic(synth, variant):
    stack = synth(variant)
    resources, outputs = stack.template_json["Resources"], stack.template_json["Outputs"]
    (table_id,) = stack.resources("AWS::DynamoDB::Table")
    (document_id,) = stack.resources("AWS::SSM::Document")
    (topic_id,) = stack.resources("AWS::SNS::Topic")
    assert outputs["JobTableName"]["Value"] == {"Ref": table_id}
    assert outputs["MaxJobRestarts"]["Value"] == "5"  # cdk.json's default, as text (these variants keep it)
    (keeper_logs,) = [k for k in stack.resources("AWS::Logs::LogGroup") if k.startswith("JobKeeper")]
    assert outputs["JobKeeperLogGroupName"]["Value"] == {"Ref": keeper_logs}
    (function,) = [r["Properties"] for k, r in stack.resources("AWS::Lambda::Function").items()
                   if k.startswith("JobKeeper")]
    env = function["Environment"]["Variables"]
    group = "TrainingClusterStack-nodes"
    (asg,) = stack.resources("AWS::AutoScaling::AutoScalingGroup").values()
    assert asg["Properties"]["AutoScalingGroupName"] == group  # the name the rules and conditions use
    reservation = outputs.get("CapacityReservationId", {}).get("Value", "")
    assert env == {
        "JOB_TABLE_NAME": {"Ref": table_id},
        "JOB_DOCUMENT_NAME": {"Ref": document_id},
        "AUTO_SCALING_GROUP_NAME": group,
        "ALARM_TOPIC_ARN": {"Ref": topic_id},
        "STACK_NAME": "TrainingClusterStack",
        "INSTANCE_TYPE": stack.settings.compute.instance_type.name,
        "CAPACITY_MODE": stack.settings.capacity.mode.value,
        "CAPACITY_RESERVATION_ID": reservation,  # a created reservation's Ref, or ""
    }
    if variant == "odcr-created":
        (reservation_id,) = stack.resources("AWS::EC2::CapacityReservation")
        assert env["CAPACITY_RESERVATION_ID"] == {"Ref": reservation_id}
    # its role sends the jobs document only, on the group's nodes only, and uses the alarm topic's key
    (policy,) = [r["Properties"] for k, r in stack.resources("AWS::IAM::Policy").items()
                 if k.startswith("JobKeeperRole")]
    statements = {s["Sid"]: s for s in policy["PolicyDocument"]["Statement"]}
    assert statements["SendJobDocument"]["Resource"]["Fn::Join"][1][-1] == {"Ref": document_id}
    assert statements["SendToClusterNodes"]["Condition"] == {
        "StringEquals": {"ssm:resourceTag/aws:autoscaling:groupName": group}}
    assert statements["JobRecords"]["Resource"] == {"Fn::GetAtt": [table_id, "Arn"]}
    (key_id,) = stack.resources("AWS::KMS::Key")
    assert statements["UseAlarmTopicKey"]["Resource"] == {"Fn::GetAtt": [key_id, "Arn"]}
    assert resources[topic_id]["Properties"]["KmsMasterKeyId"] == {"Fn::GetAtt": [key_id, "Arn"]}
    # the operators' policy reads and writes the same table, and lists it (`clusterctl jobs`)
    (operator,) = [r for k, r in stack.resources("AWS::IAM::ManagedPolicy").items()
                   if k.startswith("JobsOperatorPolicy")]
    (records,) = [s for s in operator["Properties"]["PolicyDocument"]["Statement"] if s.get("Sid") == "JobRecords"]
    assert records["Resource"] == {"Fn::GetAtt": [table_id, "Arn"]}
    assert sorted(records["Action"]) == sorted([*statements["JobRecords"]["Action"], "dynamodb:Scan"])
    # buying a Capacity Block is the purchaser policy's alone, an output of its own
    (purchaser_id,) = [k for k in stack.resources("AWS::IAM::ManagedPolicy") if k.startswith("CapacityPurchaser")]
    assert outputs["CapacityPurchaserPolicyArn"]["Value"] == {"Ref": purchaser_id}
    assert "PurchaseCapacityBlock" not in json.dumps(operator)
    assert "PurchaseCapacityBlock" in json.dumps(resources[purchaser_id])


def test_only_a_capacity_block_cluster_hears_the_blocks_expiration_warning(synth):
    on_demand = _keeper_rules(synth("default-p5-on-demand"))
    block = _keeper_rules(synth("capacity-block-p5en"))
    assert len(on_demand) == 2 and len(block) == 3
    assert not [r for r in on_demand.values() if r.get("EventPattern", {}).get("source") == ["aws.ec2"]]
    (warning,) = [r for r in block.values() if r.get("EventPattern", {}).get("source") == ["aws.ec2"]]
    assert "Capacity Block Expiration Warning" in warning["EventPattern"]["detail-type"]
    for rules in (on_demand, block):
        assert [r["ScheduleExpression"] for r in rules.values() if "ScheduleExpression" in r] == ["rate(1 minute)"]
        (group,) = [r for r in rules.values() if r.get("EventPattern", {}).get("source") == ["aws.autoscaling"]]
        assert group["EventPattern"]["detail"] == {"AutoScalingGroupName": ["TrainingClusterStack-nodes"]}


def test_max_job_restarts_reaches_the_output(synth):
    # p6-b200-efa-fsx sets maxJobRestarts=0 (the keeper never restarts a job there)
    assert synth("p6-b200-efa-fsx").template_json["Outputs"]["MaxJobRestarts"]["Value"] == "0"


def _strings(value):
    if isinstance(value, str):
        yield value
    elif isinstance(value, dict):
        for key, item in value.items():
            yield key
            yield from _strings(item)
    elif isinstance(value, list):
        for item in value:
            yield from _strings(item)


# A 12-digit run that stands alone: not inside a longer run of letters and digits, such as a 64-hex asset hash.
ACCOUNT_ID = re.compile(r"(?<![0-9A-Za-z])[0-9]{12}(?![0-9A-Za-z])")


def account_ids_in(template: dict) -> list[str]:
    return [s for s in _strings(template) if ACCOUNT_ID.search(s)]


def test_account_id_check_fires_on_ids_and_not_on_asset_hashes():
    asset_hash = "5f0e3c1a" + "123456789012" + "ab" * 22  # 12 digits inside a hash, as the bundle's can have
    assert account_ids_in({"Key": f"{asset_hash}.zip", "Image": f"cdk-hnb659fds-assets-x/{asset_hash}"}) == []
    assert account_ids_in({"Arn": "arn:aws:iam::123456789012:role/x"}) == ["arn:aws:iam::123456789012:role/x"]
    assert account_ids_in({"Bucket": "cdk-hnb659fds-assets-123456789012-us-east-1"}) != []


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_hard_coded_account_id(synth, variant):
    template = synth(variant).template_json
    assert account_ids_in(template) == [], "an account id is baked into the template"
    assert '"AWS::AccountId"' in json.dumps(template)  # ARNs take the account at deploy time


def _node_statements(stack) -> list[dict]:
    (policy,) = [
        r["Properties"] for k, r in stack.resources("AWS::IAM::Policy").items() if k.startswith("NodesRole")
    ]
    return policy["PolicyDocument"]["Statement"]


@pytest.mark.parametrize("variant", ["default-p5-on-demand", "odcr-existing"])
def test_nodes_get_no_s3_access_but_the_bundle_object(synth, variant):
    stack = synth(variant)
    s3 = [s for s in _node_statements(stack) if "s3:" in json.dumps(s["Action"])]
    # one statement: GetObject on the bundle asset's own key, not the CDK assets bucket, and nothing on the data
    # and checkpoint buckets (also when dataBucketName names the user's own bucket, in odcr-existing)
    (statement,) = s3
    assert statement["Action"] == "s3:GetObject"
    resource = json.dumps(statement["Resource"])
    (lt,) = stack.resources("AWS::EC2::LaunchTemplate").values()
    bundle_key = re.search(r"([0-9a-f]{64}\.zip)", json.dumps(lt)).group(1)
    assert resource.endswith(f'/{bundle_key}"]]}}') and "*" not in resource
    assert "team-training-data" not in json.dumps(_node_statements(stack))
    roles = stack.resources("AWS::IAM::Role")
    assert not [k for k, r in roles.items() if k.startswith("Nodes") and "ManagedPolicyArns" in r["Properties"]]


def _references(value) -> set[str]:
    """Logical ids that a resource's properties refer to (Ref, Fn::GetAtt)."""
    found = set()
    if isinstance(value, dict):
        if set(value) == {"Ref"}:
            found.add(value["Ref"])
        elif set(value) == {"Fn::GetAtt"}:
            found.add(value["Fn::GetAtt"][0])
        for item in value.values():
            found |= _references(item)
    elif isinstance(value, list):
        for item in value:
            found |= _references(item)
    return found


@pytest.mark.parametrize("variant", ["default-p5-on-demand", "p6-b200-efa-fsx"])
def test_what_a_retained_resource_uses_is_retained_too(synth, variant):
    """`cdk destroy` cannot delete what a retained resource still uses: the security group and subnet hold the
    retained file system's network interfaces, the VPC holds the subnet (DELETE_FAILED otherwise)."""
    resources = synth(variant).template_json["Resources"]
    retained = {k for k, r in resources.items() if r.get("DeletionPolicy") == "Retain"}
    missing = {
        (k, used)
        for k in retained
        for used in _references(resources[k].get("Properties", {}))
        if used in resources and used not in retained
    }
    assert missing == set()
    kinds = {resources[k]["Type"] for k in retained}
    assert {"AWS::FSx::FileSystem", "AWS::EC2::SecurityGroup", "AWS::EC2::Subnet", "AWS::EC2::VPC"} <= kinds
    # the file servers keep talking to each other: the group's rules to itself stay with it
    (fsx,) = [r for r in resources.values() if r["Type"] == "AWS::FSx::FileSystem"]
    (group,) = _references(fsx["Properties"]["SecurityGroupIds"])
    self_rules = [
        k
        for k, r in resources.items()
        if r["Type"] in ("AWS::EC2::SecurityGroupIngress", "AWS::EC2::SecurityGroupEgress")
        and _references(r["Properties"]) == {group}
    ]
    assert self_rules and set(self_rules) <= retained
    # nothing else: the NAT gateway, endpoints, the nodes' group and their rules to the file system are deleted
    assert not {"AWS::EC2::NatGateway", "AWS::EC2::VPCEndpoint", "AWS::EC2::SecurityGroupIngress"} & {
        resources[k]["Type"] for k in retained if k not in self_rules
    }
    assert len([k for k in retained if resources[k]["Type"] == "AWS::EC2::SecurityGroup"]) == 1


NAME_PROPERTIES = {"AWS::Logs::LogGroup": "LogGroupName", "AWS::S3::Bucket": "BucketName"}


@pytest.mark.parametrize("variant", ["default-p5-on-demand"])
def test_retained_resources_never_take_a_fixed_name(synth, variant):
    """A retained resource outlives `cdk destroy`; a fixed name would make the next deploy collide with it."""
    resources = synth(variant).template_json["Resources"]
    for logical_id, resource in resources.items():
        name_property = NAME_PROPERTIES.get(resource["Type"])
        if resource.get("DeletionPolicy") != "Retain" or not name_property:
            continue
        name = resource["Properties"].get(name_property)
        # either CloudFormation names it, or the name carries the stack id, new for every creation of the stack
        assert name is None or "AWS::StackId" in json.dumps(name), (logical_id, name)
    retained_groups = {
        k: r for k, r in resources.items() if r["Type"] == "AWS::Logs::LogGroup" and r.get("DeletionPolicy") == "Retain"
    }
    assert len(retained_groups) == 2  # the job logs and the job keeper's
    stack_uuid = {"Fn::Select": [2, {"Fn::Split": ["/", {"Ref": "AWS::StackId"}]}]}
    (group,) = [r for k, r in retained_groups.items() if k.startswith("Observability")]
    assert group["Properties"]["LogGroupName"] == {
        "Fn::Join": ["", ["/training-cluster/TrainingClusterStack/", stack_uuid]]
    }
    (keeper,) = [r for k, r in retained_groups.items() if k.startswith("JobKeeper")]
    assert keeper["Properties"]["LogGroupName"] == {
        "Fn::Join": ["", ["/training-cluster/TrainingClusterStack/", stack_uuid, "/job-keeper"]]
    }


def _user_data_text(stack) -> str:
    """The launch template's user-data with every CloudFormation token replaced by a plausible value."""
    (lt,) = stack.resources("AWS::EC2::LaunchTemplate").values()
    parts = lt["Properties"]["LaunchTemplateData"]["UserData"]["Fn::Base64"]["Fn::Join"][1]
    fillers = {
        "Fn::GetAtt": "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
        "Ref": "resolved-name",
        "Fn::Sub": "s3://cdk-assets-bucket/bundle.zip",
    }
    return "".join(p if isinstance(p, str) else fillers[next(iter(p))] for p in parts)


def _node_config(stack) -> dict:
    match = re.search(r"<<'NODE_CONFIG_EOF'\n(.*?)\nNODE_CONFIG_EOF\n", _user_data_text(stack), re.S)
    assert match, "node config heredoc not found"
    return json.loads(match.group(1))


@pytest.mark.parametrize("variant", ["default-p5-on-demand", "p4d-isolated"])
def test_user_data_is_valid_bash_within_the_ec2_limit(synth, variant, tmp_path):
    text = _user_data_text(synth(variant))
    assert text.startswith("#!/bin/bash")
    assert len(text.encode()) < USER_DATA_LIMIT_BYTES
    script = tmp_path / "user-data.sh"
    script.write_text(text)
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "python3 -m node_bootstrap run" in text
    config = _node_config(synth(variant))  # the node config rides along as JSON the node can parse
    assert config["instanceType"] == synth(variant).settings.compute.instance_type.name
    assert config["lustre"]["dnsName"] == "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com"


def test_capacity_block_scales_with_the_block(synth):
    stack = synth("capacity-block-p5en")
    group = stack.only("AWS::AutoScaling::AutoScalingGroup")
    assert (group["MinSize"], group["MaxSize"], group["DesiredCapacity"]) == ("0", "0", "0")
    actions = sorted(
        a["Properties"]["StartTime"] + "=" + str(a["Properties"]["DesiredCapacity"])
        for a in stack.resources("AWS::AutoScaling::ScheduledAction").values()
    )
    # up when the block starts; to zero 40 minutes before it ends, so the trainer checkpoints first
    assert actions == ["2027-01-05T11:30:00Z=2", "2027-01-12T10:50:00Z=0"]
    assert "AWS::EC2::PlacementGroup" not in {r["Type"] for r in stack.template_json["Resources"].values()}
    subnets = stack.resources("AWS::EC2::Subnet").values()
    assert {s["Properties"]["AvailabilityZone"] for s in subnets} == {"us-east-1d"}


def test_created_reservation_is_what_the_group_targets(synth):
    stack = synth("odcr-created")  # nodeCount 4, spareNodes 1
    (reservation_id,) = stack.resources("AWS::EC2::CapacityReservation")
    group = stack.only("AWS::AutoScaling::AutoScalingGroup")
    # the group and the reservation hold the job's nodes and the spare; a job runs on NodeCount by default
    assert stack.only("AWS::EC2::CapacityReservation")["InstanceCount"] == 5
    assert (group["MinSize"], group["MaxSize"], group["DesiredCapacity"]) == ("5", "5", "5")
    outputs = stack.template_json["Outputs"]
    assert (outputs["NodeCount"]["Value"], outputs["SpareNodes"]["Value"]) == ("4", "1")
    assert group["CapacityReservationSpecification"] == {
        "CapacityReservationPreference": "capacity-reservations-only",
        "CapacityReservationTarget": {"CapacityReservationIds": [{"Ref": reservation_id}]},
    }
    assert stack.template_json["Outputs"]["CapacityReservationId"]["Value"] == {"Ref": reservation_id}


def test_nodes_launch_after_the_file_system_is_linked(synth):
    stack = synth("default-p5-on-demand")
    (group,) = stack.resources("AWS::AutoScaling::AutoScalingGroup").values()
    associations = set(stack.resources("AWS::FSx::DataRepositoryAssociation"))
    assert associations <= set(group["DependsOn"])


def test_user_data_placeholders_must_appear_exactly_once():
    from stacks.training_cluster_stack import render_user_data

    template = "#!/bin/bash\n# @@REGION@@ @@REGION@@\n@@BUNDLE_S3_URI@@ @@NODE_CONFIG_JSON@@ @@LOG_GROUP@@\n"
    with pytest.raises(ValueError, match="placeholder @@REGION@@ 2 times, not once"):
        render_user_data(
            template,
            region="us-east-1",
            bundle_s3_uri="s3://b/k.zip",
            node_config_json="{}",
            log_group_name="/g",
        )


def test_checkov_exceptions_are_on_their_resources_and_in_the_security_doc(synth):
    from cdk_support import REPO_ROOT

    from stacks.checkov_exceptions import CHECKOV_EXCEPTIONS

    resources = synth("default-p5-on-demand").template_json["Resources"]
    skips = [skip for r in resources.values() for skip in r.get("Metadata", {}).get("checkov", {}).get("skip", [])]
    expected = sorted(check for exceptions in CHECKOV_EXCEPTIONS.values() for check, _ in exceptions)
    assert sorted(skip["id"] for skip in skips) == expected  # every exception found its resource, once
    assert all(len(skip["comment"]) > 40 for skip in skips)
    security = (REPO_ROOT / "docs" / "security.md").read_text()
    rows = {
        (match.group(1), match.group(2))
        for match in re.finditer(r"^\| (CKV_AWS_\d+)[^|]* \| `([^`]+)` \|", security, re.M)
    }
    assert rows == {(check, path) for path, exceptions in CHECKOV_EXCEPTIONS.items() for check, _ in exceptions}
