"""TrainingClusterStack: wires the cluster's constructs together; every decision lives in a construct.

Build order: observability (log group, alarm topic) -> network -> capacity -> storage -> jobs document -> job
keeper (table, function, rules) -> the node bundle and user-data (the node config names the job table) -> nodes
-> alarms -> dashboard -> outputs -> cdk-nag suppressions and checkov exceptions.
"""

from __future__ import annotations

import tempfile
from pathlib import Path

from aws_cdk import Aws, CfnOutput, Fn, Stack, Tags
from aws_cdk import aws_autoscaling as autoscaling
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_lambda as lambda_
from aws_cdk import aws_s3_assets as s3_assets
from constructs import Construct

from cluster_constructs.bundle import REPO_ROOT, read_lock, stage_bundle, stage_keeper_code
from cluster_constructs.capacity import CapacityTarget
from cluster_constructs.capacity_purchase import CapacityPurchaser
from cluster_constructs.compute import NodeGroup
from cluster_constructs.dashboard import ClusterDashboard
from cluster_constructs.job_keeper import JobKeeper
from cluster_constructs.jobs import JobRunner
from cluster_constructs.network import ClusterNetwork
from cluster_constructs.node_config import BUNDLE_DIR, checkpoint_root, render_node_config
from cluster_constructs.observability import ClusterObservability, retention_days
from cluster_constructs.storage import ClusterStorage
from cluster_spec.settings import CAPACITY_BLOCK_SCALE_IN_LEAD, CapacityMode, ClusterSettings
from stacks.checkov_exceptions import apply_checkov_exceptions
from stacks.nag_suppressions import apply_nag_suppressions

STACK_NAME = "TrainingClusterStack"
USER_DATA_TEMPLATE = REPO_ROOT / "node_bootstrap" / "user_data.sh"


class TrainingClusterStack(Stack):
    def __init__(self, scope: Construct, construct_id: str, *, settings: ClusterSettings, **kwargs) -> None:
        super().__init__(scope, construct_id, **kwargs)
        self.settings = settings
        compute, capacity_settings = settings.compute, settings.capacity
        group_name = f"{construct_id}-nodes"

        observability = ClusterObservability(
            self,
            "Observability",
            settings=settings.observability,
            log_group_name=unique_log_group_name(construct_id),
        )
        network = ClusterNetwork(
            self,
            "Network",
            settings=settings.network,
            flow_log_retention=retention_days(settings.observability.log_retention_days),
            log_group_name=observability.log_group.log_group_name,
            auto_scaling_group_name=group_name,
        )
        if settings.storage.fsx_efa_enabled:
            network.allow_efa_file_system()
        subnet = network.node_subnets.subnets[0]
        capacity = CapacityTarget(
            self,
            "Capacity",
            settings=capacity_settings,
            instance_type=compute.instance_type.name,
            node_count=compute.group_size,  # a created ODCR holds the spares too
            availability_zone=settings.network.availability_zone,
        )
        storage = ClusterStorage(
            self,
            "Storage",
            settings=settings.storage,
            subnet=subnet,
            security_group=network.file_system_security_group,
        )
        # The file system is retained on `cdk destroy`; so must be the network it still sits in.
        network.retain_for_file_system()

        # A private staging directory per synthesis (two synths at once must not share one); CDK copies the
        # asset into cdk.out as the Asset is constructed, so the directory can go right after.
        with tempfile.TemporaryDirectory(prefix="node-bundle-") as staging:
            bundle = s3_assets.Asset(self, "NodeBundle", path=str(stage_bundle(Path(staging) / "bundle")))
        # The jobs document and the job keeper (its table) before the node config: a node's `start` checks its job
        # and attempt against the table, which the node config names (node_bootstrap/jobs/job_table.py).
        jobs = JobRunner(
            self,
            "Jobs",
            log_group=observability.log_group,
            auto_scaling_group_name=group_name,
            bundle_dir=BUNDLE_DIR,
        )
        # The keeper's code asset is staged like the node bundle; the function binds it (and CDK copies it into
        # cdk.out) as it is constructed, inside the block.
        with tempfile.TemporaryDirectory(prefix="keeper-code-") as staging:
            keeper = JobKeeper(
                self,
                "JobKeeper",
                code=lambda_.Code.from_asset(str(stage_keeper_code(Path(staging) / "keeper"))),
                auto_scaling_group_name=group_name,
                job_document_name=jobs.document_name,
                alarm_topic=observability.alarm_topic,
                instance_type=compute.instance_type.name,
                capacity_mode=capacity_settings.mode,
                capacity_reservation_id=capacity.reservation_id,
                log_retention=retention_days(settings.observability.log_retention_days),
                # next to the job logs: /training-cluster/<stack name>/<stack id's UUID>/job-keeper
                log_group_name=f"{unique_log_group_name(construct_id)}/job-keeper",
            )
        # What the nodes can run: the FP8 backends the bundle's training lock installs (clusterctl submit
        # refuses a config that asks for another).
        fp8_backends = read_lock().fp8_backends()
        node_config = render_node_config(
            stack_name=construct_id,
            region=settings.region,
            compute=compute,
            storage=settings.storage,
            observability=settings.observability,
            file_system_dns_name=storage.dns_name,
            file_system_mount_name=storage.mount_name,
            log_group_name=observability.log_group.log_group_name,
            bootstrap=settings.bootstrap,
            auto_scaling_group_name=group_name,
            health=settings.health,
            fp8_backends=fp8_backends,
            job_table_name=keeper.table.table_name,
        )
        user_data = ec2.UserData.custom(
            render_user_data(
                USER_DATA_TEMPLATE.read_text(),
                region=settings.region,
                bundle_s3_uri=bundle.s3_object_url,
                node_config_json=self.to_json_string(node_config, space=2),
                log_group_name=observability.log_group.log_group_name,
            )
        )

        starts_later = (
            capacity_settings.mode is CapacityMode.CAPACITY_BLOCK and capacity_settings.reservation_start
        )
        nodes = NodeGroup(
            self,
            "Nodes",
            settings=compute,
            capacity=capacity,
            subnet=subnet,
            security_group=network.node_security_group,
            user_data=user_data,
            log_group_arn=observability.log_group.log_group_arn,
            group_name=group_name,
            desired_capacity=0 if starts_later else compute.group_size,
        )
        # The bundle object only, not the CDK assets bucket (every asset of every stack in the account and Region).
        # No grant on the data and checkpoint buckets: the nodes reach both through Lustre, and the export to S3 is
        # the file system's doing, so a compromised node cannot delete or rewrite S3 objects.
        nodes.allow_object_download(bucket_name=bundle.s3_bucket_name, object_key=bundle.s3_object_key)
        # What the nodes' subnets may reach of S3 at all: the same object, and the stack's two buckets.
        network.allow_s3(
            bucket_names=[storage.data_bucket.bucket_name, storage.checkpoint_bucket.bucket_name],
            object_arns=[bundle.bucket.arn_for_objects(bundle.s3_object_key)],
        )
        nodes.auto_scaling_group.notification_configurations = [
            autoscaling.CfnAutoScalingGroup.NotificationConfigurationProperty(
                topic_arn=observability.alarm_topic.topic_arn,
                notification_types=[
                    "autoscaling:EC2_INSTANCE_LAUNCH",
                    "autoscaling:EC2_INSTANCE_LAUNCH_ERROR",
                    "autoscaling:EC2_INSTANCE_TERMINATE",
                    "autoscaling:EC2_INSTANCE_TERMINATE_ERROR",
                ],
            )
        ]
        # The bundle is read at boot, and the nodes mount FSx: launch nodes only once both exist.
        nodes.auto_scaling_group.node.add_dependency(storage.data_association, storage.checkpoint_association)
        self._schedule_capacity_block(nodes, compute.group_size)

        jobs.allow_job_table(keeper.table.table_arn)
        nodes.allow_job_table_read(table_arn=keeper.table.table_arn)
        network.allow_job_table_read(table_arn=keeper.table.table_arn)
        # Buying a Capacity Block spends money that cannot be refunded: a policy of its own, not the operator's.
        purchaser = CapacityPurchaser(self, "CapacityPurchaser")
        observability.add_job_keeper_alarm(function_name=keeper.function.function_name)
        observability.add_node_alarm(auto_scaling_group_name=group_name)
        observability.add_protected_mode_alarm(auto_scaling_group_name=group_name)
        if settings.health.monitor_enabled:
            observability.add_node_health_alarm(auto_scaling_group_name=group_name)
        observability.add_file_system_alarm(
            file_system_id=storage.file_system.ref, storage_capacity_gib=settings.storage.fsx_storage_gib
        )
        observability.add_metric_alarms(
            auto_scaling_group_name=group_name,
            cluster_name=construct_id,
            usd_per_node_hour=compute.instance_type.on_demand_usd_per_hour,
        )
        dashboard = ClusterDashboard(
            self,
            "Dashboard",
            # dashboards are global to the account, not regional: the region keeps two clusters apart
            dashboard_name=f"{construct_id}-{settings.region}",
            cluster_name=construct_id,
            auto_scaling_group_name=group_name,
            file_system_id=storage.file_system.ref,
            instance_type=compute.instance_type,
            interval_seconds=settings.observability.metrics_interval_seconds,
            log_group_name=observability.log_group.log_group_name,
        )
        dashboard.add_alarms(observability.alarms)

        outputs = {
            "DataBucketName": storage.data_bucket.bucket_name,
            "CheckpointBucketName": storage.checkpoint_bucket.bucket_name,
            "FileSystemId": storage.file_system.ref,
            "FileSystemDnsName": storage.dns_name,
            "FileSystemMountName": storage.mount_name,
            "CheckpointRoot": checkpoint_root(settings.storage),
            # What a retained file system still uses after `cdk destroy`: note them first (docs/operations.md).
            "VpcId": network.vpc.vpc_id,
            "FileSystemSubnetId": subnet.subnet_id,
            "FileSystemSecurityGroupId": network.file_system_security_group.security_group_id,
            "AutoScalingGroupName": nodes.auto_scaling_group.ref,
            "LaunchTemplateId": nodes.launch_template.ref,
            "LogGroupName": observability.log_group.log_group_name,
            "JobDocumentName": jobs.document_name,
            "JobTableName": keeper.table.table_name,
            "MaxJobRestarts": str(settings.job_keeper.max_job_restarts),
            "JobKeeperLogGroupName": keeper.log_group.log_group_name,
            "OperatorPolicyArn": jobs.operator_policy.managed_policy_arn,
            "CapacityPurchaserPolicyArn": purchaser.policy.managed_policy_arn,
            "AlarmTopicArn": observability.alarm_topic.topic_arn,
            "DashboardName": dashboard.dashboard_name,
            "DashboardUrl": dashboard.url,
            "MetricsIntervalSeconds": str(settings.observability.metrics_interval_seconds),
            "InstanceType": compute.instance_type.name,
            "NodeCount": str(compute.node_count),  # a job's nodes; the group holds NodeCount + SpareNodes
            "SpareNodes": str(compute.spare_nodes),
            "CapacityMode": capacity_settings.mode.value,
            "Fp8Backends": ",".join(fp8_backends),
        }
        if capacity.reservation_id:
            outputs["CapacityReservationId"] = capacity.reservation_id
        for key, value in outputs.items():
            CfnOutput(self, key, value=value)

        for key, value in settings.tags.items():
            Tags.of(self).add(key, value)
        apply_nag_suppressions(self)
        apply_checkov_exceptions(self)
        self._quiet_cdk_internal_lint()

    def _quiet_cdk_internal_lint(self) -> None:
        # CDK's own custom resource that strips the default security group's rules declares a DependsOn that a
        # GetAtt already implies (cfn-lint W3005); it is CDK's template, not ours to restructure.
        provider = self.node.try_find_child("Custom::VpcRestrictDefaultSGCustomResourceProvider")
        handler = provider.node.try_find_child("Handler") if provider else None
        if handler is not None:
            handler.add_metadata("cfn-lint", {"config": {"ignore_checks": ["W3005"]}})

    def _schedule_capacity_block(self, nodes: NodeGroup, node_count: int) -> None:
        """Capacity Blocks: scale up when the block starts, and to zero before it ends."""
        capacity = self.settings.capacity
        if capacity.mode is not CapacityMode.CAPACITY_BLOCK:
            return
        actions = []
        if capacity.reservation_start:
            actions.append(("ScaleUpAtBlockStart", capacity.reservation_start, node_count))
        if capacity.reservation_end:
            actions.append(
                ("ScaleInBeforeBlockEnd", capacity.reservation_end - CAPACITY_BLOCK_SCALE_IN_LEAD, 0)
            )
        for construct_id, when, size in actions:
            autoscaling.CfnScheduledAction(
                self,
                construct_id,
                auto_scaling_group_name=nodes.auto_scaling_group.ref,
                start_time=when.strftime("%Y-%m-%dT%H:%M:%SZ"),
                min_size=size,
                max_size=size,
                desired_capacity=size,
            )


def unique_log_group_name(stack_name: str) -> str:
    """`/training-cluster/<stack name>/<stack id's UUID>`: readable, and new for every deployment of the stack.

    The log group is retained when the stack is deleted (job logs are a run's record). A fixed name would make the
    next `cdk deploy` of the same stack fail with "already exists"; the UUID of the stack id is new for each
    creation, so a redeploy after `cdk destroy` gets a group of its own and the old one stays readable.
    """
    stack_uuid = Fn.select(2, Fn.split("/", Aws.STACK_ID))  # arn:...:stack/<name>/<uuid>
    return Fn.join("", [f"/training-cluster/{stack_name}/", stack_uuid])


def render_user_data(
    template: str, *, region: str, bundle_s3_uri: str, node_config_json: str, log_group_name: str
) -> str:
    """Fill the user-data template's placeholders (node_bootstrap/user_data.sh). Values may be CDK tokens."""
    rendered = template
    for placeholder, value in (
        ("@@REGION@@", region),
        ("@@BUNDLE_S3_URI@@", bundle_s3_uri),
        ("@@NODE_CONFIG_JSON@@", node_config_json),
        ("@@LOG_GROUP@@", log_group_name),
    ):
        # Exactly once: a placeholder quoted in a comment would splice multi-line JSON into the script.
        if (found := rendered.count(placeholder)) != 1:
            raise ValueError(f"user-data template has the placeholder {placeholder} {found} times, not once")
        rendered = rendered.replace(placeholder, value)
    return rendered
