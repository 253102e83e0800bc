"""[data] validation: errors name the field, the value and what is allowed."""

import pytest

from training.data.batches import DataConfig
from training.errors import ConfigError


def test_defaults_are_valid_and_synthetic():
    cfg = DataConfig()
    cfg.validate()
    assert cfg.source == "synthetic"


@pytest.mark.parametrize(
    ("changes", "message"),
    [
        ({"source": "s3"}, "data.source='s3': allowed: synthetic, shards"),
        ({"source": "shards"}, "data.path='': allowed: a shard directory"),
        ({"synthetic_branching": 0}, "data.synthetic_branching=0: allowed: an integer in 1..1024"),
        ({"synthetic_branching": 2000}, "data.synthetic_branching=2000: allowed: an integer in 1..1024"),
        ({"synthetic_branching": True}, "data.synthetic_branching=True: allowed: an integer in 1..1024"),
        ({"prefetch_depth_steps": 0}, "data.prefetch_depth_steps=0: allowed: an integer >= 1"),
        ({"pin_memory": "yes"}, "data.pin_memory='yes': allowed: true, false"),
        ({"numa_affinity": 1}, "data.numa_affinity=1: allowed: true, false"),
    ],
)
def test_invalid_values_name_the_field(changes, message):
    with pytest.raises(ConfigError) as excinfo:
        DataConfig(**changes).validate()
    assert message in str(excinfo.value)


def test_shards_with_a_path_is_valid():
    DataConfig(source="shards", path="/fsx/data/corpus").validate()
