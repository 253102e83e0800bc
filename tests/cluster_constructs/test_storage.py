"""ClusterStorage: hardened buckets, FSx for Lustre PERSISTENT_2 with LZ4 and metadata, DRAs to S3."""

import pytest
from aws_cdk import aws_ec2 as ec2
from aws_cdk.assertions import Match, Template
from cdk_support import bare_stack, build_settings, resources_of

from cluster_constructs.storage import ClusterStorage


def _storage(stack=None, **overrides):
    stack = stack or bare_stack()
    vpc = ec2.Vpc(
        stack,
        "Vpc",
        availability_zones=["us-east-1a"],
        nat_gateways=0,
        subnet_configuration=[ec2.SubnetConfiguration(name="n", subnet_type=ec2.SubnetType.PRIVATE_ISOLATED)],
    )
    group = ec2.SecurityGroup(stack, "Sg", vpc=vpc)
    storage = ClusterStorage(
        stack,
        "Storage",
        settings=build_settings(**overrides).storage,
        subnet=vpc.isolated_subnets[0],
        security_group=group,
    )
    return storage, Template.from_stack(stack)


@pytest.fixture(scope="module")
def created():
    return _storage()


def test_buckets_are_encrypted_private_and_ssl_only(created):
    _, template = created
    buckets = template.find_resources("AWS::S3::Bucket")
    assert len(buckets) == 3  # data, checkpoints, access logs
    for bucket in buckets.values():
        props = bucket["Properties"]
        assert (
            props["BucketEncryption"]["ServerSideEncryptionConfiguration"][0][
                "ServerSideEncryptionByDefault"
            ]["SSEAlgorithm"]
            == "AES256"
        )
        assert props["PublicAccessBlockConfiguration"] == {
            "BlockPublicAcls": True,
            "BlockPublicPolicy": True,
            "IgnorePublicAcls": True,
            "RestrictPublicBuckets": True,
        }
        assert bucket["DeletionPolicy"] == "Retain"
    for policy in resources_of(template, "AWS::S3::BucketPolicy"):
        deny = [s for s in policy["PolicyDocument"]["Statement"] if s["Effect"] == "Deny"]
        assert deny and deny[0]["Condition"] == {"Bool": {"aws:SecureTransport": "false"}}


def test_data_and_checkpoints_are_versioned_with_old_versions_expiring():
    _, template = _storage(checkpointVersionRetentionDays="30", dataVersionRetentionDays="90")
    buckets = {
        logical_id: b["Properties"]
        for logical_id, b in template.find_resources("AWS::S3::Bucket").items()
        if not logical_id.startswith("StorageAccessLogs")
    }
    days = {}
    for logical_id, props in buckets.items():
        assert props["VersioningConfiguration"] == {"Status": "Enabled"}, logical_id
        (rule,) = props["LifecycleConfiguration"]["Rules"]
        assert rule["Status"] == "Enabled" and rule["AbortIncompleteMultipartUpload"] == {"DaysAfterInitiation": 7}
        days[logical_id.removeprefix("Storage")[:4]] = rule["NoncurrentVersionExpiration"]["NoncurrentDays"]
    # a deleted or overwritten shard or checkpoint stays recoverable for the configured days
    assert days == {"Data": 90, "Chec": 30}


def test_lustre_is_persistent_2_with_lz4_and_metadata(created):
    _, template = created
    template.has_resource_properties(
        "AWS::FSx::FileSystem",
        {
            "FileSystemType": "LUSTRE",
            "StorageCapacity": 4800,
            "LustreConfiguration": {
                "DeploymentType": "PERSISTENT_2",
                "PerUnitStorageThroughput": 1000,
                "DataCompressionType": "LZ4",
                "MetadataConfiguration": {"Mode": "AUTOMATIC"},
                "EfaEnabled": Match.absent(),
            },
        },
    )


def test_data_is_import_only_and_checkpoints_sync_both_ways(created):
    _, template = created
    associations = {
        a["FileSystemPath"]: a for a in resources_of(template, "AWS::FSx::DataRepositoryAssociation")
    }
    assert set(associations) == {"/data", "/checkpoints"}
    # A file deleted or written under /fsx/data never reaches the data bucket: no export on /data.
    assert associations["/data"]["S3"] == {"AutoImportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]}}
    assert associations["/checkpoints"]["S3"] == {
        "AutoImportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]},
        "AutoExportPolicy": {"Events": ["NEW", "CHANGED", "DELETED"]},
    }
    for association in associations.values():
        assert association["BatchImportMetaDataOnCreate"] is True


def test_associations_are_created_one_after_the_other(created):
    _, template = created
    associations = template.find_resources("AWS::FSx::DataRepositoryAssociation")
    by_path = {r["Properties"]["FileSystemPath"]: (logical_id, r) for logical_id, r in associations.items()}
    data_id, _ = by_path["/data"]
    _, checkpoints = by_path["/checkpoints"]
    assert checkpoints["DependsOn"] == [data_id]


def test_existing_buckets_are_imported_not_created():
    storage, template = _storage(
        dataBucketName="team-data",
        checkpointBucketName="team-ckpt",
        fsxEfaEnabled="true",
        fsxStorageGiB="1200",
        fsxThroughputPerTiB="250",
    )
    template.resource_count_is("AWS::S3::Bucket", 1)  # only the access-log bucket
    paths = {
        a["FileSystemPath"]: a["DataRepositoryPath"]
        for a in resources_of(template, "AWS::FSx::DataRepositoryAssociation")
    }
    assert paths == {"/data": "s3://team-data", "/checkpoints": "s3://team-ckpt"}
    # the user's own data bucket is linked import-only too
    associations = resources_of(template, "AWS::FSx::DataRepositoryAssociation")
    (data,) = [a for a in associations if a["FileSystemPath"] == "/data"]
    assert "AutoExportPolicy" not in data["S3"]
    template.has_resource_properties(
        "AWS::FSx::FileSystem",
        {
            "StorageCapacity": 1200,
            "LustreConfiguration": Match.object_like({"EfaEnabled": True, "PerUnitStorageThroughput": 250}),
        },
    )


ADMIN_ROLE = "arn:aws:iam::123456789012:role/checkpoint-admin"
WRITE_ACTIONS = {
    "s3:PutObject", "s3:DeleteObject", "s3:DeleteObjectVersion", "s3:AbortMultipartUpload", "s3:PutObjectAcl",
    "s3:PutObjectVersionAcl", "s3:PutObjectTagging", "s3:PutObjectVersionTagging", "s3:DeleteObjectTagging",
    "s3:DeleteObjectVersionTagging", "s3:PutObjectRetention", "s3:PutObjectLegalHold", "s3:ReplicateObject",
    "s3:ReplicateDelete", "s3:ReplicateTags",
}


def _bucket_policy(storage, template, bucket):
    """The BucketPolicy resource of `bucket`, with its logical id and DeletionPolicy."""
    stack = storage.node.scope
    bucket_ref = {"Ref": stack.get_logical_id(bucket.node.default_child)}
    (policy,) = [p for p in template.find_resources("AWS::S3::BucketPolicy").values()
                 if p["Properties"]["Bucket"] == bucket_ref]
    return policy


def _export_role(storage):
    file_system = storage.node.scope.get_logical_id(storage.file_system)
    return {"Fn::Join": ["", [
        "arn:aws:iam::", {"Ref": "AWS::AccountId"},
        ":role/aws-service-role/s3.data-source.lustre.fsx.amazonaws.com/AWSServiceRoleForFSxS3Access_",
        {"Ref": file_system}]]}


def test_only_the_export_writes_and_deletes_checkpoint_objects_by_default(created):
    storage, template = created
    policy = _bucket_policy(storage, template, storage.checkpoint_bucket)
    assert policy["DeletionPolicy"] == "Retain"  # kept with the retained bucket after `cdk destroy`
    (deny,) = [s for s in policy["Properties"]["PolicyDocument"]["Statement"]
               if s.get("Sid") == "OnlyTheExportAndTheAdminRoleWrite"]
    assert deny["Effect"] == "Deny" and deny["Principal"] == {"AWS": "*"}
    assert set(deny["Action"]) == WRITE_ACTIONS
    bucket = storage.node.scope.get_logical_id(storage.checkpoint_bucket.node.default_child)
    assert deny["Resource"] == {"Fn::Join": ["", [{"Fn::GetAtt": [bucket, "Arn"]}, "/*"]]}  # objects only
    # this file system's own S3 role, by its id: no other file system, and no other principal
    assert deny["Condition"] == {"ArnNotLike": {"aws:PrincipalArn": [_export_role(storage)]}}


def test_the_admin_role_is_the_one_other_writer():
    storage, template = _storage(checkpointAdminRoleArn=ADMIN_ROLE)
    policy = _bucket_policy(storage, template, storage.checkpoint_bucket)
    (deny,) = [s for s in policy["Properties"]["PolicyDocument"]["Statement"]
               if s.get("Sid") == "OnlyTheExportAndTheAdminRoleWrite"]
    assert deny["Condition"] == {"ArnNotLike": {"aws:PrincipalArn": [_export_role(storage), ADMIN_ROLE]}}


CONFIG_ACTIONS = {"s3:PutLifecycleConfiguration", "s3:PutBucketVersioning", "s3:PutReplicationConfiguration",
                  "s3:PutBucketPolicy", "s3:DeleteBucketPolicy", "s3:PutBucketObjectLockConfiguration"}


@pytest.mark.parametrize("admin_role", [None, ADMIN_ROLE])
def test_only_the_deployment_and_the_admin_role_reconfigure_the_checkpoint_bucket(admin_role):
    """Issue 42: a lifecycle rule or suspended versioning could expire every checkpoint version."""
    storage, template = _storage(**({"checkpointAdminRoleArn": admin_role} if admin_role else {}))
    policy = _bucket_policy(storage, template, storage.checkpoint_bucket)
    (deny,) = [s for s in policy["Properties"]["PolicyDocument"]["Statement"]
               if s.get("Sid") == "OnlyTheDeploymentAndTheAdminRoleReconfigure"]
    assert deny["Effect"] == "Deny" and deny["Principal"] == {"AWS": "*"} and set(deny["Action"]) == CONFIG_ACTIONS
    bucket = storage.node.scope.get_logical_id(storage.checkpoint_bucket.node.default_child)
    assert deny["Resource"] == {"Fn::GetAtt": [bucket, "Arn"]}  # the bucket, not its objects
    deployment = {"Fn::Sub": "arn:${AWS::Partition}:iam::${AWS::AccountId}:role/"
                             "cdk-hnb659fds-cfn-exec-role-${AWS::AccountId}-us-east-1"}  # the stack's region
    principals = deny["Condition"]["ArnNotLike"]["aws:PrincipalArn"]
    assert principals == [deployment, *([admin_role] if admin_role else [])]


def test_a_synthesizer_without_an_execution_role_is_refused_with_what_to_do():
    import aws_cdk as cdk
    from cdk_support import feature_flags

    def stack():
        return cdk.Stack(cdk.App(context=feature_flags()), "Test", env=cdk.Environment(region="us-east-1"),
                         synthesizer=cdk.CliCredentialsStackSynthesizer())

    with pytest.raises(ValueError) as refused:
        _storage(stack())
    assert str(refused.value) == (
        "checkpoint bucket policy: synthesizer CliCredentialsStackSynthesizer: allowed: DefaultStackSynthesizer "
        "(app.py's; its qualifier and roles may be changed through its arguments), whose CloudFormation execution "
        "role is the one deployment exempt from the bucket's deny on lifecycle, versioning, replication and policy "
        "changes. With another synthesizer, bring the checkpoint bucket: -c checkpointBucketName=<bucket> (the "
        "stack sets no policy on it; docs/security.md)")
    _, template = _storage(stack(), checkpointBucketName="team-ckpt")  # what it says to do synthesizes
    assert "OnlyTheDeploymentAndTheAdminRoleReconfigure" not in str(template.to_json())


def test_the_data_bucket_stays_writable_for_publishing_data(created):
    storage, template = created
    policy = _bucket_policy(storage, template, storage.data_bucket)
    statements = policy["Properties"]["PolicyDocument"]["Statement"]
    assert [s["Condition"] for s in statements] == [{"Bool": {"aws:SecureTransport": "false"}}]


def test_an_imported_checkpoint_bucket_gets_no_policy_from_the_stack():
    storage, template = _storage(checkpointBucketName="team-ckpt")
    assert "OnlyTheExportAndTheAdminRoleWrite" not in str(template.to_json())
