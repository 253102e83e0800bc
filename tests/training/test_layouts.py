"""The layouts on the CPU (gloo, 4 ranks, float32): FSDP 4, HSDP 2 x 2, TP 2 x FSDP 2 and HSDP 2 x TP 2 train
the same run to the same losses, and a checkpoint saved under one layout resumes under another; under TP 2 x
FSDP 2, FP8 (torchao, emulated) with activation checkpointing resumes bit-exact, and a Hugging Face model is
imported (each rank its slices) and exported back; the held-out loss is the same under TP; a stop (SIGTERM)
under TP saves a checkpoint that resumes bit-exact; and under HSDP the local tier sends no replica of a shard
whose twin in the other replica group, on another node, saved the same state, and resumes a lost node's ranks
from those twins. One job of 4 ranks runs them all in turn (tests/training/layouts_entry.py): a start of 4 ranks
costs more CPU than the steps."""

from __future__ import annotations

import json
import math

import numpy as np
import pytest
import torch
import torch.nn.functional as F
from torchrun_support import run_ranks

from tests.hf_support import VOCAB, hf_logits, read_safetensors_dir, save_tiny_llama
from training.data.shards import ShardWriter
from training.hf.export import export_checkpoint

pytestmark = [pytest.mark.slow, pytest.mark.usefixtures("one_torch_thread")]

REL_TOL = 1e-5  # the bound: the same samples, summed in another order


@pytest.fixture(scope="module")
def report(tmp_path_factory) -> dict:
    root = tmp_path_factory.mktemp("layouts")
    # tied embeddings and llama3 RoPE scaling (Llama 3.2's kind): a tied output head sharded by vocabulary
    hf_dir = save_tiny_llama("llama3_2", root / "hf-model")
    torch.save(torch.randint(0, VOCAB, (2, 17), generator=torch.Generator().manual_seed(1)), root / "hf-tokens.pt")
    (root / "held-out").mkdir()
    held_out = ShardWriter(root / "held-out", vocab_size=257, eos_id=256, tokenizer={"kind": "byte"},
                           shard_size_tokens=1000)
    for i in range(6):  # 15 of the 140 windows of 17 tokens (layouts_entry.HELD_OUT_WINDOWS)
        held_out.add_document(np.frombuffer(f"held-out document {i}: ".encode() * 20, dtype=np.uint8)[:400])
    held_out.finish()
    run = run_ranks([["tests/training/layouts_entry.py", str(root), str(hf_dir)]] * 4)
    assert run.returncode == 0, run.output[-3000:]
    line = next(line for line in run.output.splitlines() if line.startswith('{"layouts"'))
    return {**json.loads(line), "root": root, "hf_dir": hf_dir}


def _close(a: list[float], b: list[float]) -> bool:
    return len(a) == len(b) and all(abs(x - y) <= REL_TOL * abs(y) for x, y in zip(a, b, strict=True))


def test_every_layout_trains_to_the_losses_of_fsdp(report):
    runs = {name: run["losses"] for name, run in report["layouts"].items()}
    assert sorted(runs) == ["FSDP 4", "HSDP 2 x 2", "TP 2 x FSDP 2", "TP 2 x HSDP 2 x 1"]
    # micro-batches per step: the global batch over the data-parallel ranks (TP 2 x HSDP 2 x 1 takes its 4 samples
    # per rank in one micro-batch of 4, the others in micro-batches of 2): the same samples, split otherwise
    assert {name: run["accumulated"] for name, run in report["layouts"].items()} == {
        "FSDP 4": 1, "HSDP 2 x 2": 1, "TP 2 x FSDP 2": 2, "TP 2 x HSDP 2 x 1": 1}
    fsdp = runs["FSDP 4"]
    assert len(fsdp) == 20 and fsdp[-1] < fsdp[0] - 0.2  # it learns: equal losses of a still run prove little
    for name, losses in runs.items():
        assert _close(losses, fsdp), name


def test_a_checkpoint_of_fsdp_resumes_exactly_under_hsdp_and_tp(report):
    after_save = report["layouts"]["FSDP 4"]["losses"][10:]
    for name in ("HSDP 2 x 2", "TP 2 x FSDP 2"):
        resumed = report["resumed"][name]
        assert resumed["exact"] is True, name  # every parameter, gathered, equal to the one saved
        assert _close(resumed["losses"], after_save), name


def test_tied_embeddings_stay_one_parameter_under_tp(report):
    tied = report["tied"]
    assert tied["FSDP 4"]["tied"] is True and tied["TP 2 x FSDP 2"]["tied"] is True
    assert _close(tied["TP 2 x FSDP 2"]["losses"], tied["FSDP 4"]["losses"])
    assert tied["FSDP 4"]["losses"] != report["layouts"]["FSDP 4"]["losses"][:3]  # the tied model is another one


def test_fp8_with_activation_checkpointing_resumes_bit_exact_under_tp(report):
    straight, resumed = report["fp8"]["straight"], report["fp8"]["resumed"]
    # the block is checkpointed, its linears torchao's Float8Linear split over tp (rowwise scaling: the plain
    # styles; tensorwise's Float8 styles need a GPU, below)
    assert straight["checkpointed"] is True and straight["wq"] == "Float8Linear"
    assert straight["wq_tp_placements"] == ["_S(0, 2)", "S(0)"]  # FSDP's rows of TP's rows: a 2-D shard
    # the checkpoint resumed is the one a stop saved: rank 1 alone got the SIGTERM, every rank stopped with it
    assert report["fp8"]["stopped"]["stopped_at"] == 2 and report["fp8"]["stopped"]["losses"] == straight["losses"][:2]
    assert "stopped_at" not in straight
    assert resumed["exact"] is True
    assert resumed["losses"] == straight["losses"][2:]  # bit for bit: the same layout, the same sums
    # step 1's loss is the initial weights' (the schedule does not matter yet): near the float32 run's, not
    # equal to it, so the matmuls did go through the FP8 casts
    fp32_first, fp8_first = report["layouts"]["TP 2 x FSDP 2"]["losses"][0], straight["losses"][0]
    assert fp8_first != fp32_first and abs(fp8_first - fp32_first) <= 1e-2 * fp32_first


def test_tensorwise_fp8_under_tp_is_refused_on_the_cpu_in_one_line(report):
    assert report["fp8"]["tensorwise_refused"] == (
        "fp8.torchao_recipe='tensorwise': with parallel.tp=2 on the CPU its Float8 styles all-gather FP8 tensors, "
        "which gloo cannot; allowed: fp8.torchao_recipe='rowwise' (the plain styles), or a GPU")


def test_a_hugging_face_model_imports_under_tp_with_its_logits_and_loss(report):
    hf = report["hf"]
    assert hf["imported"] is True and hf["matrices_quartered"] is True and hf["tied"] is True
    tokens = torch.load(report["root"] / "hf-tokens.pt")
    theirs = hf_logits(report["hf_dir"], tokens[:, :-1])
    torch.testing.assert_close(torch.load(report["root"] / "hf-logits.pt"), theirs, rtol=0, atol=2e-5)
    expected_loss = F.cross_entropy(theirs.flatten(0, 1), tokens[:, 1:].flatten()).item()
    assert hf["loss"] == pytest.approx(expected_loss, rel=1e-5)


def test_a_model_imported_under_tp_exports_back_bit_for_bit(report, tmp_path):
    export_checkpoint(report["root"] / "hf" / "step-0", tmp_path / "out")
    original, exported = read_safetensors_dir(report["hf_dir"]), read_safetensors_dir(tmp_path / "out")
    assert sorted(exported) == sorted(original)
    for name, tensor in original.items():
        assert torch.equal(exported[name], tensor), name


def test_every_layout_scores_the_same_held_out_windows_to_the_loss_of_fsdp(report):
    # 15 windows over 4 or 2 data-parallel ranks, in each layout's own micro-batch (4 under TP 2 x HSDP 2 x 1):
    # the same windows, each scored once, padded ranks scoring nothing, and the same mean within float tolerance
    held_out = {name: run["then"] for name, run in report["layouts"].items() if "then" in run}
    assert sorted(held_out) == ["FSDP 4", "HSDP 2 x 2", "TP 2 x FSDP 2", "TP 2 x HSDP 2 x 1"]
    fsdp = held_out["FSDP 4"]
    assert len(fsdp["windows"]) == 15 and fsdp["scored"] == 15
    assert math.isfinite(fsdp["loss"]) and fsdp["loss"] != report["layouts"]["FSDP 4"]["losses"][-1]  # other samples
    for name, run in held_out.items():
        assert (run["windows"], run["scored"]) == (fsdp["windows"], 15), name
        assert _close([run["loss"]], [fsdp["loss"]]), name


def test_under_hsdp_the_local_tier_uses_the_other_replica_groups_copy(report):
    """Two "nodes" of 2 ranks, one HSDP replica group each: rank r and rank r + 2 hold the same slices."""
    saved = [rank["saved"] for rank in report["local_twins"]]
    assert [s["same_state_as"] for s in saved] == [[2], [3], [0], [1]]  # compared at the save, bit for bit
    assert all(s["counted"] == [2] for s in saved)
    # each node holds its own ranks' shards only: no replica was sent, the other group's shards are the copy
    assert [s["held"] for s in saved] == [{"2": [0, 1]}] * 2 + [{"2": [2, 3]}] * 2
    # node 1 lost: its ranks load node 0's shards of the same state, fetched once each, exactly
    resumed = [rank["resumed"] for rank in report["local_twins"]]
    assert [(r["step"], r["fetched"], r["exact"]) for r in resumed] == [(2, 2, True)] * 4
    assert [r["path"] for r in resumed] == ["node0/step-2/rank-0", "node0/step-2/rank-1",
                                            "node1/step-2/rank-0", "node1/step-2/rank-1"]


def test_per_block_compile_under_tp_gives_every_parameter_the_eager_gradient(report):
    # Without the embedding output's copy (training.parallel.parallelize.maybe_fresh_embedding_output), the
    # compiled block returned no gradient for its input: tok_embeddings.weight's relative difference was 1.0
    differences = report["compiled_tp"]
    assert "tok_embeddings.weight" in differences and "layers.0.attention.wq.weight" in differences
    assert max(differences.values()) < 1e-5, differences
