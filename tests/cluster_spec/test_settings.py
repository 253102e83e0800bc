"""Settings: cdk.json defaults parse, overrides from `-c` strings are typed, and every bad value fails with one
line naming the key, the value and what is allowed."""

import datetime as dt

import pytest
from cdk_support import TEST_NOW, build_settings, default_context

from cluster_spec.context import load_settings
from cluster_spec.settings import CapacityMode
from cluster_spec.values import SettingsError


def test_defaults_from_cdk_json():
    settings = build_settings()
    assert settings.region == "us-east-1"
    assert settings.network.availability_zone == "us-east-1a"
    assert settings.compute.instance_type.name == "p5.48xlarge"
    assert settings.compute.node_count == 2
    assert settings.capacity.mode is CapacityMode.ON_DEMAND
    assert settings.capacity.uses_placement_group and not settings.capacity.creates_reservation
    assert settings.storage.fsx_storage_gib == 4800 and settings.storage.fsx_throughput_mbps_per_tib == 1000
    # 4.8 TiB at 1000 MB/s/TiB: ~4.7 GB/s of Lustre throughput, enough to keep checkpoints short.
    assert settings.storage.fsx_throughput_gbps == pytest.approx(4.6875)
    assert settings.tags == {"project": "p5-training-cluster"}
    assert (settings.bootstrap.timeout_minutes, settings.bootstrap.protected_mode_failures,
            settings.bootstrap.protected_mode_window_minutes) == (20, 3, 60)
    assert settings.bootstrap.timeout_seconds == 1200


def test_health_monitor_and_hang_detection_defaults_and_off():
    health = build_settings().health
    assert (health.check_interval_seconds, health.job_hang_timeout_minutes, health.job_start_timeout_minutes) == (
        60, 30, 60)
    assert health.monitor_enabled
    off = build_settings(healthCheckIntervalSeconds="0", jobHangTimeoutMinutes="0").health
    assert not off.monitor_enabled and off.job_hang_timeout_minutes == 0
    assert health.job_hang_floor_seconds == 120
    # with detection off the floor bounds nothing: any floor in range is accepted
    assert build_settings(jobHangTimeoutMinutes="0", jobHangFloorSeconds="600").health.job_hang_floor_seconds == 600
    # the step cadence's floor with phase records: seconds, under the safety net
    assert health.job_step_hang_floor_seconds == 20
    assert build_settings(jobStepHangFloorSeconds="5").health.job_step_hang_floor_seconds == 5


def test_job_keeper_restarts_default_and_range():
    assert build_settings().job_keeper.max_job_restarts == 5
    assert build_settings(maxJobRestarts="0").job_keeper.max_job_restarts == 0  # never restart
    assert build_settings(maxJobRestarts="100").job_keeper.max_job_restarts == 100


def test_command_line_strings_are_typed():
    settings = build_settings(
        nodeCount="4",
        natGateway="false",
        fsxEfaEnabled="true",
        fsxStorageGiB="2400",
        fsxThroughputPerTiB="500",
        logRetentionDays="90",
        tags="team=ml,cost-center=42",
    )
    assert settings.compute.node_count == 4
    assert settings.network.nat_gateway is False
    assert settings.storage.fsx_efa_enabled is True
    assert settings.storage.fsx_storage_gib == 2400
    assert settings.storage.fsx_throughput_mbps_per_tib == 500
    assert settings.observability.log_retention_days == 90
    assert settings.tags == {"team": "ml", "cost-center": "42"}


def test_observability_defaults_and_overrides():
    defaults = build_settings().observability
    assert defaults.metrics_interval_seconds == 60 and defaults.idle_gpu_utilization_percent == 10
    assert defaults.idle_gpu_alarm and defaults.straggler_alarm and defaults.efa_error_alarm
    assert defaults.straggler_margin_percent == 30 and defaults.budget_usd is None
    custom = build_settings(metricsIntervalSeconds="30", idleGpuAlarm="false", budgetUsd="12500.50",
                            stragglerMarginPercent="15").observability
    assert custom.metrics_interval_seconds == 30 and custom.idle_gpu_alarm is False
    assert custom.budget_usd == 12500.5 and custom.straggler_margin_percent == 15


def test_tags_as_json_from_command_line():
    assert build_settings(tags='{"team": "ml"}').tags == {"team": "ml"}


def test_odcr_without_id_creates_a_reservation_in_the_placement_group():
    capacity = build_settings(capacityMode="odcr", reservationEndDate="2027-01-01T00:00:00Z").capacity
    assert capacity.creates_reservation and capacity.uses_placement_group
    assert capacity.reservation_end == dt.datetime(2027, 1, 1, tzinfo=dt.UTC)


def test_existing_reservation_has_no_placement_group():
    capacity = build_settings(capacityMode="odcr", capacityReservationId="cr-0123456789abcdef0").capacity
    assert not capacity.creates_reservation and not capacity.uses_placement_group


def test_capacity_block_start_in_the_past_means_nothing_to_schedule():
    capacity = build_settings(
        capacityMode="capacity-block",
        capacityReservationId="cr-0123456789abcdef0",
        reservationStartDate="2026-11-01T00:00:00Z",
        reservationEndDate="2026-11-28T00:00:00Z",
    ).capacity
    assert capacity.reservation_start is None
    assert capacity.reservation_end == dt.datetime(2026, 11, 28, tzinfo=dt.UTC)


BAD_SETTINGS = [
    (
        {"instanceType": "p5.large"},
        "instanceType='p5.large': allowed: p4d.24xlarge, p4de.24xlarge, p5.48xlarge, "
        "p5e.48xlarge, p5en.48xlarge, p6-b200.48xlarge",
    ),
    ({"nodeCount": "0"}, "nodeCount=0: must be an integer >= 1 and <= 256"),
    ({"nodeCount": "two"}, "nodeCount='two': must be an integer"),
    (
        {
            "nodeCount": "8",
            "capacityMode": "odcr",
            "capacityReservationId": "cr-0123456789abcdef0",
            "reservationInstanceCount": "4",
        },
        "nodeCount=8: must be <= reservationInstanceCount=4",
    ),
    (
        {
            "nodeCount": "4",
            "spareNodes": "1",
            "capacityMode": "capacity-block",
            "capacityReservationId": "cr-0123456789abcdef0",
            "reservationInstanceCount": "4",
            "reservationEndDate": "2099-01-01T00:00:00Z",
        },
        "spareNodes=1: nodeCount + spareNodes (4 + 1) must be <= reservationInstanceCount=4, the instances the "
        "reservation holds",
    ),
    (
        {"nodeCount": "4", "spareNodes": "1", "capacityMode": "odcr", "reservationInstanceCount": "4",
         "reservationEndDate": "2099-01-01T00:00:00Z"},
        "reservationInstanceCount=4: the created reservation holds nodeCount + spareNodes = 5 instances",
    ),
    ({"spareNodes": "-1"}, "spareNodes=-1: must be an integer >= 0 and <= 64"),
    ({"nodeCount": "250", "spareNodes": "8"}, "spareNodes=8: nodeCount + spareNodes must be <= 256 (nodeCount=250)"),
    (
        {"capacityMode": "capacity-block"},
        "capacityMode='capacity-block' needs capacityReservationId (cr-...)",
    ),
    ({"capacityMode": "spot"}, "capacityMode='spot': allowed: on-demand, odcr, capacity-block"),
    (
        {"capacityMode": "odcr", "capacityReservationId": "cr-12345"},
        "capacityReservationId='cr-12345': must look like cr-0123456789abcdef0",
    ),
    (
        {"capacityReservationId": "cr-0123456789abcdef0"},
        "capacityReservationId='cr-0123456789abcdef0': only applies with capacityMode=odcr or capacity-block",
    ),
    ({"fsxStorageGiB": "2000"}, "fsxStorageGiB=2000: must be 1200 or a multiple of 2400 (PERSISTENT_2)"),
    ({"fsxStorageGiB": "600"}, "fsxStorageGiB=600: must be 1200 or a multiple of 2400 (PERSISTENT_2)"),
    ({"fsxThroughputPerTiB": "200"}, "fsxThroughputPerTiB=200: allowed: 125, 250, 500, 1000"),
    ({"availabilityZone": "us-west-2a"}, "availabilityZone='us-west-2a': must be a zone of region us-east-1"),
    ({"region": "mars-1"}, "region='mars-1': must be an AWS region code such as us-east-1"),
    ({"natGateway": "maybe"}, "natGateway='maybe': allowed: true, false"),
    (
        {"capacityMode": "odcr", "reservationEndDate": "next week"},
        "reservationEndDate='next week': must be an ISO 8601 time",
    ),
    (
        {"capacityMode": "odcr", "reservationEndDate": "2027-01-01T00:00:00"},
        "reservationEndDate='2027-01-01T00:00:00': must carry a time zone",
    ),
    (
        {"capacityMode": "odcr", "reservationEndDate": "2026-01-01T00:00:00Z"},
        "reservationEndDate='2026-01-01T00:00:00+00:00': must be in the future",
    ),
    (
        {
            "capacityMode": "capacity-block",
            "capacityReservationId": "cr-0123456789abcdef0",
            "reservationEndDate": "2026-11-20T12:30:00Z",
        },
        "the block ends in less than 40 minutes",
    ),
    (
        {"capacityMode": "odcr", "reservationStartDate": "2027-01-01T00:00:00Z"},
        "reservationStartDate='2027-01-01T00:00:00+00:00': only applies with capacityMode=capacity-block",
    ),
    ({"dataBucketName": "Bad_Bucket"}, "dataBucketName='Bad_Bucket': must be an S3 bucket name"),
    ({"alarmEmail": "not-an-email"}, "alarmEmail='not-an-email': must be an email address"),
    ({"vpcCidr": "8.8.0.0/16"}, "vpcCidr='8.8.0.0/16': must be a private IPv4 block from /16 to /20"),
    ({"scratchMountPoint": "scratch"}, "scratchMountPoint='scratch': must be an absolute directory path"),
    (
        {"amiParameter": "ami-0123456789abcdef0"},
        "amiParameter='ami-0123456789abcdef0': must be an SSM parameter",
    ),
    ({"logRetentionDays": "10"}, "logRetentionDays=10: allowed: 1, 3, 5, 7, 14, 30"),
    ({"tags": "team"}, "tags='team': must be a JSON object or k=v,k2=v2"),
    ({"metricsIntervalSeconds": "45"}, "metricsIntervalSeconds=45: allowed: 10, 30, 60, 120, 300"),
    ({"idleGpuUtilizationPercent": "0"}, "idleGpuUtilizationPercent=0: must be an integer >= 1 and <= 99"),
    ({"idleGpuAlarm": "sometimes"}, "idleGpuAlarm='sometimes': allowed: true, false"),
    ({"stragglerMarginPercent": "100"}, "stragglerMarginPercent=100: must be an integer >= 1 and <= 99"),
    ({"efaErrorAlarm": "1x"}, "efaErrorAlarm='1x': allowed: true, false"),
    ({"budgetUsd": "-5"}, "budgetUsd='-5': must be an amount in USD > 0, or empty for none"),
    ({"budgetUsd": "lots"}, "budgetUsd='lots': must be an amount in USD > 0, or empty for none"),
    ({"budgetUsd": "nan"}, "budgetUsd='nan': must be an amount in USD > 0, or empty for none"),
    (
        {"healthCheckIntervalSeconds": "5"},
        "healthCheckIntervalSeconds=5: allowed: 0 (the monitor is off) or 10 to 3600",
    ),
    ({"healthCheckIntervalSeconds": "-1"}, "healthCheckIntervalSeconds=-1: must be an integer >= 0 and <= 3600"),
    ({"jobHangTimeoutMinutes": "2000"}, "jobHangTimeoutMinutes=2000: must be an integer >= 0 and <= 1440"),
    (
        {"jobHangTimeoutMinutes": "45", "jobStartTimeoutMinutes": "30"},
        "jobStartTimeoutMinutes=30: must be >= jobHangTimeoutMinutes=45",
    ),
    ({"jobHangFloorSeconds": "5"}, "jobHangFloorSeconds=5: must be an integer >= 10 and <= 86400"),
    (
        {"jobHangTimeoutMinutes": "1", "jobHangFloorSeconds": "120"},
        "jobHangFloorSeconds=120: must be <= jobHangTimeoutMinutes=1 (60 s)",
    ),
    ({"jobStepHangFloorSeconds": "0"}, "jobStepHangFloorSeconds=0: must be an integer >= 1 and <= 86400"),
    (
        {"jobHangFloorSeconds": "60", "jobStepHangFloorSeconds": "90"},
        "jobStepHangFloorSeconds=90: must be <= jobHangFloorSeconds=60",
    ),
    ({"maxJobRestarts": "101"}, "maxJobRestarts=101: must be an integer >= 0 and <= 100"),
    ({"maxJobRestarts": "-1"}, "maxJobRestarts=-1: must be an integer >= 0 and <= 100"),
    ({"maxJobRestarts": "five"}, "maxJobRestarts='five': must be an integer"),
    ({"maxJobRestarts": True}, "maxJobRestarts=True: must be an integer"),
    (
        {"tags": {"aws:reserved": "x"}},
        "tags key='aws:reserved': must not start with aws: or cluster: (reserved)",
    ),
    ({"tags": {"AWS:Reserved": "x"}}, "tags key='AWS:Reserved': must not start with aws:"),
    ({"tags": "cluster:bootstrap=ready"}, "tags key='cluster:bootstrap': must not start with aws: or cluster:"),
    (
        {"tags": {"team": "ml;rm -rf"}},
        "tags.team='ml;rm -rf': 0-256 characters: letters, digits, spaces and _ . : / = + - @",
    ),
    ({"tags": {"team": "x" * 257}}, "0-256 characters"),
    ({"tags": {"t" * 129: "x"}}, "1-128 characters: letters, digits, spaces and _ . : / = + - @"),
    ({"tags": {"owner": "a,b"}}, "tags.owner='a,b': 0-256 characters"),
    ({"tags": {f"k{i}": "v" for i in range(48)}}, "tags='48 tags': at most 47 tags"),
    (
        {"availabilityZone": "us-east-1z"},
        "availabilityZone='us-east-1z': must be a zone of region us-east-1: us-east-1 and one letter a-f",
    ),
    ({"availabilityZone": "us-east-1"}, "availabilityZone='us-east-1': must be a zone of region us-east-1"),
    (
        {"fsxStorageGiB": "2400000"},
        "fsxStorageGiB=2400000: must be at most 100800, the default FSx for Lustre PERSISTENT_2 storage quota",
    ),
    (
        {"capacityMode": "capacity-block", "capacityReservationId": "cr-0123456789abcdef0"},
        "capacityMode='capacity-block' needs reservationEndDate (the block's end",
    ),
    (
        {"instanceType": "p4d.24xlarge", "fsxEfaEnabled": "true"},
        "fsxEfaEnabled=True: FSx for Lustre supports EFA clients on Nitro v4+ instance types (p5.48xlarge, "
        "p5e.48xlarge, p5en.48xlarge, p6-b200.48xlarge), not p4d.24xlarge",
    ),
    ({"instanceType": "p4de.24xlarge", "fsxEfaEnabled": "true"}, "not p4de.24xlarge"),
    ({"dataVersionRetentionDays": "0"}, "dataVersionRetentionDays=0: must be an integer >= 1"),
    ({"bootstrapTimeoutMinutes": "2"}, "bootstrapTimeoutMinutes=2: must be an integer >= 5 and <= 120"),
    ({"protectedModeFailures": "0"}, "protectedModeFailures=0: must be an integer >= 1 and <= 100"),
    (
        {"bootstrapTimeoutMinutes": "45", "protectedModeWindowMinutes": "30"},
        "protectedModeWindowMinutes=30: must be >= bootstrapTimeoutMinutes=45",
    ),
]


def test_every_letter_zone_a_to_f_is_accepted():
    for letter in "abcdef":
        assert build_settings(availabilityZone=f"us-east-1{letter}").network.availability_zone.endswith(letter)


def test_tags_with_allowed_characters_and_the_limits_pass():
    allowed = {"cost-center": "42", "team/owner": "ml platform_1+a=b@c.d:e", "empty": "", "é": "ü" * 256}
    assert build_settings(tags=allowed).tags == allowed
    assert len(build_settings(tags={f"k{i}": "v" for i in range(47)}).tags) == 47


def test_largest_storage_is_accepted():
    assert build_settings(fsxStorageGiB="100800").storage.fsx_storage_gib == 100800


@pytest.mark.parametrize(("overrides", "message"), BAD_SETTINGS, ids=[str(o) for o, _ in BAD_SETTINGS])
def test_bad_setting_fails_with_key_value_and_allowed(overrides, message):
    with pytest.raises(SettingsError) as raised:
        build_settings(**overrides)
    text = str(raised.value)
    assert message in text
    assert "\n" not in text  # one line


def test_unknown_key_is_a_typo_with_a_hint():
    context = {**default_context(), "nodecount": "3"}
    with pytest.raises(SettingsError, match="unknown setting 'nodecount': did you mean nodeCount?"):
        load_settings(context.get, all_keys=context, now=TEST_NOW)


def test_cdk_feature_flags_are_not_settings():
    context = {**default_context(), "@aws-cdk/core:someNewFlag": True, "aws:cdk:enable-path-metadata": True}
    load_settings(context.get, all_keys=context, now=TEST_NOW)  # does not raise


def test_settings_are_frozen():
    settings = build_settings()
    with pytest.raises(AttributeError):
        settings.compute.node_count = 3  # type: ignore[misc]


def test_every_setting_is_in_cdk_json_and_the_settings_table():
    from cdk_support import REPO_ROOT

    from cluster_spec.context import SETTING_KEYS

    context_keys = {k for k in default_context() if not k.startswith("@")}
    assert context_keys == set(SETTING_KEYS)
    table = (REPO_ROOT / "docs" / "settings.md").read_text()  # the README points there
    assert [k for k in SETTING_KEYS if f"| `{k}` |" not in table] == []
