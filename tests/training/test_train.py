"""The loop's pieces in one process (gradient accumulation, clipping) and the ``python -m training`` CLI."""

from __future__ import annotations

import json
import os
import re
import subprocess
import sys
from pathlib import Path

import pytest
import torch
import torch.nn.functional as F
from torch import nn

from tests.hf_support import save_tiny_llama
from training.__main__ import build_parser, main
from training.fp8 import Fp8Config, build_fp8_backend
from training.step import clip_grad_norm_, forward_backward

REPO = Path(__file__).resolve().parents[2]


def tiny_lm(seed: int = 0) -> nn.Module:
    torch.manual_seed(seed)
    return nn.Sequential(nn.Embedding(16, 8), nn.Linear(8, 16))


def test_accumulated_gradients_equal_the_full_batch_gradients():
    torch.manual_seed(1)
    inputs, targets = torch.randint(0, 16, (4, 6)), torch.randint(0, 16, (4, 6))
    full = tiny_lm()
    logits = full(inputs)
    F.cross_entropy(logits.flatten(0, 1), targets.flatten()).backward()

    accumulated = tiny_lm()
    halves = [(inputs[:2], targets[:2]), (inputs[2:], targets[2:])]
    no_fp8 = build_fp8_backend(Fp8Config(backend="none"))
    loss = forward_backward(accumulated, no_fp8, halves, grad_accum_steps=2)

    expected_loss = F.cross_entropy(full(inputs).flatten(0, 1), targets.flatten())
    assert loss.item() == pytest.approx(expected_loss.item(), rel=1e-6)
    assert not loss.requires_grad
    for a, b in zip(full.parameters(), accumulated.parameters(), strict=True):
        torch.testing.assert_close(a.grad, b.grad)


def test_the_fused_loss_accumulates_the_gradients_of_the_full_logits_loss():
    """parallel.loss_chunk_tokens > 0: forward_backward asks the model for the loss (Transformer.forward with
    targets); over 2 micro-batches the gradients are the full-logits path's."""
    from training.model import Transformer, build_model_config

    cfg = build_model_config("tiny")
    gen = torch.Generator().manual_seed(2)
    inputs, targets = torch.randint(0, 320, (4, 16), generator=gen), torch.randint(0, 320, (4, 16), generator=gen)
    halves = [(inputs[:2], targets[:2]), (inputs[2:], targets[2:])]
    no_fp8 = build_fp8_backend(Fp8Config(backend="none"))
    models, losses = [], []
    for chunk in (0, 24):  # 32 tokens per micro-batch: a chunk of 24 and one of 8
        model = Transformer(cfg)
        model.init_weights(seed=0)
        losses.append(forward_backward(model, no_fp8, halves, grad_accum_steps=2, loss_chunk_tokens=chunk))
        models.append(model)
    assert losses[1].item() == pytest.approx(losses[0].item(), rel=1e-6) and not losses[1].requires_grad
    for (name, a), b in zip(models[0].named_parameters(), models[1].parameters(), strict=True):
        torch.testing.assert_close(b.grad, a.grad, rtol=1e-5, atol=1e-7, msg=name)


def test_clip_grad_norm_returns_the_norm_before_clipping_and_clips_to_max():
    model = nn.Linear(3, 1, bias=False)
    model.weight.grad = torch.tensor([[3.0, 4.0, 0.0]])
    norm = clip_grad_norm_(model, max_norm=1.0)
    assert norm.item() == pytest.approx(5.0)
    torch.testing.assert_close(model.weight.grad, torch.tensor([[0.6, 0.8, 0.0]]))


def test_clip_grad_norm_zero_only_measures():
    model = nn.Linear(3, 1, bias=False)
    model.weight.grad = torch.tensor([[3.0, 4.0, 0.0]])
    assert clip_grad_norm_(model, max_norm=0.0).item() == pytest.approx(5.0)
    torch.testing.assert_close(model.weight.grad, torch.tensor([[3.0, 4.0, 0.0]]))


# ---------------------------------------------------------------------------------------------------------
def run_cli(*args: str, timeout: int = 180) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "training", *args], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=timeout)


def test_help_describes_the_options():
    text = build_parser().format_help()
    for option in ("--config", "--set", "--resume", "auto", "none", "PATH"):
        assert option in text


def test_a_config_error_is_one_line_and_exit_2():
    proc = run_cli("--set", "optim.lr=-1")
    assert proc.returncode == 2
    assert proc.stderr.strip().splitlines() == [
        "config error: optim.lr=-1.0: allowed: a finite number > 0"
    ]
    assert proc.stdout == ""


def test_a_data_path_with_synthetic_data_is_refused_in_one_line(capsys):
    # issue 44: --set data.path alone trained on synthetic data and exited 0 (refused before torch is imported)
    assert main(["--set", "data.path=/tmp/shards"]) == 2
    out, err = capsys.readouterr()
    assert out == "" and err.strip().splitlines() == [
        "config error: data.path='/tmp/shards': not read with data.source='synthetic'; allowed: "
        "data.source='shards' with it, or no data.path for synthetic data"]


def test_a_resume_path_that_is_not_a_checkpoint_is_a_config_error(tmp_path):
    proc = run_cli("--resume", str(tmp_path), "--set", "run.steps=1")
    assert proc.returncode == 2, proc.stderr
    assert "Traceback" not in proc.stderr
    assert f"config error: --resume={str(tmp_path)!r}: not a complete checkpoint" in proc.stderr


@pytest.mark.slow
def test_the_embedded_default_trains_as_one_process_without_torchrun(tmp_path):
    # the README's `python -m training` (tiny-cpu.toml), shortened; checkpoints into tmp_path
    proc = run_cli("--set", "run.steps=20", "--set", "run.log_interval_steps=10",
                   "--set", f"checkpoint.dir={tmp_path}")
    assert proc.returncode == 0, proc.stderr
    lines = [json.loads(line) for line in proc.stdout.splitlines()]
    # the phase records for the node's hang watch (training/phases.py): the load (a fresh start's too), the final
    # blocking save, and the close that waits for any save still being written
    assert [(r["phase"], r["state"]) for r in lines if r["event"] == "phase"] == [
        ("checkpoint_load", "start"), ("checkpoint_load", "end"), ("checkpoint_save", "start"),
        ("checkpoint_save", "end"), ("checkpoint_save", "start"), ("checkpoint_save", "end")]
    # a beat after every step that printed no step line: the hang watch learns the cadence of single steps
    assert [r["step"] for r in lines if r["event"] == "beat"] == [*range(2, 10), *range(11, 20)]
    resume, *records = [r for r in lines if r["event"] not in ("phase", "beat")]
    # first the resume line (the jobs launcher's resumedFromStep): an empty checkpoint.dir, a fresh start; with
    # the times of the start's phases, and the first step line with the rest (the restart timeline)
    assert set(resume.pop("phases")) == {"rendezvous_done", "checkpoint_loaded"}
    assert set(records[0].pop("phases")) == {"compiled", "first_step"} and "phases" not in records[1]
    assert resume == {"event": "resume", "step": 0, "path": None}
    assert [r["step"] for r in records] == [1, 10, 20] and {r["event"] for r in records} == {"step"}
    assert records[-1]["loss"] < records[0]["loss"]
    assert (tmp_path / "step-20" / "train_state.json").is_file()
    # said once at start-up: the data read, the schedule, and that tiny-cpu saves only at the end
    assert _logged(proc.stderr, "data: ") == ["source synthetic (no files: a Markov chain over 320 token ids, "
                                              "4 successors each), no path, no tokenizer"]
    assert _logged(proc.stderr, "lr schedule: ") == [
        "peak 3.00e-03 after 10 warmup steps, cosine decay over steps 11-20 to 3.00e-04; final lr 3.00e-04 at step 20"]
    assert _logged(proc.stderr, "checkpoint.interval_steps=0 (off): ") == [
        "no checkpoint is written before the end of the run's 20 steps, only at the end and on SIGTERM or Ctrl-C; "
        "set it below run.steps to save along the way"]


def _logged(stderr: str, prefix: str) -> list[str]:
    """What the log lines starting (after the logging prefix) with ``prefix`` say after it."""
    return [line.split(prefix, 1)[1] for line in stderr.splitlines() if f": {prefix}" in line]


@pytest.mark.slow
def test_the_default_config_trains_on_byte_shards_from_prepare(tmp_path):
    # README: `python -m training.data.prepare` with the byte tokenizer, then the embedded default on those shards
    corpus = tmp_path / "corpus"
    corpus.mkdir()
    for i in range(3):
        (corpus / f"doc{i}.txt").write_text("the quick brown fox jumps over the lazy dog. " * 100)
    shards = tmp_path / "shards"
    prepared = subprocess.run([sys.executable, "-m", "training.data.prepare", "--input", str(corpus), "--output",
                               str(shards)], capture_output=True, text=True, cwd=REPO, timeout=120)
    assert prepared.returncode == 0, prepared.stderr
    proc = run_cli("--set", "data.source=shards", "--set", f"data.path={shards}", "--set", "run.steps=10",
                   "--set", "run.log_interval_steps=10", "--set", f"checkpoint.dir={tmp_path / 'ckpt'}",
                   "--set", "export.hf_dir=hf")
    assert proc.returncode == 0, proc.stderr  # the tiny preset's vocabulary (320) holds the byte ids (257)
    # not the export's line, nor the hang watch's phases and beats
    resume, *records = [r for r in map(json.loads, proc.stdout.splitlines()) if r["event"] in ("resume", "step")]
    resume.pop("phases")  # their times: test_the_embedded_default_trains_as_one_process_without_torchrun
    assert resume == {"event": "resume", "step": 0, "path": None}
    assert [(r["event"], r["step"]) for r in records] == [("step", 1), ("step", 10)]
    assert records[-1]["loss"] < records[0]["loss"]
    index = json.loads((shards / "index.json").read_text())
    assert _logged(proc.stderr, "data: ") == [
        f"source shards, path {str(shards)!r}, {index['num_tokens']:,} tokens, tokenizer byte (vocab_size 257, "
        "end-of-document id 256)"]
    # issue 44: the export of a run from random weights carries the tokenizer its data was prepared with, in the
    # form transformers loads: the same ids as the byte tokenizer, and 256 as the end of a document
    from transformers import AutoTokenizer

    from training.data.tokenizer import ByteTokenizer

    tokenizer = AutoTokenizer.from_pretrained(str(tmp_path / "ckpt" / "hf"))
    text = "the quick brown fox, déjà vu — 日本\n"
    assert tokenizer(text, add_special_tokens=False)["input_ids"] == ByteTokenizer().encode_batch([text])[0]
    assert (tokenizer.eos_token, tokenizer.eos_token_id, len(tokenizer)) == ("<|end_of_text|>", 256, 257)
    assert tokenizer.decode(ByteTokenizer().encode_batch([text])[0]) == text


def test_train_leaves_no_model_for_interpreter_shutdown_to_collect():
    # The FSDP2 model lives on in reference cycles after train() returns, holding process groups and gloo
    # work objects; when interpreter shutdown collected them, a rank aborted after its last step (exit -6,
    # "terminate called without an active exception") now and then. train() collects them before it returns.
    script = (
        "import gc\n"
        "from training.config import load_config\n"
        "from training.model import Transformer\n"
        "from training.train import train\n"
        "train(load_config(None, ['run.steps=2', 'run.seq_len=16', 'metrics.progress=false']), resume='none')\n"
        "print('models alive:', sum(isinstance(o, Transformer) for o in gc.get_objects()))\n"
    )
    proc = subprocess.run([sys.executable, "-c", script], cwd=REPO, capture_output=True, text=True, timeout=300,
                          env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    assert proc.stdout.splitlines()[-1] == "models alive: 0"


# What `python -m training` runs: cli(), then the process's threads, as the interpreter's shutdown would find them.
THREADS_AFTER_CLI = (
    "import gc, os, sys\n"
    "from training.__main__ import cli\n"
    "code = cli(sys.argv[1:])\n"
    "threads = sorted(open(f'/proc/self/task/{t}/comm').read().strip() for t in os.listdir('/proc/self/task'))\n"
    "print('frozen', gc.get_freeze_count(), 'tracked', len(gc.get_objects()), file=sys.stderr)\n"
    "print('exit', code, 'threads', ','.join(threads))\n"
)


def run_to_exit(*args: str) -> tuple[subprocess.CompletedProcess, str]:
    proc = subprocess.run([sys.executable, "-c", THREADS_AFTER_CLI, *args], cwd=REPO, capture_output=True,
                          text=True, timeout=300, env={**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"})
    assert proc.returncode == 0, proc.stderr[-3000:]
    return proc, proc.stdout.splitlines()[-1]


def test_a_config_error_after_the_model_is_built_leaves_no_thread_for_interpreter_shutdown(tmp_path):
    # The exit -6 seen after a config error ("terminate called without an active exception"): a gloo worker
    # still finishing the last collective's work object dropped a tensor during interpreter shutdown, needed
    # the GIL, and Python ended the thread inside a C++ destructor. The process group outlived the error: the
    # FSDP2 model's device mesh holds it (and DTensor's sharding cache holds the mesh) after
    # destroy_process_group. A missing weights file is found after the model is built.
    model_dir = save_tiny_llama("llama3_0", tmp_path / "hf")
    sorted(model_dir.glob("*.safetensors"))[-1].unlink()
    proc, last = run_to_exit("--set", f"init.hf_dir={model_dir}", "--set", "model.preset=", "--set", "run.steps=1",
                             "--set", f"checkpoint.dir={tmp_path / 'ckpt'}")
    assert "config error: " in proc.stderr and "not in " in proc.stderr
    assert last == "exit 2 threads python"  # no TCPStore server, no gloo loop or worker left running


def test_a_finished_run_leaves_no_thread_for_interpreter_shutdown(tmp_path):
    proc, last = run_to_exit("--set", "run.steps=2", "--set", "run.seq_len=16", "--set", "metrics.progress=false",
                             "--set", f"checkpoint.dir={tmp_path}")
    assert last == "exit 0 threads python"
    # what the imports built was frozen before training (gc.freeze): most of the heap, which no collection
    # walked during the run, while the model's cycles, built after, were still collected (no thread left)
    frozen, tracked = map(int, re.search(r"^frozen (\d+) tracked (\d+)$", proc.stderr, re.M).groups())
    assert frozen > tracked > 0, proc.stderr[-2000:]
