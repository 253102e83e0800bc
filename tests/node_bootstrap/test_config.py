"""The node config contract: docs/architecture.md section 2 into frozen dataclasses, with named errors."""

from __future__ import annotations

import dataclasses
import json

import pytest

from node_bootstrap.config import ConfigError, load_node_config, parse_node_config


def test_the_documented_example_loads(kit, tmp_path):
    path = tmp_path / "node-config.json"
    path.write_text(json.dumps(kit.node_config_dict()))
    config = load_node_config(str(path))
    assert config.instance_type == "p5.48xlarge"
    assert config.expected.efa_interface_count == 32 and config.expected.gpu_memory_gib == 80
    assert config.lustre.source == "fs-0123456789abcdef0.fsx.us-east-1.amazonaws.com@tcp:/abcdefgh"
    assert config.training.rendezvous_port == 29400
    assert config.metrics.interval_seconds == 60 and config.metrics.namespace == "TrainingCluster"
    assert config.cloudwatch_agent["metrics"]["metrics_collected"]["nvidia_gpu"]
    with pytest.raises(dataclasses.FrozenInstanceError):
        config.region = "eu-west-1"


@pytest.mark.parametrize("mutate, message", [
    (lambda c: c["lustre"].pop("mountName"), "missing key lustre.mountName in the node config"),
    (lambda c: c["expected"].update(gpuCount="8"),
     'expected.gpuCount="8" has the wrong type; allowed: an integer'),
    (lambda c: c["expected"].update(gpuCount=0),
     "expected.gpuCount=0 is out of range; allowed: an integer from 1"),
    (lambda c: c["lustre"].update(efaEnabled="no"),
     'lustre.efaEnabled="no" has the wrong type; allowed: true or false'),
    (lambda c: c["scratch"].update(mountPoint="scratch"),
     "scratch.mountPoint='scratch' must be an absolute path"),
    (lambda c: c.update(region=""), "region must be a non-empty string"),
    (lambda c: c.update(schemaVersion=3),
     "schemaVersion=3 is not supported by this node_bootstrap; allowed: 5"),
    (lambda c: c["metrics"].update(intervalSeconds=0),
     "metrics.intervalSeconds=0 is out of range; allowed: an integer from 1 to 3600"),
    (lambda c: c["cloudwatchAgent"].pop("logs"), "missing key cloudwatchAgent.logs in the node config"),
    (lambda c: c.update(training=[]), "training=[] has the wrong type; allowed: a JSON object"),
    (lambda c: c["training"].update(rendezvousPort=70000), "training.rendezvousPort=70000 is out of range"),
    (lambda c: c["expected"].update(nvmeDeviceCount=True),
     "expected.nvmeDeviceCount=true has the wrong type"),
])
def test_invalid_configs_name_the_key_and_value(kit, mutate, message):
    data = kit.node_config_dict()
    mutate(data)
    with pytest.raises(ConfigError) as err:
        parse_node_config(data)
    assert message in str(err.value)


def test_unreadable_or_malformed_files(tmp_path):
    with pytest.raises(ConfigError, match="cannot read node config .*missing.json: No such file"):
        load_node_config(str(tmp_path / "missing.json"))
    bad = tmp_path / "bad.json"
    bad.write_text("{not json")
    with pytest.raises(ConfigError, match="is not valid JSON"):
        load_node_config(str(bad))
    with pytest.raises(ConfigError, match="the node config must be a JSON object, got an array"):
        parse_node_config([])
