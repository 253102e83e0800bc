"""`clusterctl status` shows the layout a training job was submitted with (clusterctl/jobs/layout_view.py): the
[parallel] degrees of its config's text at submit time and its --set items, on its nodes' GPUs."""

from __future__ import annotations

import datetime

import pytest

from cluster_jobs.table import JobRecord
from clusterctl.jobs.view import format_record, record_json

NOW = datetime.datetime(2026, 11, 20, 23, 30, tzinfo=datetime.UTC)


def record(*, config_text: str = "[run]\nsteps = 10\n", overrides: list[str] | None = None, nodes: int = 2,
           module: str = "training") -> JobRecord:
    return JobRecord(
        job_id="j-20261120-231502-ab12", module=module, config="training/configs/1b.toml", config_text=config_text,
        overrides=overrides or [], resume_from="", nodes=nodes, gpus_per_node=8, max_restarts=3, max_job_restarts=5,
        instance_type="p5.48xlarge", checkpoint_dir="/fsx/checkpoints/j-20261120-231502-ab12", state="running",
        created_at="2026-11-20T23:15:02Z", updated_at="2026-11-20T23:15:02Z", attempts=[])


def layout_lines(job: JobRecord) -> list[str]:
    return [line for line in format_record(job).splitlines() if line.startswith("layout:")]


@pytest.mark.parametrize(("config_text", "overrides", "nodes", "line"), [
    ("[run]\nsteps = 10\n", [], 2, "layout: FSDP 16 (parallel.dp_replicate=1 dp_shard=16 tp=1)"),
    # the config's [parallel] with a --set item over it: dp_shard -1 is the ranks left over
    ("[parallel]\ntp = 8\ndp_replicate = 4\n", ["parallel.dp_replicate=2"], 8,
     "layout: TP 8 x HSDP 2 x 4 (parallel.dp_replicate=2 dp_shard=4 tp=8)"),
    ("", ["parallel.tp=8"], 32, "layout: TP 8 x FSDP 32 (parallel.dp_replicate=1 dp_shard=32 tp=8)"),
    ("[parallel]\ndp_replicate = 2\n", [], 4, "layout: HSDP 2 x 16 (parallel.dp_replicate=2 dp_shard=16 tp=1)"),
])
def test_status_shows_the_layout_the_job_was_submitted_with(config_text, overrides, nodes, line):
    job = record(config_text=config_text, overrides=overrides, nodes=nodes)
    assert layout_lines(job) == [line]
    name, degrees = line.removeprefix("layout: ").split(" (parallel.")
    settings = dict(item.split("=") for item in degrees.rstrip(")").split())
    assert record_json(job, NOW)["layout"] == {"name": name, **{k: int(v) for k, v in settings.items()}}


@pytest.mark.parametrize("job", [
    record(config_text=""),  # the config lived on the nodes only, and no --set item names a degree
    record(module="commcheck", config_text=""),  # no training run
    record(overrides=["parallel.tp=3"]),  # degrees that do not fit 16 GPUs (a record of before the check)
    record(config_text="[parallel\n"),  # text that is no TOML
])
def test_status_shows_no_layout_it_cannot_know(job):
    assert layout_lines(job) == []
    assert record_json(job, NOW)["layout"] is None
