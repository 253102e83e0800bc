"""ClusterNetwork: one AZ, private nodes, the endpoints private nodes need, and the EFA/FSx security groups."""

import aws_cdk as cdk
import pytest
from aws_cdk import aws_logs as logs
from aws_cdk.assertions import Match, Template
from cdk_support import bare_stack, build_settings, resources_of

from cluster_constructs.network import ClusterNetwork


def _network(**overrides):
    stack = bare_stack()
    network = ClusterNetwork(
        stack,
        "Network",
        settings=build_settings(**overrides).network,
        flow_log_retention=logs.RetentionDays.ONE_MONTH,
    )
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
    network = ClusterNetwork(
        stack, "Network", settings=build_settings().network, flow_log_retention=logs.RetentionDays.ONE_MONTH
    )
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
