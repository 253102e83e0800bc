"""checkpointAdminRoleArn: the one role besides the FSx export that may write the checkpoint bucket."""

import pytest
from cdk_support import build_settings

from cluster_spec.values import SettingsError

ADMIN = "arn:aws:iam::123456789012:role/checkpoint-admin"


def test_empty_by_default_so_only_the_export_writes():
    assert build_settings().storage.checkpoint_admin_role_arn is None
    assert build_settings(checkpointAdminRoleArn=" ").storage.checkpoint_admin_role_arn is None


@pytest.mark.parametrize("arn", [
    ADMIN,
    "arn:aws:iam::123456789012:role/team/ml-platform/checkpoint-admin",
    # an IAM Identity Center permission set's role: a fixed path, a generated suffix
    "arn:aws:iam::123456789012:role/aws-reserved/sso.amazonaws.com/AWSReservedSSO_CheckpointAdmin_*",
    "arn:aws-us-gov:iam::123456789012:role/admin",
    "arn:aws-cn:iam::123456789012:role/a+b=c,d.e@f_g-h",
])
def test_role_arns_are_accepted(arn):
    assert build_settings(checkpointAdminRoleArn=arn).storage.checkpoint_admin_role_arn == arn


@pytest.mark.parametrize("arn", [
    "arn:aws:iam::123456789012:role/*",  # every role of the account
    "arn:aws:iam::123456789012:role/*admin",
    "arn:aws:iam::123456789012:role/team/*/admin",  # wildcards only in the name
    "arn:aws:iam::123456789012:user/admin",
    "arn:aws:sts::123456789012:assumed-role/admin/session",  # aws:PrincipalArn is the role's ARN, not a session's
    "arn:aws:iam::12345678901:role/admin",
    "arn:aws:iam::*:role/admin",
    "checkpoint-admin",
    "arn:aws:iam::123456789012:role/admín",
])
def test_anything_but_a_role_arn_is_refused_in_one_line(arn):
    with pytest.raises(SettingsError) as error:
        build_settings(checkpointAdminRoleArn=arn)
    message = str(error.value)
    assert message.startswith(f"checkpointAdminRoleArn={arn!r}: must be an IAM role ARN such as ")
    assert "\n" not in message


def test_an_imported_checkpoint_bucket_takes_no_admin_role():
    with pytest.raises(SettingsError, match=(
        r"^checkpointAdminRoleArn='arn:aws:iam::123456789012:role/checkpoint-admin': applies only to the "
        r"checkpoint bucket the stack creates: an imported checkpointBucketName's policy is its owner's")):
        build_settings(checkpointAdminRoleArn=ADMIN, checkpointBucketName="team-checkpoints")
