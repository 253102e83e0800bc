"""The job user's boundary on a node (issue 31): what root does at a job's start under the scratch and the
checkpoint root follows no link or rename of the job user's, and no job can touch another's state.

The job user is a real second uid (nobody, 65534) where the tests run as root, so every chown is real; as
another user the job user is that user, and the tests still prove that nothing outside is deleted and that
links are refused."""

import json
import os
import shutil
import stat
import subprocess
import tempfile
from pathlib import Path

import pytest
from node_jobs_support import Node, write_user_database

from node_bootstrap import jobs
from node_bootstrap.accounts import read_account

AS_ROOT = os.geteuid() == 0
NOBODY = 65534
JOB = "j-contain-1"
needs_root = pytest.mark.skipif(not AS_ROOT, reason="giving files to another uid needs root")


def job_uid() -> int:
    return NOBODY if AS_ROOT else os.getuid()


def make_node(root: Path) -> Node:
    node = Node(root, "exit")
    write_user_database(root, uid=job_uid(), gid=job_uid() if AS_ROOT else os.getgid())
    return node


def spec(job_id: str = JOB, **kwargs) -> jobs.JobSpec:
    kwargs.setdefault("config", "training/configs/tiny-cpu.toml")
    return jobs.JobSpec(job_id=job_id, nodes=1, gpus_per_node=1, rendezvous_host="10.0.1.17", max_restarts=0,
                        **kwargs)


def prepare(node: Node, job_spec: jobs.JobSpec) -> str:
    """The root-run step of a start on the job's paths, in this process."""
    account = read_account(str(node.root))
    return jobs.prepare_job_paths(node.settings, job_spec, jobs.JobFiles.of(node.settings, job_spec.job_id), account)


def snapshot(top: Path) -> dict[str, tuple]:
    """Every entry under `top` (itself included): its type, owner, group, mode and, for a file, its content."""
    found = {}
    for path in [top, *sorted(top.rglob("*"))]:
        info = path.lstat()
        content = path.read_bytes() if stat.S_ISREG(info.st_mode) else None
        found[str(path.relative_to(top))] = (stat.S_IFMT(info.st_mode), info.st_uid, info.st_gid,
                                              stat.S_IMODE(info.st_mode), content)
    return found


def outside(base: Path, kind: str) -> Path:
    """Where a link of the job user's points: a directory holding files and directories (a stand-in for /, or
    /fsx with every job's checkpoints), or a root-owned directory of code root runs (the bundle's jobs/)."""
    target = base / ("outside-" + kind)
    if kind == "files":
        (target / "j-earlier/step-10").mkdir(parents=True)
        (target / "j-earlier/step-10/.metadata").write_bytes(b"pickled")
        (target / "etc").mkdir()
        (target / "etc/shadow").write_text("root:*:19000::::::\n")
    else:
        target.mkdir()
        (target / "launch.py").write_text("print('root runs this')\n")
    return target


def link_position(node: Node, where: str) -> Path:
    return node.root / where.format(job=JOB)


@pytest.mark.parametrize("kind", ["files", "root-owned"])
@pytest.mark.parametrize("where", [
    "scratch/checkpoints",  # the local tier's holder: every entry but the job's own is deleted
    "scratch/checkpoints/{job}",  # the job's own local checkpoint directory: chowned to the job user
    "fsx/checkpoints/{job}",  # the job's own checkpoint directory on FSx: likewise
])
def test_a_link_on_a_job_path_is_refused_and_nothing_outside_is_deleted_or_chowned(node_factory, tmp_path, kind,
                                                                                   where):
    node = node_factory("exit")
    write_user_database(node.root, uid=job_uid(), gid=job_uid() if AS_ROOT else os.getgid())
    target = outside(tmp_path, kind)
    before = snapshot(target)
    link = link_position(node, where)
    link.parent.mkdir(parents=True, exist_ok=True)
    link.symlink_to(target, target_is_directory=True)

    result = node.start(JOB, check=False)

    assert snapshot(target) == before  # nothing deleted, created, chowned or changed out there
    assert result.returncode == jobs.EXIT_FAILED
    error = json.loads(result.stdout)["error"]
    what = {"scratch/checkpoints": "", "scratch/checkpoints/{job}": "the job's local checkpoint directory ",
            "fsx/checkpoints/{job}": "the job's checkpoint directory "}[where]
    assert error == (f"{what}{link} is a symbolic link (to {str(target)!r}): refused, root follows no link on a "
                     "job's paths")
    assert "\n" not in error and result.stderr == f"error: {error}\n"
    assert link.is_symlink() and not (node.root / "var/lib/cluster/jobs" / JOB).exists()  # nothing started


def test_a_directory_swapped_for_a_link_after_it_was_listed_is_not_followed(tmp_path, monkeypatch):
    """The job user renames <scratch>/checkpoints away and links it to a directory of files between the check
    and the use: the test stages that rename right after the start lists the directory."""
    node = make_node(tmp_path / "root")
    holder = node.root / "scratch/checkpoints"
    (holder / "j-before/step-8").mkdir(parents=True)  # a finished job's local tier on this node
    (holder / "j-before/step-8/shard").write_bytes(b"x")
    target = outside(tmp_path, "files")
    (target / "j-before").mkdir()  # what a deletion by name would hit once the link is in place
    before = snapshot(target)
    holder_inode = holder.stat().st_ino
    real_listdir = os.listdir
    swapped = []

    def listdir_then_swap(path="."):
        names = real_listdir(path)
        if not swapped and os.stat(path).st_ino == holder_inode:
            holder.rename(tmp_path / "renamed-away")
            holder.symlink_to(target, target_is_directory=True)
            swapped.append(path)
        return names

    monkeypatch.setattr(os, "listdir", listdir_then_swap)
    try:
        prepare(node, spec())
    except jobs.JobError:
        pass  # refusing is allowed; following the link is not
    monkeypatch.undo()

    assert swapped, "the start never listed the local checkpoints"
    assert snapshot(target) == before
    assert sorted(p.name for p in (tmp_path / "renamed-away").iterdir()) == [JOB]  # j-before went, there


@needs_root
def test_a_directory_swapped_for_a_link_after_it_was_created_is_not_chowned(tmp_path, monkeypatch):
    """The job's own local checkpoint directory is renamed away and replaced by a link to root-owned code right
    after root created it, before root gives it to the job user."""
    node = make_node(tmp_path / "root")
    (node.root / "scratch/checkpoints").mkdir(parents=True)
    own = node.root / "scratch/checkpoints" / JOB
    target = outside(tmp_path, "root-owned")
    before = snapshot(target)
    real_mkdir = os.mkdir

    def mkdir_then_swap(path, mode=0o777, *, dir_fd=None):
        real_mkdir(path, mode, dir_fd=dir_fd)
        if os.path.basename(path) == JOB and own.is_dir() and not own.is_symlink():
            own.rename(tmp_path / "renamed-away")
            own.symlink_to(target, target_is_directory=True)

    monkeypatch.setattr(os, "mkdir", mkdir_then_swap)
    with pytest.raises(jobs.JobError, match="is a symbolic link"):
        prepare(node, spec())
    monkeypatch.undo()
    assert snapshot(target) == before


@needs_root
def test_a_scratch_the_job_user_could_change_refuses_the_start(tmp_path):
    node = make_node(tmp_path / "root")
    scratch = node.root / "scratch"
    scratch.mkdir()
    os.chown(scratch, NOBODY, NOBODY)  # as a node bootstrapped before issue 31 left it
    with pytest.raises(jobs.JobError) as refused:
        prepare(node, spec())
    assert str(refused.value) == (
        f"{scratch} (owner uid {NOBODY}, mode 0755) may be changed by the job user cluster-job: root acts on job "
        "paths only below directories that only root may change (the jobuser boot step keeps the scratch so; "
        "elsewhere: chown root:root, chmod go-w)")
    assert list(scratch.iterdir()) == []


def run_as_job_user(code: str) -> dict:
    result = subprocess.run(["/usr/bin/python3", "-c", code], user=NOBODY, group=NOBODY, extra_groups=[],
                            capture_output=True, text=True, timeout=60)
    assert result.returncode == 0, result.stderr
    return json.loads(result.stdout)


PROBE = """\
import json, os, sys
top = sys.argv[1] if len(sys.argv) > 1 else {top!r}
def attempt(action):
    try:
        return action() or True
    except OSError:
        return False
print(json.dumps({{
    "create": attempt(lambda: open(os.path.join(top, "planted"), "w").close()),
    "create_inside": attempt(lambda: open(os.path.join(top, "step-10", "planted"), "w").close()),
    "overwrite": attempt(lambda: open(os.path.join(top, "step-10", ".metadata"), "r+b").close()),
    "delete": attempt(lambda: os.unlink(os.path.join(top, "step-10", "shard-0"))),
    "rename": attempt(lambda: os.rename(os.path.join(top, "step-10"), os.path.join(top, "step-11"))),
    "chmod": attempt(lambda: os.chmod(os.path.join(top, "step-10", "private"), 0o666)),
    "read": attempt(lambda: open(os.path.join(top, "step-10", ".metadata"), "rb").read().decode()),
    "read_private": attempt(lambda: open(os.path.join(top, "step-10", "private"), "rb").read().decode()),
}}))
"""


def can_create_in(directory: Path) -> bool:
    return run_as_job_user(f"import json, os\ntry:\n    open(os.path.join({str(directory)!r}, 'probe'), 'w').close()\n"
                           "    print('true')\nexcept OSError:\n    print('false')\n")


def finished_job(checkpoints: Path, job_id: str) -> Path:
    """A job's checkpoint directory as its trainer (the job user) left it."""
    top = checkpoints / job_id
    (top / "step-10").mkdir(parents=True)
    (top / "step-10/.metadata").write_bytes(b"meta")
    (top / "step-10/shard-0").write_bytes(b"shard")
    (top / "step-10/private").write_bytes(b"mine")
    (top / "step-10/private").chmod(0o600)
    (top / "step-10/setuid").write_bytes(b"#!/bin/sh\n")
    (top / "step-10/setuid").chmod(0o4755)
    for path in [top, *top.rglob("*")]:
        os.chown(path, NOBODY, NOBODY)
    (top / "step-10/setuid").chmod(0o4755)  # chown cleared it
    return top


@needs_root
def test_another_jobs_checkpoints_are_read_only_to_the_job_user_after_a_start(tmp_path):
    base = Path(tempfile.mkdtemp(prefix="contain-"))  # traversable by nobody, unlike pytest's tmp_path
    try:
        base.chmod(0o755)
        node = make_node(base / "root")
        checkpoints = node.root / "fsx/checkpoints"
        earlier = finished_job(checkpoints, "j-earlier")
        assert can_create_in(earlier)  # before: any later job could change it

        prepare(node, spec("j-check-1", module=jobs.COMMCHECK_MODULE, config=""))  # its code runs as the user too
        assert earlier.stat().st_uid == 0 and not (checkpoints / "j-check-1").exists()
        prepare(node, spec(resume_from="j-earlier"))

        probe = run_as_job_user(PROBE.format(top=str(earlier)))
        assert probe == {"create": False, "create_inside": False, "overwrite": False, "delete": False,
                         "rename": False, "chmod": False, "read": "meta", "read_private": "mine"}
        for path in [earlier, *earlier.rglob("*")]:
            info = path.lstat()
            assert (info.st_uid, info.st_mode & 0o7022) == (0, 0), path  # root's; no set-id bit, no write
        own = checkpoints / JOB
        assert (own.stat().st_uid, can_create_in(own)) == (NOBODY, True)

        # a later attempt of the sealed job (the keeper restarts it) gets its whole directory back
        prepare(node, spec("j-earlier", attempt=2))
        assert {p.stat().st_uid for p in [earlier, *earlier.rglob("*")]} == {NOBODY}
        assert (checkpoints / JOB).stat().st_uid == 0  # and the other job's is sealed in turn
    finally:
        shutil.rmtree(base)


def test_each_job_starts_with_a_clean_home_of_its_own(tmp_path):
    node = make_node(tmp_path / "root")
    first = Path(prepare(node, spec("j-home-1", module=jobs.COMMCHECK_MODULE, config="")))
    assert first == node.root / "scratch/jobs/j-home-1" and list(first.iterdir()) == []
    # what a job leaves in its home: a user site-packages path hook, caches, a compiled kernel
    (first / ".local/lib/python3.10/site-packages").mkdir(parents=True)
    (first / ".local/lib/python3.10/site-packages/evil.pth").write_text("import os\n")
    (first / "torchinductor_cluster-job").mkdir()
    again = Path(prepare(node, spec("j-home-1", module=jobs.COMMCHECK_MODULE, config="", attempt=2)))
    assert again == first and (first / ".local").is_dir()  # a later attempt of the same job keeps its caches

    second = Path(prepare(node, spec("j-home-2")))
    assert second == node.root / "scratch/jobs/j-home-2" and list(second.iterdir()) == []
    assert sorted(p.name for p in (node.root / "scratch/jobs").iterdir()) == ["j-home-2"]  # the first's went
    info = second.stat()
    assert (info.st_uid, stat.S_IMODE(info.st_mode)) == (job_uid(), 0o755)
    holder = (node.root / "scratch/jobs").stat()
    assert (holder.st_uid, stat.S_IMODE(holder.st_mode) & 0o022) == (os.geteuid(), 0)  # root's, not the user's


def test_removing_a_deep_tree_follows_none_of_its_links(tmp_path):
    from node_bootstrap.jobs import safe_paths

    target = outside(tmp_path, "files")
    before = snapshot(target)
    holder = tmp_path / "holder"
    deep = holder / "j-old"
    for _ in range(safe_paths.MAX_DEPTH * 3):  # deeper than the walk holds open: moved up, then removed
        deep = deep / "d"
    deep.mkdir(parents=True)
    (deep / "to-outside").symlink_to(target, target_is_directory=True)
    (holder / "j-old/etc").symlink_to(target / "etc")
    (holder / "j-keep").mkdir()
    fd = os.open(holder, os.O_RDONLY | os.O_DIRECTORY)
    try:
        safe_paths.remove_all_but(fd, "j-keep")
    finally:
        os.close(fd)
    assert [p.name for p in holder.iterdir()] == ["j-keep"]
    assert snapshot(target) == before
