"""ClusterNetwork: a single-AZ VPC for the nodes, its endpoints, and the EFA and FSx security groups.

Every endpoint has a policy (cluster_constructs/endpoint_policies.py): what may pass it is the stack's own
resources, or the stack's account, and never another account's credentials or buckets. With natGateway=true the
nodes reach the Region's S3 through the gateway endpoint too (its route is the more specific), so its policy
holds either way.
"""

from __future__ import annotations

from collections.abc import Sequence

from aws_cdk import CfnResource, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_logs as logs
from constructs import Construct

from cluster_constructs import endpoint_policies
from cluster_spec.settings import NetworkSettings

# Lustre (LNet) uses TCP 988 and 1018-1023 between clients and file servers, in both directions
# (FSx for Lustre User Guide, "File system access control with Amazon VPC").
LUSTRE_PORTS = (ec2.Port.tcp(988), ec2.Port.tcp_range(1018, 1023))

# AWS APIs the nodes call without a NAT: SSM agent and Run Command, CloudWatch Logs and metrics, the instance's
# own tags and its Auto Scaling health.
INTERFACE_ENDPOINTS = {
    "Ssm": ec2.InterfaceVpcEndpointAwsService.SSM,
    "SsmMessages": ec2.InterfaceVpcEndpointAwsService.SSM_MESSAGES,
    "Ec2Messages": ec2.InterfaceVpcEndpointAwsService.EC2_MESSAGES,
    "Logs": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_LOGS,
    "Monitoring": ec2.InterfaceVpcEndpointAwsService.CLOUDWATCH_MONITORING,
    "Ec2": ec2.InterfaceVpcEndpointAwsService.EC2,
    "AutoScaling": ec2.InterfaceVpcEndpointAwsService.AUTOSCALING,
}


class ClusterNetwork(Construct):
    """The VPC in the configured AZ, with private subnets for nodes and FSx, and the security groups.

    `node_security_group` is the EFA group: it allows all traffic to and from itself (EFA traffic is not IP
    traffic, so an egress rule to 0.0.0.0/0 does not cover it), HTTPS out to AWS APIs and the internet, and
    Lustre to the file system. `file_system_security_group` is FSx's.
    """

    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: NetworkSettings,
        flow_log_retention: logs.RetentionDays,
        log_group_name: str,
        auto_scaling_group_name: str,
    ) -> None:
        """`log_group_name` and `auto_scaling_group_name`: the cluster's log group and node group, the only ones
        the nodes may reach through the Logs and Auto Scaling endpoints."""
        super().__init__(scope, construct_id)

        subnets = [
            ec2.SubnetConfiguration(
                name="Nodes",
                subnet_type=ec2.SubnetType.PRIVATE_WITH_EGRESS
                if settings.nat_gateway
                else ec2.SubnetType.PRIVATE_ISOLATED,
                cidr_mask=20,  # EFA-only interfaces take no IP address: one address per node, plus FSx and endpoints
            )
        ]
        if settings.nat_gateway:
            subnets.append(
                ec2.SubnetConfiguration(name="Public", subnet_type=ec2.SubnetType.PUBLIC, cidr_mask=24)
            )

        self.vpc = ec2.Vpc(
            self,
            "Vpc",
            ip_addresses=ec2.IpAddresses.cidr(settings.vpc_cidr),
            availability_zones=[settings.availability_zone],
            nat_gateways=1 if settings.nat_gateway else 0,
            subnet_configuration=subnets,
            restrict_default_security_group=True,
        )
        self.node_subnets = self.vpc.select_subnets(subnet_group_name="Nodes")
        for subnet in self.vpc.private_subnets + self.vpc.isolated_subnets + self.vpc.public_subnets:
            # The zone is a setting on purpose: a Capacity Block or reservation lives in one named AZ.
            subnet.node.default_child.add_metadata("cfn-lint", {"config": {"ignore_checks": ["W3010"]}})

        flow_log_group = logs.LogGroup(
            self, "FlowLogs", retention=flow_log_retention, removal_policy=RemovalPolicy.DESTROY
        )
        self.vpc.add_flow_log(
            "FlowLog",
            destination=ec2.FlowLogDestination.to_cloud_watch_logs(flow_log_group),
            traffic_type=ec2.FlowLogTrafficType.REJECT,
        )

        self.node_security_group = self._efa_security_group()
        self.file_system_security_group = self._file_system_security_group()
        self._add_endpoints(log_group_name=log_group_name, auto_scaling_group_name=auto_scaling_group_name)

    def _efa_security_group(self) -> ec2.SecurityGroup:
        # allow_all_outbound must be False: with it True, CDK drops explicit egress rules, and the self-egress
        # rule EFA needs would silently vanish (AWS EFA User Guide, "Prepare an EFA-enabled security group").
        group = ec2.SecurityGroup(
            self,
            "NodeEfaSecurityGroup",
            vpc=self.vpc,
            allow_all_outbound=False,
            description="EFA nodes: all traffic within the group, HTTPS out, Lustre to FSx",
        )
        group.add_ingress_rule(group, ec2.Port.all_traffic(), "EFA and NCCL between nodes")
        group.add_egress_rule(group, ec2.Port.all_traffic(), "EFA and NCCL between nodes")
        group.add_egress_rule(
            ec2.Peer.any_ipv4(), ec2.Port.tcp(443), "HTTPS to AWS APIs, S3 and package mirrors"
        )
        return group

    def _file_system_security_group(self) -> ec2.SecurityGroup:
        group = ec2.SecurityGroup(
            self,
            "FileSystemSecurityGroup",
            vpc=self.vpc,
            allow_all_outbound=False,
            description="FSx for Lustre: Lustre traffic with the nodes and between servers",
        )
        for port in LUSTRE_PORTS:
            group.add_ingress_rule(group, port, "Lustre between file servers")
            group.add_egress_rule(group, port, "Lustre between file servers")
            self.allow_lustre_between(self.node_security_group, group, port)
        return group

    @staticmethod
    def allow_lustre_between(clients: ec2.SecurityGroup, servers: ec2.SecurityGroup, port: ec2.Port) -> None:
        # Explicit rules on both groups in both directions: Lustre servers also open connections to clients.
        clients.add_egress_rule(servers, port, "Lustre to FSx")
        clients.add_ingress_rule(servers, port, "Lustre from FSx")
        servers.add_ingress_rule(clients, port, "Lustre from nodes")
        servers.add_egress_rule(clients, port, "Lustre to nodes")

    def allow_efa_file_system(self) -> None:
        """EFA-enabled FSx for Lustre talks EFA to its clients: all traffic both ways between the groups."""
        nodes, servers = self.node_security_group, self.file_system_security_group
        nodes.add_ingress_rule(servers, ec2.Port.all_traffic(), "EFA from FSx")
        nodes.add_egress_rule(servers, ec2.Port.all_traffic(), "EFA to FSx")
        servers.add_ingress_rule(nodes, ec2.Port.all_traffic(), "EFA from nodes")
        servers.add_egress_rule(nodes, ec2.Port.all_traffic(), "EFA to nodes")
        servers.add_ingress_rule(servers, ec2.Port.all_traffic(), "EFA between file servers")
        servers.add_egress_rule(servers, ec2.Port.all_traffic(), "EFA between file servers")

    def retain_for_file_system(self) -> None:
        """Keep, on stack deletion, what a retained FSx file system still uses: the VPC, the node subnet, the file
        system's security group and its rules between file servers.

        CloudFormation cannot delete a security group or subnet that a network interface still uses, nor a VPC
        that still holds a subnet: with the file system retained (its ENIs stay), `cdk destroy` would end in
        DELETE_FAILED on exactly these. Retained, the rest of the stack deletes cleanly (NAT gateway, endpoints,
        routes, the nodes' groups, whose rules to and from the file system's group are separate resources), and
        the retained file system keeps working until its data is safe. The runbook deletes them after it.
        """
        retained: list[CfnResource] = [
            self.vpc.node.default_child,
            *(subnet.node.default_child for subnet in self.node_subnets.subnets),
            self.file_system_security_group.node.default_child,
            *self._self_rules(self.file_system_security_group),
        ]
        for resource in retained:
            resource.apply_removal_policy(RemovalPolicy.RETAIN)

    @staticmethod
    def _self_rules(group: ec2.SecurityGroup) -> list[CfnResource]:
        """The group's rules whose peer is the group itself (file server to file server)."""
        stack = Stack.of(group)
        own_id = stack.resolve(group.security_group_id)
        rules = []
        for child in group.node.children:
            if isinstance(child, ec2.CfnSecurityGroupIngress):
                peer = child.source_security_group_id
            elif isinstance(child, ec2.CfnSecurityGroupEgress):
                peer = child.destination_security_group_id
            else:
                continue
            if peer is not None and stack.resolve(peer) == own_id:
                rules.append(child)
        return rules

    def allow_s3(self, *, bucket_names: Sequence[str], object_arns: Sequence[str]) -> None:
        """Let the nodes' subnets reach these buckets of the stack (any action: IAM and the bucket policies
        decide) and these single objects (GetObject: the bundle in the CDK assets bucket) through the S3
        endpoint, for principals of the account."""
        for statement in endpoint_policies.stack_s3_statements(Stack.of(self), bucket_names, object_arns):
            self.s3_endpoint.add_to_policy(statement)

    def allow_job_table_read(self, *, table_arn: str) -> ec2.GatewayVpcEndpoint:
        """A DynamoDB gateway endpoint for the nodes' subnets that passes one read (GetItem) of this job table,
        for principals of the account: a node checks each job start against it (node_bootstrap/jobs/
        job_table.py). A gateway endpoint costs nothing, like S3's; its route is the more specific, so with
        natGateway=true the nodes' DynamoDB traffic passes it too. Made here, with its only statement, so the
        endpoint never exists without a policy (an endpoint with none passes everything)."""
        endpoint = self.vpc.add_gateway_endpoint(
            "DynamoDbEndpoint",
            service=ec2.GatewayVpcEndpointAwsService.DYNAMODB,
            subnets=[ec2.SubnetSelection(subnet_group_name="Nodes")],
        )
        for statement in endpoint_policies.job_table_statements(Stack.of(self), table_arn):
            endpoint.add_to_policy(statement)
        return endpoint

    def _add_endpoints(self, *, log_group_name: str, auto_scaling_group_name: str) -> None:
        stack = Stack.of(self)
        self.s3_endpoint = self.vpc.add_gateway_endpoint(
            "S3Endpoint",
            service=ec2.GatewayVpcEndpointAwsService.S3,
            subnets=[ec2.SubnetSelection(subnet_group_name="Nodes")],
        )
        # What the node's software reads from AWS-owned buckets; the stack's own buckets come with allow_s3.
        for statement in endpoint_policies.aws_owned_s3_statements(stack):
            self.s3_endpoint.add_to_policy(statement)
        endpoint_group = ec2.SecurityGroup(
            self,
            "EndpointSecurityGroup",
            vpc=self.vpc,
            allow_all_outbound=False,
            description="VPC interface endpoints: HTTPS from the nodes",
        )
        endpoint_group.add_ingress_rule(self.node_security_group, ec2.Port.tcp(443), "HTTPS from nodes")
        self.interface_endpoints: dict[str, ec2.InterfaceVpcEndpoint] = {}
        for name, service in INTERFACE_ENDPOINTS.items():
            endpoint = self.vpc.add_interface_endpoint(
                f"{name}Endpoint",
                service=service,
                private_dns_enabled=True,
                security_groups=[endpoint_group],
                open=False,  # only the nodes reach the endpoints (the rule above), not the whole VPC CIDR
                subnets=ec2.SubnetSelection(subnet_group_name="Nodes"),
            )
            for statement in endpoint_policies.interface_statements(
                stack, name, log_group_name=log_group_name, auto_scaling_group_name=auto_scaling_group_name
            ):
                endpoint.add_to_policy(statement)
            self.interface_endpoints[name] = endpoint
