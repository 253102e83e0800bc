"""The cluster's typed settings: one frozen dataclass per concern, and the values each may take.

cluster_spec.context builds them from CDK context and validates them; the stack hands each construct only its
own section (NetworkSettings to ClusterNetwork, StorageSettings to ClusterStorage, ...). Nothing here reads
context or calls AWS."""

from __future__ import annotations

import datetime as dt
import enum
from collections.abc import Mapping
from dataclasses import dataclass

from instance_catalog.instance_types import InstanceType


class CapacityMode(enum.Enum):
    ON_DEMAND = "on-demand"  # plain On-Demand instances in a cluster placement group
    ODCR = "odcr"  # an On-Demand Capacity Reservation: created by the stack, or an existing one
    CAPACITY_BLOCK = "capacity-block"  # a purchased Capacity Block for ML (bought with clusterctl, not CFN)


FSX_THROUGHPUTS_MBPS_PER_TIB = (125, 250, 500, 1000)

# The most nodes one cluster holds (nodeCount + spareNodes): synthesis refuses more, and `clusterctl plan` never
# proposes more.
MAX_NODE_COUNT = 256
# The most hot spares (spareNodes) a group holds beside the job's nodes: synthesis refuses more, and so does
# `clusterctl cost --spare-nodes`.
MAX_SPARE_NODES = 64


# How often the nodes sample GPU, EFA, CPU, memory and disk metrics. Below 60 s the CloudWatch agent publishes
# high-resolution custom metrics, which cost more (CloudWatch pricing); above 300 s the 30-minute idle alarm
# would judge on too few samples.
METRICS_INTERVALS_SECONDS = (10, 30, 60, 120, 300)


# FSx for Lustre's default PERSISTENT_2 storage quota per account and Region is 100,800 GiB, shared by all its
# file systems (FSx for Lustre User Guide, "Service quotas"), and SageMaker HyperPod's FSxLustreConfig caps
# SizeInGiB at the same figure. A larger value fails late, at deploy, after the network is built: raise the quota
# with AWS Support first, then this constant.
FSX_MAX_STORAGE_GIB = 100_800


# CloudWatch Logs accepts exactly these retention periods.
LOG_RETENTION_DAYS = (1, 3, 5, 7, 14, 30, 60, 90, 120, 150, 180, 365, 400, 545, 731, 1096, 1827, 3653)


# Capacity Block instances are terminated when the block ends; the nodes are scaled in this long before, so the
# trainer gets its SIGTERM and checkpoints (EC2 Auto Scaling guide: scale to zero more than 30 minutes before).
CAPACITY_BLOCK_SCALE_IN_LEAD = dt.timedelta(minutes=40)


@dataclass(frozen=True)
class NetworkSettings:
    availability_zone: str  # the one AZ of the cluster (a Capacity Block's AZ in that mode)
    vpc_cidr: str
    nat_gateway: bool  # internet egress for the nodes; AWS APIs are reached through VPC endpoints either way


@dataclass(frozen=True)
class CapacitySettings:
    mode: CapacityMode
    reservation_id: str | None  # existing ODCR or Capacity Block to target
    reservation_instance_count: int | None  # instances the existing reservation holds, when known
    reservation_start: dt.datetime | None  # capacity-block: when the block starts (nodes are scaled up then)
    reservation_end: dt.datetime | None  # created ODCR: its end; capacity-block: nodes scale to 0 before it

    @property
    def creates_reservation(self) -> bool:
        return self.mode is CapacityMode.ODCR and self.reservation_id is None

    @property
    def uses_placement_group(self) -> bool:
        # Capacity Blocks are already co-located and reject placement groups; an existing ODCR was created
        # without our placement group, and an instance launched into a cluster placement group can only use a
        # reservation made in that group.
        return self.mode is CapacityMode.ON_DEMAND or self.creates_reservation


@dataclass(frozen=True)
class ComputeSettings:
    instance_type: InstanceType  # the catalog entry
    node_count: int  # the nodes a job runs on (clusterctl submit's default --nodes)
    spare_nodes: int  # verified nodes the group holds beyond the job's: a lost node's job restarts on one at once
    ami_parameter: str  # SSM public parameter holding the AMI id, resolved at deploy time
    root_volume_gib: int
    scratch_mount_point: str

    @property
    def group_size(self) -> int:
        """Every node the Auto Scaling group holds (and a reservation or Capacity Block must hold)."""
        return self.node_count + self.spare_nodes


@dataclass(frozen=True)
class StorageSettings:
    fsx_storage_gib: int
    fsx_throughput_mbps_per_tib: int
    fsx_efa_enabled: bool
    fsx_mount_point: str
    data_bucket_name: str | None  # import this bucket instead of creating one
    checkpoint_bucket_name: str | None
    checkpoint_version_retention_days: int  # noncurrent checkpoint object versions expire after this
    data_version_retention_days: int  # noncurrent data object versions (overwritten or deleted) expire after this
    # The one role besides the FSx export that may write and delete checkpoint objects (the bucket policy denies
    # everyone else); None: only the export (docs/security.md, "The checkpoint bucket's policy").
    checkpoint_admin_role_arn: str | None = None

    @property
    def fsx_throughput_gbps(self) -> float:
        """Aggregate FSx throughput in GB/s: capacity (TiB) x per-TiB rate (MB/s)."""
        return self.fsx_storage_gib / 1024 * self.fsx_throughput_mbps_per_tib / 1000


@dataclass(frozen=True)
class ObservabilitySettings:
    log_retention_days: int
    alarm_email: str | None
    metrics_interval_seconds: int = 60  # node metrics (GPU, EFA, host) sampling interval
    idle_gpu_alarm: bool = True  # alarm: mean GPU utilization below the threshold for 30 min, nodes in service
    idle_gpu_utilization_percent: int = 10  # the idle alarm's threshold, percent
    straggler_alarm: bool = True  # alarms: one GPU or rank behind the others for 15 minutes
    straggler_margin_percent: int = 30  # how far behind: GPU utilization points, or % slower step time
    efa_error_alarm: bool = True  # alarm: EFA error events on the nodes rising for 15 minutes
    budget_usd: float | None = None  # alarm when the estimated cost exceeds it; None: no budget alarm


@dataclass(frozen=True)
class BootstrapSettings:
    """How long a node may take to boot, and when failing nodes stop being replaced (protected mode)."""

    timeout_minutes: int  # the whole node bootstrap; past it the node is marked failed with the reason
    protected_mode_failures: int  # this many bootstrap failures in a row, for the same reason, ...
    protected_mode_window_minutes: int  # ... within this window suspend the group's ReplaceUnhealthy

    @property
    def timeout_seconds(self) -> int:
        return self.timeout_minutes * 60


@dataclass(frozen=True)
class HealthSettings:
    """The node health monitor and the job supervisor's hang detection (docs/operations.md, "When a node
    fails")."""

    check_interval_seconds: int  # the node health monitor runs a round this often; 0: the monitor is off
    job_hang_timeout_minutes: int  # no trainer step for this long: the job is stopped as hung; 0: off
    job_start_timeout_minutes: int  # the same for the first step after a start or a restart (compile, load)
    # the least a hang timeout learned from the step cadence (5 x the slowest interval) can be
    job_hang_floor_seconds: int = 120
    # with a trainer that prints its phase records: the least a hang timeout learned from the steps between its
    # phases can be (node_bootstrap/jobs/progress.py); jobHangFloorSeconds stays the safety net
    job_step_hang_floor_seconds: int = 20

    @property
    def monitor_enabled(self) -> bool:
        return self.check_interval_seconds > 0


@dataclass(frozen=True)
class JobKeeperSettings:
    """The job keeper (cluster_constructs/job_keeper.py): a job that lost a node restarts on a new node set."""

    max_job_restarts: int  # restarts of one job before the keeper gives up (failed + alarm); 0: never restart


MAX_JOB_RESTARTS = 100  # a job restarted this often has a cause no restart fixes


@dataclass(frozen=True)
class ClusterSettings:
    region: str
    network: NetworkSettings
    capacity: CapacitySettings
    compute: ComputeSettings
    storage: StorageSettings
    observability: ObservabilitySettings
    tags: Mapping[str, str]
    bootstrap: BootstrapSettings
    health: HealthSettings
    job_keeper: JobKeeperSettings


MIN_HEALTH_CHECK_INTERVAL_SECONDS = 10  # must match node_bootstrap/config.py
