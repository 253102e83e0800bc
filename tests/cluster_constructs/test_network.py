"""ClusterNetwork: one AZ, private nodes, the endpoints private nodes need, and the EFA/FSx security groups."""

import aws_cdk as cdk
import pytest
from aws_cdk import aws_logs as logs
from aws_cdk.assertions import Match, Template
from cdk_support import bare_stack, build_settings, resources_of

from cluster_constructs.network import ClusterNetwork

LOG_GROUP = "/training-cluster/TrainingClusterStack/run-1"
GROUP = "TrainingClusterStack-nodes"
BUCKETS = ("data-bucket", "checkpoint-bucket")
BUNDLE = "arn:aws:s3:::cdk-assets/0123abcd.zip"


def _new_network(stack, **overrides):
    return ClusterNetwork(
        stack,
        "Network",
        settings=build_settings(**overrides).network,
        flow_log_retention=logs.RetentionDays.ONE_MONTH,
        log_group_name=LOG_GROUP,
        auto_scaling_group_name=GROUP,
    )


def _network(**overrides):
    stack = bare_stack()
    network = _new_network(stack, **overrides)
    network.allow_s3(bucket_names=BUCKETS, object_arns=[BUNDLE])
    return network, Template.from_stack(stack)


@pytest.fixture(scope="module")
def with_nat():
    return _network()


@pytest.fixture(scope="module")
def isolated():
    return _network(natGateway="false")


def test_subnets_live_in_the_configured_zone_only(with_nat):
    _, template = with_nat
    subnets = resources_of(template, "AWS::EC2::Subnet")
    assert {s["AvailabilityZone"] for s in subnets} == {"us-east-1a"}
    assert len(subnets) == 2  # nodes + public (for the NAT gateway)
    template.resource_count_is("AWS::EC2::NatGateway", 1)
    assert not any(s.get("MapPublicIpOnLaunch") for s in subnets if s["CidrBlock"].endswith("/20"))


def test_without_nat_there_is_no_public_subnet(isolated):
    _, template = isolated
    template.resource_count_is("AWS::EC2::NatGateway", 0)
    template.resource_count_is("AWS::EC2::InternetGateway", 0)
    template.resource_count_is("AWS::EC2::Subnet", 1)


def test_efa_group_allows_all_traffic_to_and_from_itself(with_nat):
    network, template = with_nat
    group_id = cdk.Stack.of(network).resolve(network.node_security_group.security_group_id)
    template.has_resource_properties(
        "AWS::EC2::SecurityGroupIngress",
        {
            "IpProtocol": "-1",
            "GroupId": group_id,
            "SourceSecurityGroupId": group_id,
        },
    )
    template.has_resource_properties(
        "AWS::EC2::SecurityGroupEgress",
        {
            "IpProtocol": "-1",
            "GroupId": group_id,
            "DestinationSecurityGroupId": group_id,
        },
    )


def test_efa_group_has_no_blanket_egress(with_nat):
    # allow_all_outbound=True would have replaced the explicit self-egress with 0.0.0.0/0 all traffic.
    _, template = with_nat
    groups = template.find_resources(
        "AWS::EC2::SecurityGroup",
        {"Properties": {"GroupDescription": Match.string_like_regexp("^EFA nodes")}},
    )
    (group,) = groups.values()
    egress = group["Properties"]["SecurityGroupEgress"]
    assert egress == [
        {
            "CidrIp": "0.0.0.0/0",
            "Description": "HTTPS to AWS APIs, S3 and package mirrors",
            "FromPort": 443,
            "IpProtocol": "tcp",
            "ToPort": 443,
        }
    ]


@pytest.mark.parametrize(("from_port", "to_port"), [(988, 988), (1018, 1023)])
def test_lustre_ports_open_both_ways_between_nodes_and_fsx(with_nat, from_port, to_port):
    network, template = with_nat
    resolve = cdk.Stack.of(network).resolve
    nodes = resolve(network.node_security_group.security_group_id)
    fsx = resolve(network.file_system_security_group.security_group_id)
    rule = {"IpProtocol": "tcp", "FromPort": from_port, "ToPort": to_port}
    template.has_resource_properties(
        "AWS::EC2::SecurityGroupIngress", {**rule, "GroupId": fsx, "SourceSecurityGroupId": nodes}
    )
    template.has_resource_properties(
        "AWS::EC2::SecurityGroupIngress", {**rule, "GroupId": nodes, "SourceSecurityGroupId": fsx}
    )
    template.has_resource_properties(
        "AWS::EC2::SecurityGroupEgress", {**rule, "GroupId": nodes, "DestinationSecurityGroupId": fsx}
    )
    template.has_resource_properties(
        "AWS::EC2::SecurityGroupIngress", {**rule, "GroupId": fsx, "SourceSecurityGroupId": fsx}
    )


def test_endpoints_for_private_nodes(isolated):
    _, template = isolated
    services = set()
    for endpoint in resources_of(template, "AWS::EC2::VPCEndpoint"):
        name = endpoint["ServiceName"]
        services.add(name if isinstance(name, str) else str(name))
    joined = " ".join(services)
    for service in ("ssm", "ssmmessages", "ec2messages", "logs", "monitoring", "ec2", "autoscaling"):
        assert f"com.amazonaws.us-east-1.{service}" in joined, service
    template.has_resource_properties(
        "AWS::EC2::VPCEndpoint", {"VpcEndpointType": "Gateway", "ServiceName": Match.any_value()}
    )
    template.resource_count_is("AWS::EC2::VPCEndpoint", 8)


def test_endpoints_accept_https_from_nodes_only(isolated):
    network, template = isolated
    nodes = cdk.Stack.of(network).resolve(network.node_security_group.security_group_id)
    template.has_resource_properties(
        "AWS::EC2::SecurityGroupIngress",
        {
            "IpProtocol": "tcp",
            "FromPort": 443,
            "ToPort": 443,
            "SourceSecurityGroupId": nodes,
        },
    )
    for group in resources_of(template, "AWS::EC2::SecurityGroup"):
        for rule in group.get("SecurityGroupIngress", []):
            assert rule.get("CidrIp") != "0.0.0.0/0"


def test_flow_logs_go_to_cloudwatch(with_nat):
    _, template = with_nat
    template.has_resource_properties(
        "AWS::EC2::FlowLog", {"LogDestinationType": "cloud-watch-logs", "ResourceType": "VPC"}
    )


def test_efa_file_system_rules_are_added_on_request():
    stack = bare_stack()
    network = _new_network(stack)
    network.allow_efa_file_system()
    template = Template.from_stack(stack)
    resolve = stack.resolve
    nodes = resolve(network.node_security_group.security_group_id)
    fsx = resolve(network.file_system_security_group.security_group_id)
    template.has_resource_properties(
        "AWS::EC2::SecurityGroupIngress", {"IpProtocol": "-1", "GroupId": fsx, "SourceSecurityGroupId": nodes}
    )
    template.has_resource_properties(
        "AWS::EC2::SecurityGroupIngress", {"IpProtocol": "-1", "GroupId": fsx, "SourceSecurityGroupId": fsx}
    )


ACCOUNT = {"StringEquals": {"aws:PrincipalAccount": {"Ref": "AWS::AccountId"}}}


def _endpoint_policies(network, template) -> dict[str, list[dict]]:
    """Each endpoint's policy statements, by the endpoint's construct id (S3Endpoint, SsmEndpoint, ...)."""
    stack = cdk.Stack.of(network)
    endpoints = {**{f"{n}Endpoint": e for n, e in network.interface_endpoints.items()},
                 "S3Endpoint": network.s3_endpoint}
    resources = template.to_json()["Resources"]
    return {name: resources[stack.get_logical_id(e.node.default_child)]["Properties"]["PolicyDocument"]["Statement"]
            for name, e in endpoints.items()}


def test_every_endpoint_has_a_policy(isolated):
    network, template = isolated
    policies = _endpoint_policies(network, template)
    assert len(policies) == 8 and all(policies.values())
    for statements in policies.values():
        assert {s["Effect"] for s in statements} == {"Allow"}


def test_the_s3_endpoint_passes_the_stacks_buckets_the_bundle_and_aws_owned_repositories_only(isolated):
    network, template = isolated
    by_sid = {s["Sid"]: s for s in _endpoint_policies(network, template)["S3Endpoint"]}
    assert set(by_sid) == {"ReadAwsOwnedRepositories", "ClusterBuckets", "NodeDownloads"}
    assert by_sid["ClusterBuckets"]["Action"] == "s3:*" and by_sid["ClusterBuckets"]["Condition"] == ACCOUNT
    assert sorted(by_sid["ClusterBuckets"]["Resource"]) == [
        "arn:aws:s3:::checkpoint-bucket", "arn:aws:s3:::checkpoint-bucket/*",
        "arn:aws:s3:::data-bucket", "arn:aws:s3:::data-bucket/*"]
    assert by_sid["NodeDownloads"] == {"Sid": "NodeDownloads", "Effect": "Allow", "Principal": {"AWS": "*"},
                                       "Action": "s3:GetObject", "Resource": BUNDLE, "Condition": ACCOUNT}
    # public repositories and the SSM Agent's buckets in the stack's Region: reads only, signed or anonymous
    owned = by_sid["ReadAwsOwnedRepositories"]
    assert owned["Action"] == "s3:GetObject" and "Condition" not in owned
    assert sorted(owned["Resource"]) == sorted(f"arn:aws:s3:::{bucket}/*" for bucket in (
        "al2023-repos-us-east-1-*", "amazon-ssm-us-east-1", "aws-ssm-us-east-1", "us-east-1-birdwatcher-prod",
        "aws-ssm-distributor-file-us-east-1", "aws-ssm-document-attachments-us-east-1", "fsx-lustre-client-repo",
        "fsx-lustre-client-repo-public-keys"))


def test_logs_and_auto_scaling_pass_the_clusters_group_only(isolated):
    network, template = isolated
    policies = _endpoint_policies(network, template)
    (logs_statement,) = policies["LogsEndpoint"]
    group = {"Fn::Join": ["", ["arn:aws:logs:us-east-1:", {"Ref": "AWS::AccountId"}, f":log-group:{LOG_GROUP}"]]}
    assert logs_statement["Action"] == "logs:*" and logs_statement["Condition"] == ACCOUNT
    assert logs_statement["Resource"] == [group, {"Fn::Join": ["", [*group["Fn::Join"][1][:-1],
                                                                      f":log-group:{LOG_GROUP}:*"]]}]
    by_sid = {s["Sid"]: s for s in policies["AutoScalingEndpoint"]}
    assert by_sid["ClusterGroup"]["Action"] == "autoscaling:*"
    assert by_sid["ClusterGroup"]["Resource"]["Fn::Join"][1][-1] == (
        f":autoScalingGroup:*:autoScalingGroupName/{GROUP}")
    assert (by_sid["Describes"]["Action"], by_sid["Describes"]["Resource"]) == ("autoscaling:Describe*", "*")
    assert {s["Condition"] == ACCOUNT for s in by_sid.values()} == {True}


@pytest.mark.parametrize("endpoint", ["SsmEndpoint", "SsmMessagesEndpoint", "Ec2MessagesEndpoint",
                                      "MonitoringEndpoint", "Ec2Endpoint"])
def test_the_other_endpoints_pass_the_stacks_account_only(isolated, endpoint):
    network, template = isolated
    assert _endpoint_policies(network, template)[endpoint] == [{
        "Sid": "AccountPrincipals", "Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "*", "Resource": "*",
        "Condition": ACCOUNT}]


def test_the_job_table_endpoint_passes_one_read_of_the_table_from_the_nodes_subnets_only():
    # issue 42: a node's `start` reads its job's item; the endpoint exists only with that statement
    stack = bare_stack()
    network = _new_network(stack, natGateway="false")
    table_arn = "arn:aws:dynamodb:us-east-1:123456789012:table/jobs"
    endpoint = network.allow_job_table_read(table_arn=table_arn)
    template = Template.from_stack(stack)
    properties = template.to_json()["Resources"][stack.get_logical_id(endpoint.node.default_child)]["Properties"]
    assert properties["VpcEndpointType"] == "Gateway"
    assert "dynamodb" in str(properties["ServiceName"])
    assert properties["PolicyDocument"]["Statement"] == [{
        "Sid": "JobTableGetItem", "Effect": "Allow", "Principal": {"AWS": "*"}, "Action": "dynamodb:GetItem",
        "Resource": table_arn, "Condition": ACCOUNT}]
    node_route_tables = [stack.resolve(s.route_table.route_table_id) for s in network.node_subnets.subnets]
    assert properties["RouteTableIds"] == node_route_tables
