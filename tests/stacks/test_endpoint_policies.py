"""The whole stack's VPC endpoint policies against what the nodes are granted: every action the node role
allows passes the endpoint of its service, on the same log group, Auto Scaling group and bundle object."""

import json
from fnmatch import fnmatchcase

import pytest

# The endpoint of each service the node role names (cluster_constructs/network.py, INTERFACE_ENDPOINTS).
ENDPOINTS = {"ssm": "Ssm", "ssmmessages": "SsmMessages", "ec2messages": "Ec2Messages", "logs": "Logs",
             "cloudwatch": "Monitoring", "ec2": "Ec2", "autoscaling": "AutoScaling", "s3": "S3",
             "dynamodb": "DynamoDb"}


def _listed(value):
    return value if isinstance(value, list) else [value]


def _endpoint_statements(stack) -> dict[str, list[dict]]:
    found = {}
    for logical_id, endpoint in stack.resources("AWS::EC2::VPCEndpoint").items():
        name = logical_id.removeprefix("NetworkVpc").split("Endpoint")[0]
        found[name] = endpoint["Properties"]["PolicyDocument"]["Statement"]
    return found


def _node_statements(stack) -> list[dict]:
    (policy,) = [r["Properties"] for k, r in stack.resources("AWS::IAM::Policy").items() if k.startswith("NodesRole")]
    return policy["PolicyDocument"]["Statement"]


def _same_thing(node_resource, endpoint_resources, stack) -> bool:
    """Whether an endpoint statement's resources cover the node statement's resource: "*", or the same log
    group (its logical id), Auto Scaling group (its name) or S3 object (equal)."""
    if "*" in endpoint_resources:
        return True
    text = json.dumps(node_resource)
    (log_group,) = [k for k in stack.resources("AWS::Logs::LogGroup") if k.startswith("ObservabilityLogGroup")]
    group = "autoScalingGroupName/TrainingClusterStack-nodes"
    if log_group in text:
        return any(log_group in json.dumps(r) for r in endpoint_resources)
    if group in text:
        return any(group in json.dumps(r) for r in endpoint_resources)
    return node_resource in endpoint_resources


@pytest.mark.parametrize("variant", ["default-p5-on-demand", "p4d-isolated", "odcr-existing"])
def test_every_node_permission_passes_its_endpoint(synth, variant):
    stack = synth(variant)
    endpoints = _endpoint_statements(stack)
    assert sorted(endpoints) == sorted(ENDPOINTS.values())
    for statement in _node_statements(stack):
        for action in _listed(statement["Action"]):
            passing = [s for s in endpoints[ENDPOINTS[action.split(":")[0]]]
                       if any(fnmatchcase(action, allowed) for allowed in _listed(s["Action"]))]
            assert passing, f"{action}: no statement of its endpoint allows it"
            for resource in _listed(statement["Resource"]):
                assert any(_same_thing(resource, _listed(s["Resource"]), stack) for s in passing), (action, resource)


@pytest.mark.parametrize("variant", ["default-p5-on-demand", "odcr-existing"])
def test_the_s3_endpoint_names_the_stacks_buckets_even_imported_ones(synth, variant):
    stack = synth(variant)
    (clusters,) = [s for s in _endpoint_statements(stack)["S3"] if s["Sid"] == "ClusterBuckets"]
    resources = json.dumps(clusters["Resource"])
    buckets = [k for k in stack.resources("AWS::S3::Bucket") if not k.startswith("StorageAccessLogs")]
    if variant == "odcr-existing":  # dataBucketName=team-training-data: imported, named
        assert "arn:aws:s3:::team-training-data/*" in resources and len(buckets) == 1
    assert all(bucket in resources for bucket in buckets) and "StorageAccessLogs" not in resources
