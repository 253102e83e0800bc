"""The layout a training job runs under, as `clusterctl status` shows it: read back from what its record
holds of the submit (the config's text at submit time and the --set items), so the line says what the
nodes were asked for, whatever this checkout's files say now."""

from __future__ import annotations

import tomllib

from cluster_jobs.table import JobRecord
from node_bootstrap import job_contract
from training import config as training_config
from training.config.parallel import SHARD_REST
from training.errors import ConfigError
from training.parallel.layout import MESH_DIMS, Layout


def record_layout(record: JobRecord) -> Layout | None:
    """The degrees of ``record``'s training run on its nodes' GPUs (``[parallel]`` of its config text, then its
    --set items; dp_shard -1 resolved to the ranks left over). None for a job that is no training run, whose
    config lived on the nodes only and whose --set items name no degree, or whose degrees do not fit its ranks
    (a submit refuses those: a record of before that check)."""
    if record.module != job_contract.TRAINING_MODULE:
        return None
    try:
        degrees = _config_degrees(record.config_text)
        named = training_config.parse_overrides(record.overrides).get("parallel", {})
    except (tomllib.TOMLDecodeError, ConfigError):
        return None
    degrees.update({k: v for k, v in named.items() if k in MESH_DIMS})
    if not record.config_text and not degrees:
        return None  # the nodes' config may set them: not known here
    world = record.nodes * record.gpus_per_node
    dp_replicate, tp = degrees.get("dp_replicate", 1), degrees.get("tp", 1)
    dp_shard = degrees.get("dp_shard", SHARD_REST)
    if dp_shard == SHARD_REST and dp_replicate * tp and world % (dp_replicate * tp) == 0:
        dp_shard = world // (dp_replicate * tp)
    layout = Layout(dp_replicate=dp_replicate, dp_shard=dp_shard, tp=tp)
    fits = world > 0 and layout.world_size == world and min(dp_replicate, dp_shard, tp) >= 1
    return layout if fits else None


def layout_line(record: JobRecord) -> str | None:
    """``layout: TP 8 x FSDP 4 (parallel.dp_replicate=1 dp_shard=4 tp=8)``, or None (see record_layout)."""
    layout = record_layout(record)
    if layout is None:
        return None
    settings = " ".join(f"{k}={v}" for k, v in layout.settings().items())
    return f"layout: {layout.name} (parallel.{settings})"


def _config_degrees(config_text: str) -> dict[str, int]:
    parallel = tomllib.loads(config_text).get("parallel", {}) if config_text else {}
    return {k: v for k, v in parallel.items() if k in MESH_DIMS and isinstance(v, int)} if isinstance(
        parallel, dict) else {}
