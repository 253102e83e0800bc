"""The local checkpoint tier (training/checkpoint/local_tier.py, local_resume.py), on two "nodes": two torchrun
agents with one CPU rank each and a checkpoint.local_dir of their own, as on a cluster.

One straight run of 16 steps saves local steps every 4 (8 and 12 kept) and durable ones every 8; each resume
below starts from a copy of what it left, with something taken away or damaged, and must continue bit for bit
like the straight run from the step it chose, or fall back as the tier promises. Every run trains with
torchao's FP8 (emulated on the CPU) and its FP8 all-gather: the weights the local tier saves are the
high-precision tensors inside torchao's wrapper subclass (training/checkpoint/state.py).
"""

from __future__ import annotations

import json
import logging
import shutil
from pathlib import Path

import pytest
import torch
from torchrun_support import run_as_nodes

from training.checkpoint.local_layout import (
    SHARD_MARKER,
    ShardInfo,
    digest_files,
    inventory,
    partial_dir,
    remove_steps,
    shard_dir,
    verify_shard,
    write_shard_marker,
)
from training.checkpoint.local_resume import choose_local_resume, load_local
from training.checkpoint.local_tier import LocalCheckpointer
from training.config import load_config
from training.errors import ConfigError

pytestmark = pytest.mark.slow

STEPS = 16
LOCAL_INTERVAL = 4
FP8 = ["fp8.backend=torchao", "fp8.emulate=true", "fp8.torchao_recipe=tensorwise", "fp8.fsdp_float8_all_gather=true"]
COMMON = [*FP8, f"run.steps={STEPS}", f"checkpoint.local_interval_steps={LOCAL_INTERVAL}",
          "checkpoint.interval_steps=8", "checkpoint.keep_last=100", "checkpoint.async_save=false"]


def run_on_two_nodes(base: Path, durable: str = "durable"):
    return run_as_nodes([COMMON + [f"checkpoint.dir={base / durable}", f"checkpoint.local_dir={base / f'node{k}'}"]
                           for k in range(2)])


@pytest.fixture(scope="module")
def straight(tmp_path_factory):
    """The straight run and the directory it left (node0/, node1/: local tiers; durable/)."""
    base = tmp_path_factory.mktemp("straight")
    run = run_on_two_nodes(base)
    assert run.returncode == 0, run.output[-3000:]
    assert sorted(run.losses) == list(range(1, STEPS + 1))
    return base, run


@pytest.fixture()
def copy_of(straight, tmp_path):
    base, _ = straight
    shutil.copytree(base, tmp_path / "run")
    shutil.rmtree(tmp_path / "run" / "durable")  # each test says what the durable tier holds
    return tmp_path / "run"


def resume(base: Path):
    run = run_on_two_nodes(base, durable="durable")
    assert run.returncode == 0, run.output[-3000:]
    return run, run.resumes[0]


def assert_continues_straight(run, straight_run, step: int) -> None:
    after = {s: v for s, v in straight_run.losses.items() if s > step}
    assert run.losses == after  # bit for bit, every step from the resumed one to the end


def test_the_straight_run_keeps_the_newest_two_local_steps_with_each_shard_on_two_nodes(straight):
    base, run = straight
    for node in ("node0", "node1"):
        held = inventory(base / node)
        assert sorted(held) == [8, 12]  # step 4 pruned once 12 counted (checkpoint.local_keep=2)
        assert all(sorted(shards) == [0, 1] for shards in held.values())  # its own shard and the replica
    own, replica = shard_dir(base / "node0", 12, 0), shard_dir(base / "node1", 12, 0)
    assert (own / "__0_0.distcp").read_bytes() == (replica / "__0_0.distcp").read_bytes()
    assert "local checkpoint step 12 complete on every rank" in run.output


def test_a_lost_node_with_a_corrupt_replica_resumes_from_an_older_step_fetched_from_its_replica(straight, copy_of):
    shutil.rmtree(copy_of / "node1")  # the node is gone; the new one starts empty
    damaged = shard_dir(copy_of / "node0", 12, 1) / "__0_0.distcp"
    data = bytearray(damaged.read_bytes())
    data[len(data) // 2] ^= 0x01
    damaged.write_bytes(bytes(data))
    run, line = resume(copy_of)
    assert "the copy of rank 1's shard on this node failed verification" in run.output
    assert "sha256 differs from its marker" in run.output
    assert (line["tier"], line["step"], line["fetched"]) == ("local", 8, 1)
    assert "local checkpoint step 8: 1 shard(s) fetched from another node: rank 1 from rank 0" in run.output
    assert_continues_straight(run, straight[1], 8)
    fetched = shard_dir(copy_of / "node1", 8, 1)  # the new node keeps the copy it received, verified
    assert verify_shard(fetched, ShardInfo.from_json((fetched / SHARD_MARKER).read_text())) is None


def test_a_step_missing_a_shard_and_its_replica_is_never_chosen(straight, copy_of):
    for node in ("node0", "node1"):
        shutil.rmtree(shard_dir(copy_of / node, 12, 1))
    run, line = resume(copy_of)
    assert (line["tier"], line["step"], line["fetched"]) == ("local", 8, 0)
    assert_continues_straight(run, straight[1], 8)
    # the incomplete step went at the resume; the run then saved a whole step 12 of its own
    assert "local checkpoint: deleted steps [12] on this node (not the one resumed from)" in run.output
    assert {step: sorted(shards) for step, shards in inventory(copy_of / "node0").items()} == {8: [0, 1], 12: [0, 1]}


def test_with_the_local_tier_gone_the_durable_tier_is_used(straight, copy_of):
    base, straight_run = straight
    shutil.copytree(base / "durable" / "step-8", copy_of / "durable" / "step-8")
    for node in ("node0", "node1"):
        shutil.rmtree(copy_of / node)
    run, line = resume(copy_of)
    assert (line["tier"], line["step"]) == ("durable", 8) and "fetched" not in line
    assert_continues_straight(run, straight_run, 8)


# -- the choice and the layout, in one process -------------------------------------------------------------


def write_shard(root: Path, step: int, rank: int, payload: bytes = b"shard bytes", world_size: int = 2,
                layout: dict[str, int] | None = None) -> Path:
    partial = partial_dir(root, step, rank)
    partial.mkdir(parents=True)
    (partial / "__0_0.distcp").write_bytes(payload)
    (partial / ".metadata").write_bytes(b"meta")
    write_shard_marker(partial, ShardInfo(step=step, rank=rank, world_size=world_size,
                                          files=digest_files(partial), layout=layout))
    final = shard_dir(root, step, rank)
    partial.rename(final)
    return final


def test_inventory_lists_published_shards_only(tmp_path):
    write_shard(tmp_path, 4, 0)
    write_shard(tmp_path, 4, 1)
    partial_dir(tmp_path, 8, 0).mkdir(parents=True)  # a save that did not finish
    misplaced = write_shard(tmp_path, 8, 1)
    marker = json.loads((misplaced / SHARD_MARKER).read_text())
    (misplaced / SHARD_MARKER).write_text(json.dumps({**marker, "rank": 0}))  # says it is another rank's
    (shard_dir(tmp_path, 8, 1).parent / "rank-3").mkdir()  # no marker
    held = inventory(tmp_path)
    assert {step: sorted(shards) for step, shards in held.items()} == {4: [0, 1]}


def test_verify_shard_names_a_missing_file_and_changed_bytes(tmp_path):
    path = write_shard(tmp_path, 4, 0)
    info = ShardInfo.from_json((path / SHARD_MARKER).read_text())
    assert verify_shard(path, info) is None
    (path / "__0_0.distcp").write_bytes(b"shard bytez")
    assert verify_shard(path, info) == f"{path / '__0_0.distcp'}: sha256 differs from its marker"
    (path / ".metadata").unlink()
    assert "missing ['.metadata']" in verify_shard(path, info)


def test_remove_steps_keeps_what_it_is_told(tmp_path):
    for step in (4, 8, 12, 16):
        write_shard(tmp_path, step, 0)
    assert remove_steps(tmp_path, {8, 12}, older_than=8) == [4]
    assert remove_steps(tmp_path, {12}, newer_than=8) == [16]
    assert sorted(inventory(tmp_path)) == [8, 12]


@pytest.mark.parametrize(("item", "message"), [
    ("checkpoint.local_interval_steps=-1", "checkpoint.local_interval_steps=-1: allowed: an integer >= 0"),
    ("checkpoint.local_keep=0", "checkpoint.local_keep=0: allowed: an integer 1-8"),
    ("checkpoint.local_keep=9", "checkpoint.local_keep=9: allowed: an integer 1-8"),
])
def test_bad_local_tier_settings_are_refused(item, message):
    with pytest.raises(ConfigError, match=message.replace("[", r"\[")):
        load_config(None, [item])


def test_the_local_tier_needs_both_a_directory_and_an_interval():
    assert not load_config(None, ["checkpoint.local_interval_steps=5"]).checkpoint.local_tier
    assert not load_config(None, ["checkpoint.local_dir=/scratch/x"]).checkpoint.local_tier
    assert load_config(None, ["checkpoint.local_dir=/scratch/x", "checkpoint.local_interval_steps=5"]
                       ).checkpoint.local_tier


@pytest.fixture()
def one_rank(tmp_path):
    """The local tier of a one-rank run (no process group): the choice without any transfer."""
    cfg = load_config(None, [f"checkpoint.local_dir={tmp_path}", "checkpoint.local_interval_steps=4"]).checkpoint
    local = LocalCheckpointer(cfg, rank=0, world_size=1, local_world_size=1, device=torch.device("cpu"))
    yield local
    local.close()


def test_the_newest_complete_local_step_wins_unless_a_durable_one_is_newer(one_rank, tmp_path):
    for step in (8, 12):
        write_shard(tmp_path, step, 0, world_size=1)
    write_shard(tmp_path, 16, 0, world_size=2)  # another world size: not this run's
    assert choose_local_resume(one_rank, not_older_than=0).step == 12
    assert choose_local_resume(one_rank, not_older_than=12).step == 12  # a tie: the local tier
    assert choose_local_resume(one_rank, not_older_than=13) is None  # the durable step 13+ wins


def test_a_local_step_of_another_layout_is_passed_over_in_one_line(one_rank, tmp_path, caplog):
    """A shard is one rank's slices under one layout: under another layout the run uses an older step of its
    own layout, or none (then the durable tier, which reshards). One rank, so the markers stand in for a
    job's: what counts is the layout they record against the run's."""
    other = {"dp_replicate": 2, "dp_shard": 1, "tp": 1}  # what a shard of HSDP 2 x 1 would record
    write_shard(tmp_path, 8, 0, world_size=1)  # a marker of before layouts: FSDP over its world size
    write_shard(tmp_path, 12, 0, world_size=1, layout=other)
    marker = json.loads((shard_dir(tmp_path, 12, 0) / SHARD_MARKER).read_text())
    assert marker["layout"] == other and ShardInfo.from_json(json.dumps(marker)).layout_degrees == other
    assert one_rank.layout == {"dp_replicate": 1, "dp_shard": 1, "tp": 1}
    assert choose_local_resume(one_rank, not_older_than=0).step == 8
    assert caplog.messages == ["local checkpoint step 12: saved under parallel dp_replicate=2 dp_shard=1 tp=1, "
                               "this run is dp_replicate=1 dp_shard=1 tp=1: not used (a shard holds one layout's "
                               "slices; the durable tier reshards)"]
    caplog.clear()
    assert choose_local_resume(one_rank, not_older_than=9) is None  # none of its layout: the durable tier
    assert len(caplog.messages) == 1 and "step 12: saved under parallel dp_replicate=2" in caplog.text
    write_shard(tmp_path, 16, 0, world_size=1)
    caplog.clear()
    assert choose_local_resume(one_rank, not_older_than=13).step == 16 and caplog.messages == []  # older: not said


def test_a_damaged_local_step_is_passed_over_for_an_older_one(one_rank, tmp_path, caplog):
    write_shard(tmp_path, 8, 0, world_size=1)
    write_shard(tmp_path, 12, 0, payload=b"written", world_size=1)
    (shard_dir(tmp_path, 12, 0) / "__0_0.distcp").write_bytes(b"changed")
    choice = choose_local_resume(one_rank, not_older_than=0)
    assert (choice.step, choice.fetched, choice.path) == (8, 0, shard_dir(tmp_path, 8, 0))
    assert "no verified copy of the shards of ranks [0] on a live node; trying an older step" in caplog.text


def tiny_model_and_optimizer(seed: int) -> tuple[torch.nn.Module, torch.optim.Optimizer]:
    torch.manual_seed(seed)
    model = torch.nn.Sequential(torch.nn.Linear(8, 8), torch.nn.Linear(8, 2))
    optimizer = torch.optim.AdamW(model.parameters(), lr=1e-2)
    model(torch.randn(4, 8)).sum().backward()
    optimizer.step()
    return model, optimizer


@pytest.mark.parametrize("staging", ["background", "inline"])
def test_a_local_save_in_one_process_loads_back_bit_exact(staging, tmp_path, monkeypatch, caplog):
    caplog.set_level(logging.INFO, logger="training.checkpoint")
    if staging == "inline":  # a torch without DCP's staging API: described and copied on the loop's thread
        monkeypatch.setattr("training.checkpoint.local_tier.staging_api_available", lambda: False)
    cfg = load_config(None, [f"checkpoint.local_dir={tmp_path}", "checkpoint.local_interval_steps=4"]).checkpoint
    local = LocalCheckpointer(cfg, rank=0, world_size=1, local_world_size=1, device=torch.device("cpu"))
    model, optimizer = tiny_model_and_optimizer(seed=0)
    try:
        local.save(4, model, optimizer)
        local.wait_for_staging()
        model(torch.randn(4, 8)).sum().backward()
        optimizer.step()  # the loop goes on: what was saved is the state at step 4
        local.wait()
        assert local.counted == [4]
        assert "local checkpoint step 4 complete on every rank" in caplog.text
        fresh, fresh_optimizer = tiny_model_and_optimizer(seed=1)
        load_local(choose_local_resume(local, not_older_than=0), fresh, fresh_optimizer)
    finally:
        local.close()
    model, optimizer = tiny_model_and_optimizer(seed=0)  # the state at step 4 again
    for a, b in zip(model.parameters(), fresh.parameters(), strict=True):
        assert torch.equal(a, b)
    for a, b in zip(optimizer.state.values(), fresh_optimizer.state.values(), strict=True):
        assert all(torch.equal(a[k], b[k]) for k in ("exp_avg", "exp_avg_sq", "step"))


def test_a_local_save_that_cannot_be_written_is_logged_and_not_counted(tmp_path, caplog):
    not_a_dir = tmp_path / "scratch-file"
    not_a_dir.write_text("")
    cfg = load_config(None, [f"checkpoint.local_dir={not_a_dir}", "checkpoint.local_interval_steps=4"]).checkpoint
    local = LocalCheckpointer(cfg, rank=0, world_size=1, local_world_size=1, device=torch.device("cpu"))
    model, optimizer = tiny_model_and_optimizer(seed=0)
    try:
        local.save(4, model, optimizer)
        local.wait()  # training goes on: the durable tier is the source of truth
        assert local.counted == [] and local.enabled
        assert "local checkpoint step 4: rank 0's shard not saved: " in caplog.text
        assert "local checkpoint step 4 is incomplete (a shard or a replica failed): not counted" in caplog.text
    finally:
        local.close()


def test_a_receiver_that_cannot_write_still_takes_every_chunk_and_keeps_nothing(tmp_path, caplog):
    from training.checkpoint.shard_transfer import _chunk_sizes, _Incoming, _outgoing

    sent = write_shard(tmp_path / "sender", 4, 1)
    outgoing = _outgoing(sent)
    blocked = tmp_path / "full-disk"
    blocked.write_text("")  # a file where the receiver's directory would go: every write fails
    incoming = _Incoming(blocked, outgoing.header)
    assert incoming.problem is not None and incoming.problem.startswith(f"cannot write {blocked}/step-4/rank-1")
    sizes = _chunk_sizes(incoming.sizes)
    assert [size for _, size in sizes] == [4, 11]  # .metadata, __0_0.distcp: what the sender sends, in order
    for index, size in sizes:
        incoming.write(index, torch.zeros(size, dtype=torch.uint8))  # taken, not written
    assert incoming.finish() is None
    assert "the shard of rank 1 step 4 received here is not kept: cannot write" in caplog.text


def test_a_sender_whose_file_vanished_sends_zeros_the_digest_refuses(tmp_path, caplog):
    from training.checkpoint.shard_transfer import _chunks, _Incoming, _outgoing

    sent = write_shard(tmp_path / "sender", 4, 1)
    outgoing = _outgoing(sent)
    (sent / "__0_0.distcp").unlink()  # gone after the header was built
    incoming = _Incoming(tmp_path / "receiver", outgoing.header)
    for index, chunk in _chunks(outgoing.files):
        incoming.write(index, torch.frombuffer(bytearray(chunk), dtype=torch.uint8))
    assert incoming.finish() is None
    assert "cannot read" in caplog.text and "sha256 differs from its marker" in caplog.text
    assert inventory(tmp_path / "receiver") == {}


def test_a_failure_of_the_tiers_group_turns_the_tier_off_and_training_goes_on(one_rank, tmp_path, monkeypatch,
                                                                             caplog):
    def lost_peer(ok):
        raise RuntimeError("Connection closed by peer")

    monkeypatch.setattr(one_rank, "agree", lost_peer)  # the all-reduce that counts a step
    model, optimizer = tiny_model_and_optimizer(seed=0)
    one_rank.save(4, model, optimizer)
    one_rank.wait()
    assert not one_rank.enabled and one_rank.counted == []
    assert ("local checkpoint tier off for the rest of this run: RuntimeError: Connection closed by peer"
            in caplog.text)
    one_rank.save(8, model, optimizer)  # no more local saves
    assert 8 not in inventory(tmp_path) and not partial_dir(tmp_path, 8, 0).exists()


def test_an_interval_without_a_directory_says_there_is_no_local_tier(caplog):
    cfg = load_config(None, ["checkpoint.local_interval_steps=5"]).checkpoint
    local = LocalCheckpointer(cfg, rank=0, world_size=1, local_world_size=1, device=torch.device("cpu"))
    assert not local.enabled and not local.should_save(5)
    assert "checkpoint.local_interval_steps=5 but checkpoint.local_dir is '': no local tier" in caplog.text
