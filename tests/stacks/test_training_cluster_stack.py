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
    "AutoScalingGroupName",
    "LaunchTemplateId",
    "LogGroupName",
    "JobDocumentName",
    "OperatorPolicyArn",
    "AlarmTopicArn",
    "DashboardName",
    "DashboardUrl",
    "MetricsIntervalSeconds",
    "InstanceType",
    "NodeCount",
    "CapacityMode",
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


@pytest.mark.parametrize("variant", VARIANTS)
def test_cfn_lint_is_clean(synth, variant):
    result = subprocess.run(
        ["cfn-lint", "--format", "parseable", str(synth(variant).template_path)],
        capture_output=True,
        text=True,
        env=None,
        executable=shutil.which("cfn-lint"),
    )
    assert result.returncode == 0, result.stdout + result.stderr


@pytest.mark.parametrize("variant", VARIANTS)
def test_outputs_for_clusterctl(synth, variant):
    stack = synth(variant)
    outputs = stack.template_json["Outputs"]
    assert OUTPUT_KEYS <= set(outputs)
    assert outputs["InstanceType"]["Value"] == stack.settings.compute.instance_type.name
    assert outputs["NodeCount"]["Value"] == str(stack.settings.compute.node_count)
    assert outputs["CapacityMode"]["Value"] == stack.settings.capacity.mode.value
    assert set(outputs["AutoScalingGroupName"]["Value"]) == {"Ref"}  # the group's name, resolved at deploy


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


@pytest.mark.parametrize("variant", VARIANTS)
def test_no_hard_coded_account_id(synth, variant):
    template = synth(variant).template_json
    with_ids = [s for s in _strings(template) if re.search(r"(?<![0-9])[0-9]{12}(?![0-9])", s)]
    assert with_ids == [], "an account id is baked into the template"
    assert '"AWS::AccountId"' in json.dumps(template)  # ARNs take the account at deploy time


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


@pytest.mark.parametrize("variant", ["default-p5-on-demand", "p4d-isolated-efa-fsx"])
def test_user_data_is_valid_bash_within_the_ec2_limit(synth, variant, tmp_path):
    text = _user_data_text(synth(variant))
    assert text.startswith("#!/bin/bash")
    assert len(text.encode()) < USER_DATA_LIMIT_BYTES
    script = tmp_path / "user-data.sh"
    script.write_text(text)
    result = subprocess.run(["bash", "-n", str(script)], capture_output=True, text=True)
    assert result.returncode == 0, result.stderr
    assert "python3 -m node_bootstrap run" in text
    # the node config rides along as JSON the node can parse
    match = re.search(r"<<'NODE_CONFIG_EOF'\n(.*?)\nNODE_CONFIG_EOF\n", text, re.S)
    assert match, "node config heredoc not found"
    config = json.loads(match.group(1))
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
    stack = synth("odcr-created")
    (reservation_id,) = stack.resources("AWS::EC2::CapacityReservation")
    group = stack.only("AWS::AutoScaling::AutoScalingGroup")
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
