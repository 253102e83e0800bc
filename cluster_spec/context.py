"""Settings from CDK context: the one place context is read, validated into the frozen dataclasses of
cluster_spec.settings.

Configuration flows one way: cdk.json context (defaults) -> `-c key=value` overrides -> load_settings here ->
the stack hands each construct only the settings it needs. Values from `-c` arrive as strings; values from
cdk.json arrive typed. Every parser here accepts both. Every invalid value raises SettingsError with one line
naming the key, the value and what is allowed, e.g. ``capacityMode='capacity-block' needs
capacityReservationId (cr-...)``."""

from __future__ import annotations

import datetime as dt
import ipaddress
import re
from collections.abc import Callable, Mapping
from typing import Any

from cluster_spec.settings import (
    CAPACITY_BLOCK_SCALE_IN_LEAD,
    FSX_MAX_STORAGE_GIB,
    FSX_THROUGHPUTS_MBPS_PER_TIB,
    LOG_RETENTION_DAYS,
    MAX_JOB_RESTARTS,
    MAX_NODE_COUNT,
    MAX_SPARE_NODES,
    METRICS_INTERVALS_SECONDS,
    MIN_HEALTH_CHECK_INTERVAL_SECONDS,
    BootstrapSettings,
    CapacityMode,
    CapacitySettings,
    ClusterSettings,
    ComputeSettings,
    HealthSettings,
    JobKeeperSettings,
    NetworkSettings,
    ObservabilitySettings,
    StorageSettings,
)
from cluster_spec.values import (
    SettingsError,
    boolean,
    bucket,
    choice,
    email,
    int_or_raw,
    integer,
    invalid,
    mount_point,
    role_arn,
    string,
    tags,
    timestamp,
    usd,
)
from instance_catalog.instance_types import INSTANCE_TYPES

# The setting keys users may pass. Anything else in the context that does not look like a CDK flag is a typo.
SETTING_KEYS = (
    "region",
    "availabilityZone",
    "vpcCidr",
    "natGateway",
    "instanceType",
    "nodeCount",
    "spareNodes",
    "capacityMode",
    "capacityReservationId",
    "reservationInstanceCount",
    "reservationStartDate",
    "reservationEndDate",
    "amiParameter",
    "rootVolumeGiB",
    "scratchMountPoint",
    "fsxStorageGiB",
    "fsxThroughputPerTiB",
    "fsxEfaEnabled",
    "fsxMountPoint",
    "dataBucketName",
    "checkpointBucketName",
    "checkpointVersionRetentionDays",
    "dataVersionRetentionDays",
    "checkpointAdminRoleArn",
    "logRetentionDays",
    "alarmEmail",
    "metricsIntervalSeconds",
    "idleGpuAlarm",
    "idleGpuUtilizationPercent",
    "stragglerAlarm",
    "stragglerMarginPercent",
    "efaErrorAlarm",
    "budgetUsd",
    "bootstrapTimeoutMinutes",
    "protectedModeFailures",
    "protectedModeWindowMinutes",
    "healthCheckIntervalSeconds",
    "jobHangTimeoutMinutes",
    "jobHangFloorSeconds",
    "jobStepHangFloorSeconds",
    "jobStartTimeoutMinutes",
    "maxJobRestarts",
    "tags",
)


# Availability Zone names are the Region code and one letter; us-east-1 has the most zones, a to f (Regions and
# Zones, "Availability Zones"). Local and Wavelength Zones (us-east-1-bos-1a) have no P instances.
_AZ_LETTERS = "abcdef"


_RESERVATION_ID = re.compile(r"^cr-[0-9a-f]{8}([0-9a-f]{9})?$")


_REGION = re.compile(r"^[a-z]{2}(-gov)?-[a-z]+-\d$")


_SSM_PARAMETER = re.compile(r"^/[A-Za-z0-9_./-]+$")


def load_settings(
    context: Callable[[str], Any],
    *,
    all_keys: Mapping[str, Any] | None = None,
    now: dt.datetime | None = None,
) -> ClusterSettings:
    """Build and validate the settings from CDK context.

    `context(key)` returns the value of one context key (None when unset); `all_keys` is the whole context,
    used to reject unknown (misspelt) keys; `now` is the clock used for reservation dates (tests pin it).
    """
    if all_keys is not None:
        _reject_unknown_keys(all_keys)
    now = now or dt.datetime.now(dt.UTC)

    region = string("region", context("region"))
    if not _REGION.fullmatch(region):
        raise invalid("region", region, "must be an AWS region code such as us-east-1")

    network = _network_settings(context, region)
    compute = _compute_settings(context)
    capacity = _capacity_settings(context, compute, now)
    storage = _storage_settings(context)
    observability = ObservabilitySettings(
        log_retention_days=choice(
            "logRetentionDays", int_or_raw(context("logRetentionDays")), LOG_RETENTION_DAYS
        ),
        alarm_email=email(context("alarmEmail")),
        metrics_interval_seconds=choice(
            "metricsIntervalSeconds", int_or_raw(context("metricsIntervalSeconds")), METRICS_INTERVALS_SECONDS
        ),
        idle_gpu_alarm=boolean("idleGpuAlarm", context("idleGpuAlarm")),
        idle_gpu_utilization_percent=integer(
            "idleGpuUtilizationPercent", context("idleGpuUtilizationPercent"), minimum=1, maximum=99
        ),
        straggler_alarm=boolean("stragglerAlarm", context("stragglerAlarm")),
        straggler_margin_percent=integer(
            "stragglerMarginPercent", context("stragglerMarginPercent"), minimum=1, maximum=99
        ),
        efa_error_alarm=boolean("efaErrorAlarm", context("efaErrorAlarm")),
        budget_usd=usd("budgetUsd", context("budgetUsd")),
    )
    if storage.fsx_efa_enabled and not compute.instance_type.fsx_efa_client:
        clients = ", ".join(sorted(t.name for t in INSTANCE_TYPES.values() if t.fsx_efa_client))
        raise invalid(
            "fsxEfaEnabled",
            True,
            f"FSx for Lustre supports EFA clients on Nitro v4+ instance types ({clients}), "
            f"not {compute.instance_type.name}",
        )
    return ClusterSettings(
        region=region,
        network=network,
        capacity=capacity,
        compute=compute,
        storage=storage,
        observability=observability,
        tags=tags("tags", context("tags")),
        bootstrap=_bootstrap_settings(context),
        health=_health_settings(context),
        job_keeper=JobKeeperSettings(
            max_job_restarts=integer(
                "maxJobRestarts", context("maxJobRestarts"), minimum=0, maximum=MAX_JOB_RESTARTS
            )
        ),
    )


def _reject_unknown_keys(all_keys: Mapping[str, Any]) -> None:
    for key in all_keys:
        # CDK's own flags and internal keys: "@aws-cdk/...", "aws:cdk:...", "cdk-..." and the like.
        if key.startswith(("@", "aws:", "aws-cdk:", "cdk")) or ":" in key:
            continue
        if key not in SETTING_KEYS:
            close = [k for k in SETTING_KEYS if k.lower() == key.lower()]
            hint = f"did you mean {close[0]}?" if close else "allowed keys: " + ", ".join(SETTING_KEYS)
            raise SettingsError(f"unknown setting {key!r}: {hint}")


def _network_settings(context: Callable[[str], Any], region: str) -> NetworkSettings:
    az = string("availabilityZone", context("availabilityZone"))
    if not re.fullmatch(re.escape(region) + f"[{_AZ_LETTERS}]", az):
        raise invalid(
            "availabilityZone",
            az,
            f"must be a zone of region {region}: {region} and one letter a-f, e.g. {region}a",
        )
    cidr = string("vpcCidr", context("vpcCidr"))
    try:
        network = ipaddress.IPv4Network(cidr)
    except ValueError:
        raise invalid("vpcCidr", cidr, "must be an IPv4 CIDR block such as 10.0.0.0/16") from None
    if not 16 <= network.prefixlen <= 20 or not network.is_private:
        raise invalid("vpcCidr", cidr, "must be a private IPv4 block from /16 to /20")
    return NetworkSettings(
        availability_zone=az, vpc_cidr=cidr, nat_gateway=boolean("natGateway", context("natGateway"))
    )


def _compute_settings(context: Callable[[str], Any]) -> ComputeSettings:
    name = string("instanceType", context("instanceType"))
    if name not in INSTANCE_TYPES:
        raise invalid("instanceType", name, "allowed: " + ", ".join(sorted(INSTANCE_TYPES)))
    ami_parameter = string("amiParameter", context("amiParameter"))
    if not _SSM_PARAMETER.fullmatch(ami_parameter):
        raise invalid(
            "amiParameter",
            ami_parameter,
            "must be an SSM parameter name such as /aws/service/deeplearning/ami/x86_64/.../latest/ami-id",
        )
    node_count = integer("nodeCount", context("nodeCount"), minimum=1, maximum=MAX_NODE_COUNT)
    spare_nodes = integer("spareNodes", context("spareNodes"), minimum=0, maximum=MAX_SPARE_NODES)
    if node_count + spare_nodes > MAX_NODE_COUNT:
        raise invalid("spareNodes", spare_nodes,
                      f"nodeCount + spareNodes must be <= {MAX_NODE_COUNT} (nodeCount={node_count})")
    return ComputeSettings(
        instance_type=INSTANCE_TYPES[name],
        node_count=node_count,
        spare_nodes=spare_nodes,
        ami_parameter=ami_parameter,
        root_volume_gib=integer("rootVolumeGiB", context("rootVolumeGiB"), minimum=100, maximum=16384),
        scratch_mount_point=mount_point("scratchMountPoint", context("scratchMountPoint")),
    )


def _capacity_settings(
    context: Callable[[str], Any], compute: ComputeSettings, now: dt.datetime
) -> CapacitySettings:
    mode = CapacityMode(choice("capacityMode", context("capacityMode"), tuple(m.value for m in CapacityMode)))
    reservation_id = string("capacityReservationId", context("capacityReservationId"), optional=True)
    if reservation_id is not None and not _RESERVATION_ID.fullmatch(reservation_id):
        raise invalid("capacityReservationId", reservation_id, "must look like cr-0123456789abcdef0")
    raw_count = context("reservationInstanceCount")
    count = None if raw_count in (None, "") else integer("reservationInstanceCount", raw_count, minimum=1)
    start = timestamp("reservationStartDate", context("reservationStartDate"))
    end = timestamp("reservationEndDate", context("reservationEndDate"))

    if mode is CapacityMode.CAPACITY_BLOCK and reservation_id is None:
        raise SettingsError(
            "capacityMode='capacity-block' needs capacityReservationId (cr-...): buy a block with "
            "`clusterctl capacity purchase` and pass the id it prints"
        )
    if mode is CapacityMode.ON_DEMAND:
        for key, value in (
            ("capacityReservationId", reservation_id),
            ("reservationInstanceCount", count),
            ("reservationStartDate", start),
            ("reservationEndDate", end),
        ):
            if value is not None:
                raise invalid(
                    key,
                    value if not isinstance(value, dt.datetime) else value.isoformat(),
                    "only applies with capacityMode=odcr or capacity-block",
                )
    if (
        mode is CapacityMode.ODCR
        and reservation_id is None
        and count is not None
        and count != compute.group_size
    ):
        raise invalid(
            "reservationInstanceCount",
            count,
            f"the created reservation holds nodeCount + spareNodes = {compute.group_size} instances; leave it "
            "unset",
        )
    if count is not None and compute.group_size > count:
        key, value = ("spareNodes", compute.spare_nodes) if compute.node_count <= count else (
            "nodeCount", compute.node_count)
        what = f"nodeCount + spareNodes ({compute.node_count} + {compute.spare_nodes}) " if compute.spare_nodes else ""
        raise invalid(key, value, f"{what}must be <= reservationInstanceCount={count}, the instances the reservation "
                                  "holds")
    if start is not None and mode is not CapacityMode.CAPACITY_BLOCK:
        raise invalid(
            "reservationStartDate", start.isoformat(), "only applies with capacityMode=capacity-block"
        )
    if end is not None and end <= now:
        raise invalid("reservationEndDate", end.isoformat(), "must be in the future")
    if mode is CapacityMode.CAPACITY_BLOCK and end is None:
        # Without the end there is no scale-in, and EC2 reclaims the nodes at the block's end with no SIGTERM
        # lead for the trainer to checkpoint.
        raise SettingsError(
            "capacityMode='capacity-block' needs reservationEndDate (the block's end, as "
            "`clusterctl capacity list` prints it): nodes are scaled in 40 minutes before it so the trainer "
            "checkpoints"
        )
    if mode is CapacityMode.CAPACITY_BLOCK and end - CAPACITY_BLOCK_SCALE_IN_LEAD <= now:
        raise invalid(
            "reservationEndDate",
            end.isoformat(),
            "the block ends in less than 40 minutes: nodes are "
            "scaled in 40 minutes before the end, deploy against a later block",
        )
    if start is not None and start <= now:
        start = None  # the block has started: the nodes launch now, there is nothing to schedule
    if start is not None and end is not None and end <= start:
        raise invalid("reservationEndDate", end.isoformat(), "must be after reservationStartDate")
    return CapacitySettings(
        mode=mode,
        reservation_id=reservation_id,
        reservation_instance_count=count,
        reservation_start=start,
        reservation_end=end,
    )


def _bootstrap_settings(context: Callable[[str], Any]) -> BootstrapSettings:
    timeout = integer("bootstrapTimeoutMinutes", context("bootstrapTimeoutMinutes"), minimum=5, maximum=120)
    window = integer("protectedModeWindowMinutes", context("protectedModeWindowMinutes"), minimum=5, maximum=1440)
    if window < timeout:
        raise invalid(
            "protectedModeWindowMinutes",
            window,
            f"must be >= bootstrapTimeoutMinutes={timeout}: a window shorter than one boot never sees a streak",
        )
    return BootstrapSettings(
        timeout_minutes=timeout,
        protected_mode_failures=integer(
            "protectedModeFailures", context("protectedModeFailures"), minimum=1, maximum=100
        ),
        protected_mode_window_minutes=window,
    )


def _health_settings(context: Callable[[str], Any]) -> HealthSettings:
    interval = integer("healthCheckIntervalSeconds", context("healthCheckIntervalSeconds"), minimum=0, maximum=3600)
    if 0 < interval < MIN_HEALTH_CHECK_INTERVAL_SECONDS:
        raise invalid("healthCheckIntervalSeconds", interval,
                      f"allowed: 0 (the monitor is off) or {MIN_HEALTH_CHECK_INTERVAL_SECONDS} to 3600")
    hang = integer("jobHangTimeoutMinutes", context("jobHangTimeoutMinutes"), minimum=0, maximum=1440)
    start = integer("jobStartTimeoutMinutes", context("jobStartTimeoutMinutes"), minimum=1, maximum=1440)
    if start < hang:
        raise invalid("jobStartTimeoutMinutes", start,
                      f"must be >= jobHangTimeoutMinutes={hang}: the first step (compile, checkpoint load) is the "
                      "slowest")
    floor = integer("jobHangFloorSeconds", context("jobHangFloorSeconds"), minimum=10, maximum=86400)
    if hang and floor > hang * 60:
        raise invalid("jobHangFloorSeconds", floor,
                      f"must be <= jobHangTimeoutMinutes={hang} ({hang * 60} s): the floor of a hang timeout "
                      "learned from the step cadence, whose upper bound that is")
    step_floor = integer("jobStepHangFloorSeconds", context("jobStepHangFloorSeconds"), minimum=1, maximum=86400)
    if step_floor > floor:  # jobHangFloorSeconds: the safety net above it (node_bootstrap/jobs/progress.py)
        raise invalid("jobStepHangFloorSeconds", step_floor, f"must be <= jobHangFloorSeconds={floor}")
    return HealthSettings(check_interval_seconds=interval, job_hang_timeout_minutes=hang, job_start_timeout_minutes=
                          start, job_hang_floor_seconds=floor, job_step_hang_floor_seconds=step_floor)


def _storage_settings(context: Callable[[str], Any]) -> StorageSettings:
    storage_gib = integer("fsxStorageGiB", context("fsxStorageGiB"), minimum=1)
    if storage_gib > FSX_MAX_STORAGE_GIB:
        raise invalid(
            "fsxStorageGiB",
            storage_gib,
            f"must be at most {FSX_MAX_STORAGE_GIB}, the default FSx for Lustre PERSISTENT_2 storage quota "
            "per account and Region",
        )
    # PERSISTENT_2 file systems come in 1.2 TiB or increments of 2.4 TiB (FSx for Lustre API,
    # CreateFileSystem StorageCapacity).
    if storage_gib != 1200 and storage_gib % 2400 != 0:
        raise invalid("fsxStorageGiB", storage_gib, "must be 1200 or a multiple of 2400 (PERSISTENT_2)")
    admin_role = role_arn("checkpointAdminRoleArn", context("checkpointAdminRoleArn"))
    if admin_role and bucket("checkpointBucketName", context("checkpointBucketName")):
        raise invalid("checkpointAdminRoleArn", admin_role, "applies only to the checkpoint bucket the stack creates: "
                      "an imported checkpointBucketName's policy is its owner's (docs/security.md)")
    return StorageSettings(
        fsx_storage_gib=storage_gib,
        fsx_throughput_mbps_per_tib=choice(
            "fsxThroughputPerTiB", int_or_raw(context("fsxThroughputPerTiB")), FSX_THROUGHPUTS_MBPS_PER_TIB
        ),
        fsx_efa_enabled=boolean("fsxEfaEnabled", context("fsxEfaEnabled")),
        fsx_mount_point=mount_point("fsxMountPoint", context("fsxMountPoint")),
        data_bucket_name=bucket("dataBucketName", context("dataBucketName")),
        checkpoint_bucket_name=bucket("checkpointBucketName", context("checkpointBucketName")),
        checkpoint_version_retention_days=integer(
            "checkpointVersionRetentionDays", context("checkpointVersionRetentionDays"), minimum=1
        ),
        data_version_retention_days=integer(
            "dataVersionRetentionDays", context("dataVersionRetentionDays"), minimum=1
        ),
        checkpoint_admin_role_arn=admin_role,
    )
