"""Bad Hugging Face input is refused in one line with exit 2, before any step runs: `python -m training`'s own
main() in this process (a 1-rank group), on a tiny model directory (tests/hf_support.py) damaged one way each."""

from __future__ import annotations

import json
import shutil

import pytest
from safetensors.torch import load_file, save_file

from tests.hf_support import save_tiny_llama
from training.__main__ import EXIT_CONFIG, main
from training.data.shards import ShardWriter

pytestmark = pytest.mark.usefixtures("one_torch_thread")


@pytest.fixture(scope="module")
def pristine(tmp_path_factory):
    return save_tiny_llama("llama3_0", tmp_path_factory.mktemp("hf") / "model")


@pytest.fixture()
def model_dir(pristine, tmp_path):
    return shutil.copytree(pristine, tmp_path / "model")


def _run(capsys, model_dir, *extra: str) -> str:
    """main() on the model directory; asserts exit 2 with exactly one error line and no step, returns the line."""
    code = main(["--set", f"init.hf_dir={model_dir}", "--set", "model.preset=", "--set", "run.steps=2",
                 "--set", "run.seq_len=16", "--set", "run.micro_batch_size=2", *extra])
    out, err = capsys.readouterr()
    assert code == EXIT_CONFIG, err[-3000:]
    lines = [line for line in err.splitlines() if line.startswith("config error: ")]
    assert len(lines) == 1, err[-3000:]
    assert '"event": "step"' not in out
    return lines[0]


def _index(model_dir) -> dict:
    return json.loads((model_dir / "model.safetensors.index.json").read_text())["weight_map"]


def test_an_index_naming_an_absent_file(capsys, model_dir):
    file = _index(model_dir)["model.layers.1.mlp.up_proj.weight"]
    (model_dir / file).unlink()
    line = _run(capsys, model_dir)
    assert line == (f"config error: {model_dir / 'model.safetensors.index.json'}: names {file} (for "
                    f"{next(k for k, v in _index(model_dir).items() if v == file)}), which is not in {model_dir}; "
                    "allowed: an index whose every file is present (a complete copy of the model)")


def test_a_directory_without_safetensors_files(capsys, model_dir):
    for path in model_dir.glob("*.safetensors"):
        path.unlink()
    (model_dir / "model.safetensors.index.json").unlink()
    assert _run(capsys, model_dir) == (f"config error: init.hf_dir={str(model_dir)!r}: no *.safetensors file; "
                                       "allowed: a Hugging Face model directory with its safetensors weights")


def test_a_truncated_safetensors_file(capsys, model_dir):
    path = model_dir / _index(model_dir)["model.embed_tokens.weight"]
    size = path.stat().st_size
    path.write_bytes(path.read_bytes()[:-100])
    assert _run(capsys, model_dir) == (f"config error: {path}: truncated: {size - 100} bytes, its header describes "
                                       f"{size}; allowed: a complete copy")


def test_a_tensor_of_the_wrong_shape(capsys, model_dir):
    path = model_dir / _index(model_dir)["model.layers.0.self_attn.k_proj.weight"]
    tensors = load_file(path)
    tensors["model.layers.0.self_attn.k_proj.weight"] = tensors["model.layers.0.self_attn.k_proj.weight"][:16]
    save_file(tensors, path, metadata={"format": "pt"})
    assert _run(capsys, model_dir) == (f"config error: {path}: tensor model.layers.0.self_attn.k_proj.weight has "
                                       "shape [16, 64]; config.json implies [32, 64]")


def test_a_missing_tensor(capsys, model_dir):
    path = model_dir / _index(model_dir)["model.norm.weight"]
    tensors = load_file(path)
    del tensors["model.norm.weight"]
    save_file(tensors, path, metadata={"format": "pt"})
    assert _run(capsys, model_dir) == (f"config error: init.hf_dir={str(model_dir)!r}: no tensor model.norm.weight "
                                       "in its safetensors files; config.json implies it")


@pytest.mark.parametrize(("field", "value", "message"), [
    ("attention_bias", True, "attention_bias=True: not supported by this trainer; allowed: false (no biases)"),
    ("model_type", "mistral", "model_type='mistral': not supported by this trainer; allowed: 'llama'"),
    ("rope_parameters", {"rope_type": "yarn", "rope_theta": 10000.0, "factor": 4.0},
     "rope_parameters.rope_type='yarn': not supported by this trainer; allowed: 'default', 'llama3'"),
    ("num_local_experts", 8, "num_local_experts=8: not supported by this trainer; allowed: absent (a dense model"),
])
def test_an_unsupported_config_field(capsys, model_dir, field, value, message):
    config = json.loads((model_dir / "config.json").read_text())
    config[field] = value
    (model_dir / "config.json").write_text(json.dumps(config))
    line = _run(capsys, model_dir)
    assert line.startswith(f"config error: {model_dir / 'config.json'}: {message}")


def test_a_vocabulary_too_small_for_the_data(capsys, model_dir, tmp_path):
    shards = tmp_path / "shards"
    shards.mkdir()
    writer = ShardWriter(shards, vocab_size=512, eos_id=511, tokenizer={"kind": "test", "vocab_size": 512},
                         shard_size_tokens=1000)
    writer.add_document(list(range(400)))
    writer.finish()
    line = _run(capsys, model_dir, "--set", "data.source=shards", "--set", f"data.path={shards}")
    assert line == (f"config error: data.path={str(shards)!r}: token ids up to 511 (its tokenizer's vocab_size 512), "
                    f"but {model_dir / 'config.json'} has vocab_size=320; allowed: data prepared with that model's "
                    "own tokenizer.json (python -m training.data.prepare --tokenizer <init.hf_dir>/tokenizer.json)")


def test_a_preset_of_another_shape(capsys, model_dir):
    line = _run(capsys, model_dir, "--set", "model.preset=125m")
    assert line == (f"config error: model.preset='125m' has dim=768, but {model_dir / 'config.json'} has "
                    "hidden_size=64; allowed: a preset of the same shape, or model.preset='' (the shape from "
                    "config.json alone)")


def test_a_checkpoint_dir_left_by_a_run_from_another_model(capsys, model_dir, tmp_path):
    # an earlier run's hf-init/ copy (a tied model) in the checkpoint.dir a fresh start from another model reuses
    other = save_tiny_llama("llama3_2", tmp_path / "other")
    (tmp_path / "ckpt" / "hf-init").mkdir(parents=True)
    shutil.copyfile(other / "config.json", tmp_path / "ckpt" / "hf-init" / "config.json")
    line = _run(capsys, model_dir, "--set", f"checkpoint.dir={tmp_path / 'ckpt'}")
    assert line == (f"config error: {model_dir / 'config.json'}: describes another model than checkpoint.dir's "
                    "hf-init/config.json (left by an earlier run with another init.hf_dir); allowed: a new "
                    "checkpoint.dir")
