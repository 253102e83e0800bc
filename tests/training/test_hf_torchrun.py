"""Hugging Face weights in and out on 2 CPU ranks (torchrun, gloo, FSDP2), with tiny random models of each kind
(tests/hf_support.py): one torchrun launch imports all three, then trains the tied one 3 steps with an export at
the end; the checks below read what it left. Then attempt 2 of that run resumes without the init directory."""

from __future__ import annotations

import json
import shutil
import subprocess
import sys

import pytest
import torch
from preloaded_ranks import run_preloaded
from torch.distributed.checkpoint.format_utils import dcp_to_torch_save

from tests.hf_support import KINDS, TOKENIZER_JSON, VOCAB, hf_logits, read_safetensors_dir, save_tiny_llama
from tests.torchrun_support import REPO, RUN_TIMEOUT_S, SMALL, env
from training.config.sections import ModelConfig
from training.hf.export import export_checkpoint
from training.hf.names import to_hf
from training.model import Transformer

pytestmark = pytest.mark.usefixtures("one_torch_thread")
TRAINED = "llama3_2"  # tied embeddings and llama3 RoPE scaling: the kind with the most to get wrong
STEPS = 3


@pytest.fixture(scope="module")
def run(tmp_path_factory):
    work = tmp_path_factory.mktemp("hf")
    kinds = {kind: save_tiny_llama(kind, work / f"hf-{kind}", seed=i) for i, kind in enumerate(KINDS)}
    init_copy = shutil.copytree(kinds[TRAINED], work / "init-for-training")  # removed before attempt 2
    torch.save(torch.randint(0, VOCAB, (2, 32), generator=torch.Generator().manual_seed(1)), work / "tokens.pt")
    (work / "kinds.json").write_text(json.dumps({kind: str(path) for kind, path in kinds.items()}))
    overrides = SMALL + [f"init.hf_dir={init_copy}", "model.preset=", f"checkpoint.dir={work / 'train'}",
                         f"export.hf_dir={work / 'export'}", f"run.steps={STEPS}", "optim.warmup_steps=1"]
    (work / "train.json").write_text(json.dumps(overrides))
    proc = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--standalone", "--nproc_per_node=2",
         str(REPO / "tests" / "hf_import_entry.py"), str(work)],
        cwd=REPO, env=env(), text=True, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stdout[-6000:]
    return work, kinds, overrides, proc.stdout


def _checkpoint_model(step_path, tmp_path) -> dict[str, torch.Tensor]:
    out = tmp_path / f"{step_path.parent.name}-{step_path.name}.pt"
    dcp_to_torch_save(step_path, out)
    return torch.load(out, weights_only=False)["model"]


def _our_logits(cfg: ModelConfig, weights: dict[str, torch.Tensor], tokens: torch.Tensor) -> torch.Tensor:
    model = Transformer(cfg)
    model.load_state_dict({k: v.float() for k, v in weights.items()}, strict=True)
    with torch.no_grad():
        return model.eval()(tokens)


@pytest.mark.parametrize("kind", list(KINDS))
def test_the_sharded_import_computes_transformers_logits(run, kind):
    work, kinds, _, _ = run
    tokens = torch.load(work / "tokens.pt")
    ours = torch.load(work / f"logits-{kind}.pt")
    theirs = hf_logits(kinds[kind], tokens)
    assert ours.dtype == theirs.dtype == torch.float32
    torch.testing.assert_close(ours, theirs, rtol=0, atol=2e-5)
    assert theirs.abs().max() > 0.1  # logits of a model that computes something, not of zeros


@pytest.mark.parametrize("kind", list(KINDS))
def test_import_then_export_gives_back_the_input_bit_for_bit(run, kind, tmp_path):
    work, kinds, _, _ = run
    result = export_checkpoint(work / f"import-{kind}", tmp_path / "out", max_shard_bytes=30_000)
    assert result.step == 0 and result.files > 1
    original, exported = read_safetensors_dir(kinds[kind]), read_safetensors_dir(tmp_path / "out")
    assert sorted(exported) == sorted(original)  # a tied model: no lm_head.weight on either side
    for name, tensor in original.items():
        assert exported[name].dtype == torch.bfloat16 and torch.equal(exported[name], tensor), name
    index = json.loads((tmp_path / "out" / "model.safetensors.index.json").read_text())
    assert set(index["weight_map"]) == set(original)
    assert (tmp_path / "out" / "tokenizer.json").read_text() == TOKENIZER_JSON  # from the job's hf-init/ copy
    config = json.loads((tmp_path / "out" / "config.json").read_text())
    source = json.loads((kinds[kind] / "config.json").read_text())  # the init directory's, shape and all
    assert {k: config[k] for k in source if k != "transformers_version"} == {
        k: v for k, v in source.items() if k != "transformers_version"}


def test_a_trained_export_loads_in_transformers_with_the_trainers_logits(run, tmp_path):
    work, kinds, _, output = run
    tokens = torch.load(work / "tokens.pt")
    step = work / "train" / f"step-{STEPS}"
    assert (step / "train_state.json").is_file()
    trained = _checkpoint_model(step, tmp_path)
    marker = json.loads((step / "train_state.json").read_text())
    cfg = ModelConfig(**marker["config"]["model"])
    assert cfg.tie_embeddings and cfg.rope_scaling == "llama3" and marker["config"]["init"]["hf_dir"]
    # training moved the weights away from the import
    initial = read_safetensors_dir(kinds[TRAINED])
    assert not torch.equal(trained["layers.0.attention.wq.weight"].bfloat16(),
                           initial["model.layers.0.self_attn.q_proj.weight"])
    exported = read_safetensors_dir(work / "export")
    assert "lm_head.weight" not in exported
    for name, tensor in trained.items():
        if name != "output.weight":
            assert torch.equal(exported[to_hf(name)], tensor.to(torch.bfloat16)), name
    # the trainer's model with the exported (bf16-rounded) weights and transformers on the export: the same logits
    rounded = {k: v.to(torch.bfloat16) for k, v in trained.items()}
    torch.testing.assert_close(_our_logits(cfg, rounded, tokens), hf_logits(work / "export", tokens),
                               rtol=0, atol=2e-5)
    # and within bf16 rounding of the fp32 weights' logits
    torch.testing.assert_close(_our_logits(cfg, trained, tokens), hf_logits(work / "export", tokens),
                               rtol=0, atol=0.05)
    assert (work / "export" / "tokenizer.json").read_text() == TOKENIZER_JSON
    # the run started from the init directory's weights: its norms (drawn in 0.5..1.5, where a random init has
    # 1.0) moved by at most a few steps' worth
    start = initial["model.layers.1.input_layernorm.weight"].float()
    assert (start - 1).abs().max() > 0.3
    assert (trained["layers.1.attention_norm.weight"] - start).abs().max() < 0.05
    assert '{"event": "resume", "step": 0, "path": null, "phases": ' in output


def test_the_export_command_writes_what_the_end_of_the_run_wrote(run, tmp_path):
    work, _, _, _ = run
    argv = ["-m", "training.export", "--checkpoint", str(work / "train"), "--step", str(STEPS),
            "--out", str(tmp_path / "out"), "--max-shard-gb", "0.00003"]
    proc = run_preloaded(argv, cwd=REPO, env=env(), timeout=RUN_TIMEOUT_S)
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout == f"{tmp_path / 'out'}\n"
    ours, at_end = read_safetensors_dir(tmp_path / "out"), read_safetensors_dir(work / "export")
    assert sorted(ours) == sorted(at_end) and all(torch.equal(ours[k], at_end[k]) for k in ours)
    assert len(list((tmp_path / "out").glob("model-*-of-*.safetensors"))) > 1
    assert (tmp_path / "out" / "generation_config.json").read_text() == (work / "export" /
                                                                         "generation_config.json").read_text()
    # the config error as a real process prints it (its own interpreter, its exit code)
    bad = subprocess.run([sys.executable, *argv[:-4], "--step", "99", "--out", str(tmp_path / "x")], cwd=REPO,
                         env=env(), text=True, capture_output=True, timeout=RUN_TIMEOUT_S)
    assert bad.returncode == 2
    assert bad.stderr.strip().splitlines()[-1] == (
        f"config error: --step=99: {work / 'train' / 'step-99'} is not a complete checkpoint (needs .metadata and "
        f"train_state.json); allowed: a complete step under {work / 'train'}")


def test_attempt_2_resumes_its_own_checkpoint_without_the_init_directory(run):  # last: it changes the run's files
    work, _, overrides, _ = run
    shutil.rmtree(work / "init-for-training")  # gone: attempt 2 must not need it
    argv = ["-m", "training", "--resume", "auto"]
    for item in overrides + [f"run.steps={STEPS + 2}"]:
        argv += ["--set", item]
    proc = run_preloaded(argv, cwd=REPO, env=env(), timeout=RUN_TIMEOUT_S, merge_stderr=True)
    assert proc.returncode == 0, proc.stdout[-4000:]
    resumes = [json.loads(line) for line in proc.stdout.splitlines() if line.startswith('{"event": "resume"')]
    assert resumes and resumes[0]["step"] == STEPS
    assert "from init.hf_dir" not in proc.stdout
    steps = [json.loads(line)["step"] for line in proc.stdout.splitlines() if line.startswith('{"event": "step"')]
    assert steps == [STEPS + 1, STEPS + 2]
    assert (work / "train" / f"step-{STEPS + 2}" / "train_state.json").is_file()
    assert json.loads((work / "export" / "config.json").read_text())["tie_word_embeddings"] is True
