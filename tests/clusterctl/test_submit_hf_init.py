"""`clusterctl submit` takes the Hugging Face settings (training's [init] and [export]) as --set items and checks
them with the trainer's own config loader before anything is sent (docs/weights.md)."""

from __future__ import annotations

import pytest

from cluster_aws.errors import EXIT_USAGE, ClusterctlError
from cluster_jobs.request import JobRequest

CONFIG = "training/configs/llama3-8b.toml"


def test_init_and_export_directories_are_accepted():
    JobRequest(config=CONFIG, nodes=2, gpus_per_node=8, max_restarts=3,
               overrides=("init.hf_dir=/fsx/data/Llama-3.1-8B", "export.hf_dir=/fsx/checkpoints/out/hf")).validate()


def test_a_shape_beside_the_init_directory_is_refused_before_sending():
    request = JobRequest(config=CONFIG, nodes=2, gpus_per_node=8, max_restarts=0,
                         overrides=("init.hf_dir=/fsx/data/Llama-3.1-8B", "model.n_layers=16"))
    with pytest.raises(ClusterctlError) as err:
        request.validate()
    assert err.value.exit_code == EXIT_USAGE
    assert str(err.value) == (
        f"not submitted: {CONFIG} with the --set items: model.n_layers: not allowed with init.hf_dir (the model's "
        "shape comes from its config.json); allowed: model.preset, which the run checks against config.json")
