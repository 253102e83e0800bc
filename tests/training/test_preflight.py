"""Start-up checks (training/preflight.py) and the loader's id check: a bad checkpoint directory or token ids
past the vocabulary fail at start-up, with one line, not at the first save or as a device-side assert."""

from __future__ import annotations

import os
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pytest

from training import preflight
from training.checkpoint.resume import resume_with_fallback
from training.config import load_config
from training.data.batches import build_batch_source
from training.data.shards import ShardWriter, open_shards
from training.errors import ConfigError
from training.preflight import check_checkpoint_dir, run_preflight, sample_ranges, sampled_shards

REPO = Path(__file__).resolve().parents[2]


def run_cli(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "PYTHONPATH": str(REPO), "OMP_NUM_THREADS": "1"}
    for name in ("RANK", "LOCAL_RANK", "WORLD_SIZE", "MASTER_ADDR", "MASTER_PORT"):
        env.pop(name, None)
    return subprocess.run([sys.executable, "-m", "training", *args], cwd=REPO, env=env, text=True,
                          capture_output=True, timeout=180)


def write_shards(directory: Path, num_tokens: int, *, shard_size_tokens: int, vocab_size: int = 257) -> Path:
    directory.mkdir(parents=True)
    writer = ShardWriter(directory, vocab_size=vocab_size, eos_id=vocab_size - 1, tokenizer={"kind": "test"},
                         shard_size_tokens=shard_size_tokens)
    writer.add_document(np.arange(num_tokens - 1) % (vocab_size - 1))
    writer.finish()
    return directory


def plant_id(directory: Path, shard_file: str, position: int, token_id: int) -> None:
    """What a wrong tokenizer or a corrupt copy leaves: an id past the index's vocab_size."""
    data = np.fromfile(directory / shard_file, dtype="<u2")
    data[position] = token_id
    data.tofile(directory / shard_file)


def shards_config(path: Path, *extra: str):
    return load_config("tiny-cpu", ["data.source=shards", f"data.path={path}", *extra])


# --- checkpoint.dir ------------------------------------------------------------------------------------


def test_a_checkpoint_dir_that_is_a_file_fails_at_start_up_in_one_line(tmp_path):
    file = tmp_path / "ckpt"
    file.write_text("not a directory")
    started = time.monotonic()
    proc = run_cli("--set", f"checkpoint.dir={file}", "--set", "run.steps=1000",
                   "--set", "checkpoint.interval_steps=1000")
    assert proc.returncode == 2, proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"config error: checkpoint.dir={str(file)!r}: exists and is not a directory; allowed: a directory this "
        "job can write"
    )
    assert "Traceback" not in proc.stderr and proc.stdout == ""  # no step ran
    assert time.monotonic() - started < 120  # generous: the point is that it did not train 1000 steps first


def check_as(uid: int | None, directory: str) -> str:
    """check_checkpoint_dir's error in a forked child running as ``uid`` (None: as this process)."""
    read_end, write_end = os.pipe()
    pid = os.fork()
    if pid == 0:  # the child: drop to uid, check, report, and leave without running any test machinery
        message = b"no error"
        try:
            if uid is not None:
                os.setgid(65534)
                os.setuid(uid)
            check_checkpoint_dir(directory)
        except ConfigError as e:
            message = str(e).encode()
        except BaseException as e:  # noqa: BLE001 - reported to the parent, never raised in the child
            message = repr(e).encode()
        os.write(write_end, message)
        os._exit(0)
    os.close(write_end)
    with os.fdopen(read_end, "rb") as f:
        text = f.read().decode()
    os.waitpid(pid, 0)
    return text


def test_a_checkpoint_dir_the_job_cannot_write_is_refused(tmp_path):
    # A directory its owner keeps to itself, checked by another user: nobody (65534) when the tests run as
    # root (root may write anywhere), else the test's own user after chmod 0555.
    base = Path(tempfile.mkdtemp(prefix="ckpt-"))
    try:
        base.chmod(0o755)
        target = base / "job"
        target.mkdir(mode=0o555)
        uid = 65534 if os.geteuid() == 0 else os.geteuid()
        message = check_as(65534 if os.geteuid() == 0 else None, str(target / "sub"))
        assert message == (
            f"checkpoint.dir={str(target / 'sub')!r}: this job (uid {uid}) cannot write it: Permission "
            f"denied ({target / 'sub'}); allowed: a directory this job can write"
        )
    finally:
        (base / "job").chmod(0o755)
        for path in sorted(base.rglob("*"), reverse=True):
            path.rmdir()
        base.rmdir()


def test_a_missing_checkpoint_dir_is_created_and_left_clean(tmp_path):
    target = tmp_path / "a" / "b"
    check_checkpoint_dir(str(target))
    assert target.is_dir() and list(target.iterdir()) == []


# --- token ids -----------------------------------------------------------------------------------------


def test_an_id_past_the_vocabulary_in_a_shard_fails_at_start_up(tmp_path):
    shards = write_shards(tmp_path / "shards", 3000, shard_size_tokens=1000)
    plant_id(shards, "shard-00001.bin", 321, 4000)
    with pytest.raises(ConfigError, match=r"token id 4000 at position 321 of shard-00001.bin; allowed: ids "
                                          r"below the index's vocab_size=257"):
        run_preflight(shards_config(shards), rank=0)
    run_preflight(shards_config(shards), rank=1)  # only rank 0 reads the sample


def test_the_index_vocabulary_is_checked_against_the_model_at_start_up(tmp_path):
    shards = write_shards(tmp_path / "shards", 3000, shard_size_tokens=1000, vocab_size=1000)
    with pytest.raises(ConfigError, match=r"^model.vocab_size=320: allowed: >= 1000, the vocab_size of the "):
        run_preflight(shards_config(shards), rank=3)


def test_the_sample_is_bounded_and_reaches_every_part_of_a_shard():
    assert sample_ranges(100) == [(0, 100)]
    assert sample_ranges(10**9) == [(0, 4096), ((10**9 - 4096) // 2, 4096), (10**9 - 4096, 4096)]
    picked = sampled_shards(100_000)
    assert len(picked) == preflight.SAMPLE_SHARDS_MAX and picked[0] == 0 and picked[-1] == 99_999
    assert sampled_shards(5) == [0, 1, 2, 3, 4]


def test_an_id_the_sample_misses_is_caught_by_the_loader_before_the_model(tmp_path):
    # 40,000 tokens in one shard: the sample reads 3 x 4096 of them; the bad id sits between its chunks.
    shards = write_shards(tmp_path / "shards", 40_000, shard_size_tokens=40_000)
    plant_id(shards, "shard-00000.bin", 10_000, 300)  # below the model's 320 but past the index's 257
    cfg = shards_config(shards, "run.seq_len=64", "run.micro_batch_size=4")
    run_preflight(cfg, rank=0)  # not in the sample
    source = build_batch_source(cfg.data, seq_len=64, vocab_size=cfg.model.vocab_size, seed=0, dp_rank=0,
                                dp_world_size=1, micro_batch_size=4, grad_accum_steps=1)
    window = 10_000 // 64  # the window that holds position 10,000
    with pytest.raises(ConfigError, match=r"token id 300 in the window at stream position \d+; allowed: ids "
                                          r"below the index's vocab_size=257"):
        for step in range(source.num_windows // 4 + 1):  # every window, in the permuted order
            source.get(step, 0)
    assert window < source.num_windows


def test_the_trainer_refuses_such_shards_with_one_line(tmp_path):
    shards = write_shards(tmp_path / "shards", 3000, shard_size_tokens=1000)
    plant_id(shards, "shard-00002.bin", 7, 65000)
    proc = run_cli("--set", "data.source=shards", "--set", f"data.path={shards}", "--set", "run.steps=5")
    assert proc.returncode == 2 and "Traceback" not in proc.stderr
    assert proc.stderr.strip().splitlines()[-1] == (
        f"config error: data.path={str(shards)!r}: token id 65000 at position 7 of shard-00002.bin; allowed: ids "
        "below the index's vocab_size=257 (a shard from another tokenizer, or a corrupt one?)"
    )
    assert open_shards(shards).vocab_size == 257


# --- resuming from another job's directory, on request only -------------------------------------------


def complete_checkpoint(root: Path, step: int) -> Path:
    path = root / f"step-{step}"
    path.mkdir(parents=True)
    (path / ".metadata").write_bytes(b"")
    (path / "train_state.json").write_text(f'{{"step": {step}}}')
    return path


def test_resume_from_another_jobs_directory_only_until_the_job_has_its_own(tmp_path):
    own, other = tmp_path / "j-new", tmp_path / "j-old"
    older = complete_checkpoint(other, 100)
    assert resume_with_fallback("auto", str(own), None) == "auto"  # without the flag: its own only
    assert resume_with_fallback("auto", str(own), str(other)) == str(older)
    complete_checkpoint(own, 120)  # a restart of the new job continues its own saves
    assert resume_with_fallback("auto", str(own), str(other)) == "auto"
    with pytest.raises(ConfigError, match="no complete checkpoint"):
        resume_with_fallback("auto", str(tmp_path / "j-x"), str(tmp_path / "j-empty"))
    with pytest.raises(ConfigError, match="allowed only with --resume auto"):
        resume_with_fallback("none", str(own), str(other))
