"""The local tier's use of the copies HSDP already holds (training/checkpoint/local_twins.py and the fetch plan of
local_resume.py), in one process on fake multi-node layouts; the whole save and resume under HSDP 2 x 2 on two
"nodes" runs in the 4-rank layouts job (tests/training/test_layouts.py)."""

from __future__ import annotations

import json

from training.checkpoint.local_layout import ShardInfo
from training.checkpoint.local_resume import plan_fetches
from training.checkpoint.local_twins import content_key, held_elsewhere, same_state

A, B, C, D = "a" * 64, "b" * 64, "c" * 64, "d" * 64


def test_the_key_is_the_state_not_dcps_per_save_metadata():
    files = {".metadata": "1" * 64, "__0_0.distcp": "2" * 64}
    twin = {**files, ".metadata": "3" * 64}  # another directory and save id: another .metadata
    assert content_key(files, "entries") == content_key(twin, "entries")
    assert content_key(files, "entries") != content_key({**files, "__0_0.distcp": "4" * 64}, "entries")
    assert content_key(files, "entries") != content_key(files, "other entries")


def test_hsdp_2_x_2_on_two_nodes_needs_no_replica():
    """Ranks 0-1 on node 0 and 2-3 on node 1, one replica group each: rank r's twin is r + 2, on the other node."""
    keys = [A, B, A, B]
    assert same_state(keys) == [(2,), (3,), (0,), (1,)]
    assert held_elsewhere(keys, ranks_per_node=2) == [True] * 4


def test_twins_on_the_same_node_are_no_copy_off_it():
    """HSDP 2 x 2 inside each node of 4 ranks: a node's loss takes both twins, so every rank needs its replica."""
    keys = [A, B, A, B, C, D, C, D]
    assert same_state(keys)[0] == (2,)
    assert held_elsewhere(keys, ranks_per_node=4) == [False] * 8


def test_a_drifted_replica_or_a_failed_save_gets_its_ring_replica():
    """HSDP 2 x 2 on two nodes as above; only a twin that saved the very same state stands in for a rank."""
    drifted = [A, B, A, C]  # rank 3's state is not rank 1's
    assert held_elsewhere(drifted, ranks_per_node=2) == [True, False, True, False]
    failed = [A, B, None, B]  # rank 2's save failed: rank 0 has no copy off its node
    assert same_state(failed)[2] == () and held_elsewhere(failed, ranks_per_node=2) == [False, True, False, True]


def test_fsdp_and_tp_have_no_twins():
    assert held_elsewhere([A, B, C, D], ranks_per_node=2) == [False] * 4


def test_a_lost_node_is_resumed_from_its_twins_and_each_directory_travels_once_per_node():
    """HSDP 2 x 2 on two nodes, node 1 lost: node 0 holds shards 0 and 1, which also serve ranks 2 and 3."""
    copies = {0: {(0, 0)}, 1: {(0, 1)}, 2: {(0, 0)}, 3: {(0, 1)}}
    transfers, loads = plan_fetches(copies, world_size=4, ranks_per_node=2)
    assert transfers == [(2, 0, 0), (3, 1, 1)]  # (receiver, sender, the directory's rank)
    assert loads == [0, 1, 0, 1]
    # HSDP 4 x 1, two ranks a node: all four hold the same state; the new node 1 receives shard 0 once
    everywhere = {(0, 0), (0, 1)}
    transfers, loads = plan_fetches({r: everywhere for r in range(4)}, world_size=4, ranks_per_node=2)
    assert transfers == [(2, 0, 0)] and loads == [0, 1, 0, 0]


def test_a_ranks_own_shard_is_preferred_to_a_twins():
    copies = {0: {(0, 0)}, 1: {(0, 1)}, 2: {(0, 0), (0, 2)}, 3: {(0, 1)}}  # a ring replica of 2 on node 0 too
    transfers, loads = plan_fetches(copies, world_size=4, ranks_per_node=2)
    assert transfers == [(2, 0, 2), (3, 1, 1)] and loads == [0, 1, 2, 1]
    # a twin's shard on a rank's own node needs no transfer at all
    assert plan_fetches({0: {(0, 0)}, 1: {(0, 0)}}, world_size=2, ranks_per_node=2) == ([], [0, 0])


def test_the_marker_says_whose_state_it_also_is():
    info = ShardInfo(step=4, rank=0, world_size=4, files={"__0_0.distcp": A}, same_state_as=(2,))
    back = ShardInfo.from_json(info.to_json())
    assert back.same_state_as == (2,) and back.serves == (0, 2)
    older = json.loads(info.to_json())
    del older["same_state_as"]  # a marker written before twins: it serves its own rank only
    assert ShardInfo.from_json(json.dumps(older)).serves == (0,)
