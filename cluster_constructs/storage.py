"""ClusterStorage: the data and checkpoint buckets, and FSx for Lustre linked to them.

FSx for Lustre PERSISTENT_2 is the nodes' shared file system; two data repository associations link it to S3:

- /data imports the data bucket and exports nothing: new, changed and deleted objects appear in Lustre, but a
  file written or deleted under /fsx/data stays on the file system. Training data is published to S3 (`aws s3
  sync`), so a mistake on one node (an `rm -rf`) can never delete the corpus from the bucket.
- /checkpoints imports and exports, so a checkpoint written on FSx survives the file system.

Both buckets are versioned: an overwritten or deleted object stays recoverable for the retention period.
The nodes get no S3 permission on either bucket: they reach data and checkpoints through Lustre, and the
export is the file system's own doing (its service-linked role). The checkpoint bucket's policy says so: it
denies every object write and delete to every principal but that role and the administrator role the user
names (`checkpointAdminRoleArn`), because writing a checkpoint is running code on the nodes (a DCP `.metadata`
is unpickled on resume; docs/security.md, "The checkpoint bucket's policy"); and it denies lifecycle,
versioning, replication and policy changes to every principal but the stack's deployment and that role.
"""

from __future__ import annotations

from aws_cdk import DefaultStackSynthesizer, Duration, Fn, RemovalPolicy, Stack
from aws_cdk import aws_ec2 as ec2
from aws_cdk import aws_fsx as fsx
from aws_cdk import aws_iam as iam
from aws_cdk import aws_s3 as s3
from constructs import Construct

from cluster_spec.settings import StorageSettings

DATA_PATH = "/data"
CHECKPOINT_PATH = "/checkpoints"
AUTO_SYNC_EVENTS = ["NEW", "CHANGED", "DELETED"]
# The object-level actions that put, replace, delete or relabel a checkpoint object: the content (PutObject also
# authorizes CopyObject and every multipart upload step), its versions, its ACLs, tags, retention and legal hold,
# and replication into the bucket. Bucket-level actions stay out: the FSx role needs PutBucketNotification for
# auto-import, and CloudFormation must keep updating the bucket and this policy on every deploy.
CHECKPOINT_WRITE_ACTIONS = (
    "s3:PutObject",
    "s3:DeleteObject",
    "s3:DeleteObjectVersion",
    "s3:AbortMultipartUpload",
    "s3:PutObjectAcl",
    "s3:PutObjectVersionAcl",
    "s3:PutObjectTagging",
    "s3:PutObjectVersionTagging",
    "s3:DeleteObjectTagging",
    "s3:DeleteObjectVersionTagging",
    "s3:PutObjectRetention",
    "s3:PutObjectLegalHold",
    "s3:ReplicateObject",
    "s3:ReplicateDelete",
    "s3:ReplicateTags",
)
# Bucket settings that could expire or stop keeping every checkpoint version (a lifecycle rule, versioning
# suspended, a replication rule) or lift the policy itself (issue 42): only the stack's deployment and the
# admin role change them.
CHECKPOINT_CONFIG_ACTIONS = (
    "s3:PutLifecycleConfiguration",
    "s3:PutBucketVersioning",
    "s3:PutReplicationConfiguration",
    "s3:PutBucketPolicy",
    "s3:DeleteBucketPolicy",
    "s3:PutBucketObjectLockConfiguration",
)
# FSx for Lustre reaches a linked bucket with a service-linked role of each file system, under this path (FSx for
# Lustre User Guide, "Using service-linked roles": AWSServiceRoleForFSxS3Access_fs-01234567890; the AWS managed
# policy FSxDeleteServiceLinkedRoleAccess names role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/
# AWSServiceRoleForFSxS3Access_*).
FSX_S3_ROLE_PATH = "aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/"
FSX_S3_ROLE_PREFIX = "AWSServiceRoleForFSxS3Access_"


class ClusterStorage(Construct):
    def __init__(
        self,
        scope: Construct,
        construct_id: str,
        *,
        settings: StorageSettings,
        subnet: ec2.ISubnet,
        security_group: ec2.ISecurityGroup,
    ) -> None:
        super().__init__(scope, construct_id)
        self.settings = settings

        self.access_log_bucket = s3.Bucket(
            self,
            "AccessLogs",
            encryption=s3.BucketEncryption.S3_MANAGED,
            enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            versioned=True,  # a deleted log object stays recoverable for a while: the logs are the audit trail
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="ExpireAccessLogs",
                    expiration=Duration.days(365),
                    noncurrent_version_expiration=Duration.days(30),
                )
            ],
            removal_policy=RemovalPolicy.RETAIN,
        )
        self.data_bucket = self._bucket(
            "DataBucket",
            settings.data_bucket_name,
            noncurrent_version_days=settings.data_version_retention_days,
        )
        self.checkpoint_bucket = self._bucket(
            "CheckpointBucket",
            settings.checkpoint_bucket_name,
            noncurrent_version_days=settings.checkpoint_version_retention_days,
        )

        self.file_system = fsx.CfnFileSystem(
            self,
            "FileSystem",
            file_system_type="LUSTRE",
            file_system_type_version="2.15",
            storage_type="SSD",
            storage_capacity=settings.fsx_storage_gib,
            subnet_ids=[subnet.subnet_id],
            security_group_ids=[security_group.security_group_id],
            lustre_configuration=fsx.CfnFileSystem.LustreConfigurationProperty(
                deployment_type="PERSISTENT_2",
                per_unit_storage_throughput=settings.fsx_throughput_mbps_per_tib,
                data_compression_type="LZ4",  # token data and checkpoints compress; saves throughput and space
                # AUTOMATIC provisions metadata IOPS with the storage capacity (PERSISTENT_2 metadata config).
                metadata_configuration=fsx.CfnFileSystem.MetadataConfigurationProperty(mode="AUTOMATIC"),
                efa_enabled=settings.fsx_efa_enabled or None,
                weekly_maintenance_start_time="7:03:00",  # Sunday 03:00 UTC
                automatic_backup_retention_days=0,  # the checkpoint bucket (versioned) is the copy that matters
            ),
        )
        # A checkpoint written just before `cdk destroy` may not be exported to S3 yet, and CloudFormation has no
        # snapshot-on-delete for FSx: the file system is retained, and the runbook says how to delete it.
        self.file_system.apply_removal_policy(RemovalPolicy.RETAIN)

        self.data_association = self._association(
            "DataAssociation", self.data_bucket, DATA_PATH, export=False
        )
        self.checkpoint_association = self._association(
            "CheckpointAssociation", self.checkpoint_bucket, CHECKPOINT_PATH, export=True
        )
        # One association at a time: a file system works through its associations' creation one by one, and
        # ordering them keeps CloudFormation from racing two creations (not verified that a race fails; the
        # order costs a few minutes once, a failed create would cost a rollback).
        self.checkpoint_association.node.add_dependency(self.data_association)
        if isinstance(self.checkpoint_bucket, s3.Bucket):  # an imported bucket's policy is its owner's
            self.checkpoint_bucket.add_to_resource_policy(self._checkpoint_writers_only())
            self.checkpoint_bucket.add_to_resource_policy(self._checkpoint_config_admins_only())
            # Kept with the retained bucket on `cdk destroy`: a retained bucket without it would take any
            # writer's checkpoints again, while the retained file system still exports to it.
            self.checkpoint_bucket.policy.apply_removal_policy(RemovalPolicy.RETAIN)

    @property
    def export_role_arn(self) -> str:
        """The ARN of this file system's S3 role (it exists once the first association is created)."""
        return Stack.of(self).format_arn(
            service="iam", region="", resource="role",
            resource_name=f"{FSX_S3_ROLE_PATH}{FSX_S3_ROLE_PREFIX}{self.file_system.ref}",
        )

    def _checkpoint_writers_only(self) -> iam.PolicyStatement:
        """Deny object writes and deletes to every principal but this file system's export and the admin role.

        A Deny with an aws:PrincipalArn exception, not an Allow list: IAM grants elsewhere in the account
        (AmazonS3FullAccess, s3:* on *) cannot override it. aws:PrincipalArn is a role's ARN for each of its
        sessions, and is absent for anonymous requests, which ArnNotLike then denies too. Reads stay with IAM.
        Nothing else writes this bucket: S3 server access logs go to the access-log bucket, lifecycle
        expiration is S3's own and no principal, and no CDK custom resource empties it (it is retained).
        """
        writers = [self.export_role_arn]
        if self.settings.checkpoint_admin_role_arn:
            writers.append(self.settings.checkpoint_admin_role_arn)
        return iam.PolicyStatement(
            sid="OnlyTheExportAndTheAdminRoleWrite",
            effect=iam.Effect.DENY,
            principals=[iam.AnyPrincipal()],
            actions=list(CHECKPOINT_WRITE_ACTIONS),
            resources=[self.checkpoint_bucket.arn_for_objects("*")],
            conditions={"ArnNotLike": {"aws:PrincipalArn": writers}},
        )

    def _checkpoint_config_admins_only(self) -> iam.PolicyStatement:
        """Deny lifecycle, versioning, replication and policy changes to every principal but the stack's
        deployment (CloudFormation's execution role, which sets the lifecycle rule and this policy) and the
        admin role: a principal with broad S3 rights could otherwise set a rule that expires every checkpoint
        version. The same aws:PrincipalArn exception as the object deny. The account's root user can still
        delete a bucket policy (S3's own lockout recovery)."""
        admins = [self._deployment_role_arn()]
        if self.settings.checkpoint_admin_role_arn:
            admins.append(self.settings.checkpoint_admin_role_arn)
        return iam.PolicyStatement(
            sid="OnlyTheDeploymentAndTheAdminRoleReconfigure",
            effect=iam.Effect.DENY,
            principals=[iam.AnyPrincipal()],
            actions=list(CHECKPOINT_CONFIG_ACTIONS),
            resources=[self.checkpoint_bucket.bucket_arn],
            conditions={"ArnNotLike": {"aws:PrincipalArn": admins}},
        )

    def _deployment_role_arn(self) -> str:
        """The role CloudFormation deploys this stack with: the CDK bootstrap's execution role (default
        synthesizer; its ARN carries ${AWS::Partition}, so it goes through Fn::Sub). app.py uses only the default
        synthesizer; another one names no execution role (CliCredentialsStackSynthesizer deploys as the caller),
        so the policy could not tell the deployment from anyone else: it is refused at synth."""
        synthesizer = Stack.of(self).synthesizer
        if not isinstance(synthesizer, DefaultStackSynthesizer):
            raise ValueError(
                f"checkpoint bucket policy: synthesizer {type(synthesizer).__name__}: allowed: DefaultStackSynthesizer "
                "(app.py's; its qualifier and roles may be changed through its arguments), whose CloudFormation "
                "execution role is the one deployment exempt from the bucket's deny on lifecycle, versioning, "
                "replication and policy changes. With another synthesizer, bring the checkpoint bucket: "
                "-c checkpointBucketName=<bucket> (the stack sets no policy on it; docs/security.md)")
        return Fn.sub(synthesizer.cloud_formation_execution_role_arn)

    def _bucket(self, construct_id: str, existing_name: str | None, *, noncurrent_version_days: int) -> s3.IBucket:
        if existing_name:
            # The user's own bucket: this stack cannot version it (the README says to); the nodes get no S3
            # grant on it either way.
            return s3.Bucket.from_bucket_name(self, construct_id, existing_name)
        return s3.Bucket(
            self,
            construct_id,
            encryption=s3.BucketEncryption.S3_MANAGED,  # FSx data repository associations read it without KMS grants
            enforce_ssl=True,
            block_public_access=s3.BlockPublicAccess.BLOCK_ALL,
            object_ownership=s3.ObjectOwnership.BUCKET_OWNER_ENFORCED,
            # Checkpoints are rewritten under the same keys by keep-last-k, and data is re-synced; an overwritten
            # or deleted object is kept as a noncurrent version for a while, a safety net only.
            versioned=True,
            lifecycle_rules=[
                s3.LifecycleRule(
                    id="ExpireNoncurrentVersions",
                    noncurrent_version_expiration=Duration.days(noncurrent_version_days),
                    abort_incomplete_multipart_upload_after=Duration.days(7),
                )
            ],
            server_access_logs_bucket=self.access_log_bucket,
            server_access_logs_prefix=f"{construct_id}/",
            removal_policy=RemovalPolicy.RETAIN,  # training data and checkpoints outlive the cluster
        )

    def _association(
        self, construct_id: str, bucket: s3.IBucket, path: str, *, export: bool
    ) -> fsx.CfnDataRepositoryAssociation:
        """Link `path` to `bucket`: auto-import always; auto-export only where the file system is the writer."""
        return fsx.CfnDataRepositoryAssociation(
            self,
            construct_id,
            file_system_id=self.file_system.ref,
            file_system_path=path,
            data_repository_path=f"s3://{bucket.bucket_name}",
            batch_import_meta_data_on_create=True,
            s3=fsx.CfnDataRepositoryAssociation.S3Property(
                auto_import_policy=fsx.CfnDataRepositoryAssociation.AutoImportPolicyProperty(
                    events=AUTO_SYNC_EVENTS
                ),
                auto_export_policy=fsx.CfnDataRepositoryAssociation.AutoExportPolicyProperty(
                    events=AUTO_SYNC_EVENTS
                )
                if export
                else None,
            ),
        )

    @property
    def dns_name(self) -> str:
        return self.file_system.attr_dns_name

    @property
    def mount_name(self) -> str:
        return self.file_system.attr_lustre_mount_name
