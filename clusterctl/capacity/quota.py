"""Does a request fit the EC2 On-Demand P-instance vCPU quota?

The quota "Running On-Demand P instances" (code L-417A185B) counts vCPUs of all running P-family
instances in the region (EC2 User Guide, "On-Demand Instance quotas"). Use is counted here from running and
pending P instances, except Spot instances (they have their own quota); instances in Capacity Blocks are
counted too, which can only overstate the use.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import botocore.exceptions

from instance_catalog.instance_types import INSTANCE_TYPES, get_instance_type

SERVICE_CODE = "ec2"
P_ON_DEMAND_QUOTA_CODE = "L-417A185B"
P_FAMILY = re.compile(r"^p\d")  # p3, p4d, p5, p5e, p5en, p6-b200...


@dataclass(frozen=True)
class QuotaReport:
    instance_type: str
    nodes: int
    vcpus_per_node: int
    quota_vcpus: int  # the applied quota (or the AWS default where none is applied)
    used_vcpus: int  # running and pending On-Demand P instances now

    @property
    def requested_vcpus(self) -> int:
        return self.nodes * self.vcpus_per_node

    @property
    def needed_vcpus(self) -> int:
        return self.used_vcpus + self.requested_vcpus

    @property
    def fits(self) -> bool:
        return self.needed_vcpus <= self.quota_vcpus

    def summary(self) -> list[str]:
        lines = [
            f"quota L-417A185B (Running On-Demand P instances): {self.quota_vcpus} vCPUs",
            f"in use: {self.used_vcpus} vCPUs",
            f"request: {self.nodes} x {self.instance_type} = {self.requested_vcpus} vCPUs "
            f"({self.vcpus_per_node} per node)",
        ]
        if self.fits:
            lines.append(f"fits: {self.quota_vcpus - self.needed_vcpus} vCPUs to spare")
        else:
            lines.append(f"does not fit: {self.needed_vcpus} vCPUs needed, {self.quota_vcpus} allowed")
            lines.append(
                "ask for an increase to at least the vCPUs needed: aws service-quotas "
                f"request-service-quota-increase --service-code ec2 --quota-code {P_ON_DEMAND_QUOTA_CODE} "
                f"--desired-value {self.needed_vcpus}"
            )
        return lines


def read_quota_vcpus(service_quotas: Any) -> int:
    """The applied value; accounts that never changed it may have none applied, so fall back to the
    AWS default value (Service Quotas: NoSuchResourceException)."""
    try:
        quota = service_quotas.get_service_quota(ServiceCode=SERVICE_CODE, QuotaCode=P_ON_DEMAND_QUOTA_CODE)
    except botocore.exceptions.ClientError as e:
        if e.response.get("Error", {}).get("Code") != "NoSuchResourceException":
            raise
        quota = service_quotas.get_aws_default_service_quota(
            ServiceCode=SERVICE_CODE, QuotaCode=P_ON_DEMAND_QUOTA_CODE
        )
    return int(math.floor(quota["Quota"]["Value"]))


def vcpus_in_use(ec2: Any) -> int:
    """vCPUs of running and pending On-Demand P instances; types not in the catalog are looked up."""
    counts: dict[str, int] = {}
    paginator = ec2.get_paginator("describe_instances")
    pages = paginator.paginate(Filters=[{"Name": "instance-state-name", "Values": ["pending", "running"]}])
    for page in pages:
        for reservation in page["Reservations"]:
            for instance in reservation["Instances"]:
                instance_type = instance["InstanceType"]
                if P_FAMILY.match(instance_type) and instance.get("InstanceLifecycle") != "spot":
                    counts[instance_type] = counts.get(instance_type, 0) + 1
    vcpus = {name: INSTANCE_TYPES[name].vcpus for name in counts if name in INSTANCE_TYPES}
    unknown = sorted(set(counts) - set(vcpus))
    if unknown:
        for info in ec2.describe_instance_types(InstanceTypes=unknown)["InstanceTypes"]:
            vcpus[info["InstanceType"]] = info["VCpuInfo"]["DefaultVCpus"]
    return sum(count * vcpus[name] for name, count in counts.items())


def check_quota(ec2: Any, service_quotas: Any, instance_type: str, nodes: int) -> QuotaReport:
    entry = get_instance_type(instance_type)
    if not P_FAMILY.match(entry.name):
        raise ValueError(f"{entry.name} is not a P instance: quota L-417A185B does not apply")
    return QuotaReport(
        instance_type=entry.name,
        nodes=nodes,
        vcpus_per_node=entry.vcpus,
        quota_vcpus=read_quota_vcpus(service_quotas),
        used_vcpus=vcpus_in_use(ec2),
    )
