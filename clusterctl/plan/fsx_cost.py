"""What the stack's FSx for Lustre file system costs while a run trains: its size and throughput tier as the
cluster settings' defaults have them (cdk.json: fsxStorageGiB, fsxThroughputPerTiB), at the PERSISTENT_2 SSD
list price per GB-month of that tier.

Prices: Amazon FSx for Lustre pricing page (https://aws.amazon.com/fsx/lustre/pricing/), US East (N. Virginia),
Persistent SSD (PERSISTENT_2), USD per GB-month of storage, throughput included: 125 MB/s/TiB $0.145, 250
$0.210, 500 $0.340, 1000 $0.600; as published in 2026-11, not re-checked against the Price List API. AWS bills
a GB-month over the hours of a month and prices by 730 hours a month. Other regions differ; backups, metadata
IOPS beyond the included ones and data-repository (S3) requests are not counted.
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path

from cluster_aws.errors import EXIT_USAGE, ClusterctlError
from cluster_spec.settings import FSX_THROUGHPUTS_MBPS_PER_TIB

CDK_JSON = Path(__file__).resolve().parents[2] / "cdk.json"
HOURS_PER_MONTH = 730.0  # AWS pricing's month
USD_PER_GB_MONTH_BY_THROUGHPUT = {125: 0.145, 250: 0.210, 500: 0.340, 1000: 0.600}  # us-east-1 PERSISTENT_2 SSD
PRICE_SOURCE = "aws.amazon.com/fsx/lustre/pricing, us-east-1 PERSISTENT_2 SSD, 2026-11"
assert set(USD_PER_GB_MONTH_BY_THROUGHPUT) == set(FSX_THROUGHPUTS_MBPS_PER_TIB)  # a price for every tier


@dataclass(frozen=True)
class FsxCost:
    storage_gib: int
    throughput_mbps_per_tib: int
    source: str  # where the size and tier came from

    @property
    def usd_per_gb_month(self) -> float:
        return USD_PER_GB_MONTH_BY_THROUGHPUT[self.throughput_mbps_per_tib]

    @property
    def usd_per_hour(self) -> float:
        return self.storage_gib * self.usd_per_gb_month / HOURS_PER_MONTH

    def describe(self) -> str:
        return (f"FSx for Lustre: {self.storage_gib:,} GiB at {self.throughput_mbps_per_tib} MB/s/TiB ({self.source}) "
                f"x ${self.usd_per_gb_month:.3f} per GB-month / {HOURS_PER_MONTH:g} h = ${self.usd_per_hour:.2f}/h "
                f"({PRICE_SOURCE})")


def stack_fsx(path: Path | None = None) -> FsxCost | None:
    """The file system the stack deploys by default; None when cdk.json is absent (clusterctl installed without
    the checkout): the plan then says FSx is not counted."""
    path = path or CDK_JSON
    try:
        context = json.loads(path.read_text())["context"]
        storage, throughput = int(context["fsxStorageGiB"]), int(context["fsxThroughputPerTiB"])
    except FileNotFoundError:
        return None
    except (OSError, ValueError, KeyError, TypeError) as error:
        raise ClusterctlError(f"{path}: no readable fsxStorageGiB and fsxThroughputPerTiB: {error}",
                              EXIT_USAGE) from None
    if throughput not in USD_PER_GB_MONTH_BY_THROUGHPUT:
        raise ClusterctlError(f"{path}: fsxThroughputPerTiB={throughput}: allowed: "
                              f"{', '.join(map(str, FSX_THROUGHPUTS_MBPS_PER_TIB))}", EXIT_USAGE)
    return FsxCost(storage, throughput, "cdk.json fsxStorageGiB, fsxThroughputPerTiB")
