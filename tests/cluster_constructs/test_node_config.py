"""The node config is the contract between stack and node: pinned by a golden file, and readable by the
node's own loader (node_bootstrap.config)."""

import json
from pathlib import Path

from cdk_support import build_settings

from cluster_constructs.node_config import render_node_config
from node_bootstrap.config import parse_node_config

GOLDEN = Path(__file__).parent / "golden" / "node-config.json"


def _rendered(**overrides) -> dict:
    settings = build_settings(**overrides)
    return render_node_config(
        stack_name="TrainingClusterStack",
        region=settings.region,
        compute=settings.compute,
        storage=settings.storage,
        observability=settings.observability,
        file_system_dns_name="fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com",
        file_system_mount_name="abcdefgh",
        log_group_name="/training-cluster/TrainingClusterStack",
        bootstrap=settings.bootstrap,
        auto_scaling_group_name="TrainingClusterStack-nodes",
        health=settings.health,
        fp8_backends=["none", "torchao"],
        # "": no job table. The golden file is also the config of the tests' fake nodes and the drills' nodes,
        # which have none, so their starts go unchecked; the stack's config names the table
        # (tests/stacks/test_node_job_table.py), and tests/node_bootstrap/test_job_table.py checks one.
        job_table_name="",
    )


def test_matches_golden_file():
    # To update after a deliberate schema change: bump SCHEMA_VERSION, then regenerate this file.
    assert _rendered() == json.loads(GOLDEN.read_text())


def test_expected_counts_come_from_the_catalog():
    config = _rendered(instanceType="p5en.48xlarge", fsxEfaEnabled="true", scratchMountPoint="/local")
    assert config["expected"] == {
        "gpuCount": 8,
        "gpuMemoryGiB": 141,
        "efaInterfaceCount": 16,
        "nvmeDeviceCount": 8,
        "nvswitch": True,
        "fp8": True,
    }
    assert config["lustre"]["efaEnabled"] is True
    assert config["scratch"]["mountPoint"] == "/local"


def test_node_side_parser_accepts_what_the_stack_renders():
    config = parse_node_config(json.loads(json.dumps(_rendered(instanceType="p4d.24xlarge"))))
    assert config.expected.efa_interface_count == 4


def test_bootstrap_section_carries_the_deadline_and_protected_mode_settings():
    config = _rendered(bootstrapTimeoutMinutes="30", protectedModeFailures="5", protectedModeWindowMinutes="90")
    assert config["bootstrap"] == {
        "deadlineSeconds": 1800,
        "autoScalingGroupName": "TrainingClusterStack-nodes",
        "protectedModeFailures": 5,
        "protectedModeWindowSeconds": 5400,
    }
    parsed = parse_node_config(json.loads(json.dumps(config)))
    assert parsed.bootstrap.deadline_seconds == 1800 and parsed.expected.nvswitch is True


def test_health_settings_reach_the_monitor_and_the_job_supervisor():
    config = _rendered(healthCheckIntervalSeconds="30", jobHangTimeoutMinutes="20", jobStartTimeoutMinutes="45")
    assert config["monitor"] == {"intervalSeconds": 30}
    assert (config["training"]["jobHangTimeoutSeconds"], config["training"]["jobStartTimeoutSeconds"]) == (1200, 2700)
    parsed = parse_node_config(json.loads(json.dumps(config)))
    assert parsed.monitor.enabled and parsed.monitor.interval_seconds == 30
    assert parsed.training.job_hang_timeout_seconds == 1200
    off = parse_node_config(json.loads(json.dumps(_rendered(healthCheckIntervalSeconds="0"))))
    assert not off.monitor.enabled
