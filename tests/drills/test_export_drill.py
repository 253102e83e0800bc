"""clusterctl export end to end on a local one-node cluster (tests/local_cluster.py): a tiny training job saves
real checkpoints, then `clusterctl export` starts a real export job through the jobs document's script and
the node launcher (direct), which runs `python -m training.export` on the CPU as one process. The Hugging Face
directory appears in the export job's own checkpoint directory, the S3 URI clusterctl printed names that
directory in the checkpoint bucket, and `clusterctl status` says where the model is."""

from __future__ import annotations

import json
import re

from keeper_drill import submit_argv
from local_cluster import CHECKPOINT_BUCKET, CHECKPOINT_ROOT
from safetensors import safe_open

from cluster_aws.errors import EXIT_OK

STEPS = 4
OVERRIDES = ["run.seq_len=32", "run.micro_batch_size=4", "run.log_interval_steps=1", f"run.steps={STEPS}",
             "checkpoint.interval_steps=2", "checkpoint.async_save=false"]


def test_a_finished_jobs_checkpoint_is_exported_by_an_export_job_into_its_own_directory(drills):
    drill = drills(node_count=1)
    trained = drill.clusterctl_json(*submit_argv(OVERRIDES))
    source = trained["jobId"]
    drill.until(source, lambda r: r.state in ("succeeded", "failed"), "the training job ended")
    assert drill.record(source).state == "succeeded", drill.cluster.nodes[trained["nodes"][0]].job_log(source)

    result = drill.clusterctl("export", source, "--step", "2")
    assert result.code == EXIT_OK, result.err
    export_id, started = result.out.splitlines()
    assert export_id.startswith(f"{source}-hf-")
    assert f" the model lands in s3://{CHECKPOINT_BUCKET}/{export_id}/hf/ " in started
    record = drill.until(export_id, lambda r: r.state in ("succeeded", "failed"), "the export job ended")
    (node,) = drill.cluster.nodes.values()
    assert record.state == "succeeded", node.job_log(export_id)

    # /fsx/checkpoints/<export id>/hf: what the data repository association carries to s3://<bucket>/<export id>/hf/
    out = drill.cluster.local_path(f"{CHECKPOINT_ROOT}/{export_id}/hf")
    assert sorted(p.name for p in out.iterdir()) == [
        "config.json", "generation_config.json", "model-00001-of-00001.safetensors", "model.safetensors.index.json"]
    config = json.loads((out / "config.json").read_text())
    assert (config["model_type"], config["hidden_size"], config["num_hidden_layers"]) == ("llama", 64, 2)
    index = json.loads((out / "model.safetensors.index.json").read_text())
    with safe_open(str(out / "model-00001-of-00001.safetensors"), "pt") as f:
        assert sorted(f.keys()) == sorted(index["weight_map"])
        embed = f.get_tensor("model.embed_tokens.weight")
    assert (tuple(embed.shape), str(embed.dtype)) == ((320, 64), "torch.bfloat16")
    # step 2, as asked, of the source's directory, which the export only read
    assert re.search(rf"exported step 2 of \S*/checkpoints/{source}/step-2 to \S*/checkpoints/{export_id}/hf",
                     node.job_log(export_id))
    assert not drill.cluster.local_path(f"{CHECKPOINT_ROOT}/{source}/hf").exists()

    shown = drill.clusterctl("status", export_id)
    assert shown.code == EXIT_OK, shown.err
    assert f"model: s3://{CHECKPOINT_BUCKET}/{export_id}/hf/ (the data repository association copies it" in shown.out
