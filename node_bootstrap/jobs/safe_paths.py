"""What root does on paths the job user can write, done so that no link or rename of that user's redirects it
(issue 31: a link at /scratch/checkpoints to / made root delete the node's top-level directories).

Every operation starts from a directory root made and only root may change (`trusted_dir`: /scratch, /fsx,
/var/log/cluster/jobs), opens each further component from its parent's descriptor with O_NOFOLLOW, and acts on
descriptors, never on a path again: fchown/fchmod on the opened object, unlink/rmdir/mkdir relative to the
parent's descriptor. A link where a directory is expected is refused in one line (JobError), never followed;
a link or file inside a tree root removes is unlinked by name, never followed. A rename by the user between
a check and a use changes nothing: the descriptor still names what was checked.

When the job user is the caller itself (a test's fake root maps it to whoever runs the tests) there is no
boundary to keep: nothing is chowned and no owner is checked, but links are still refused.

Standard library only, Python >= 3.9 (the nodes' system Python).
"""

from __future__ import annotations

import contextlib
import errno
import os
import stat
from collections.abc import Iterator

from node_bootstrap.accounts import Account
from node_bootstrap.jobs.errors import JobError

_DIR_FLAGS = os.O_RDONLY | os.O_DIRECTORY | os.O_NOFOLLOW | os.O_CLOEXEC
# A file is opened as a path only: no open of its content (FSx would load a lazily imported file from S3),
# and no blocking on a FIFO. fchown/fchmod do not take an O_PATH descriptor; its /proc/self/fd link does.
_PATH_FLAGS = os.O_PATH | os.O_NOFOLLOW | os.O_CLOEXEC
# How deep a tree walk goes while holding one descriptor per level. Checkpoints are 3 deep (step-N/rank-R/file);
# a deeper tree was made on purpose: `remove_tree` moves its deep parts up, `seal_tree` closes them to the user.
MAX_DEPTH = 32
MAX_PASSES = 100  # of remove_tree over one tree, each after moving its too deep parts up


def guarded(account: Account) -> bool:
    """Whether there is a boundary to keep: the job user is not the caller itself."""
    return account.uid != os.geteuid()


def user_can_change(info: os.stat_result, account: Account) -> bool:
    """Whether the job user may rename or replace the entries of a directory with this stat: it owns it, or may
    write it through one of its groups or as anyone, without the sticky bit (which leaves it only its own)."""
    if info.st_uid == account.uid:
        return True
    if info.st_mode & stat.S_ISVTX:
        return False
    mode = info.st_mode
    return bool(mode & stat.S_IWOTH or (mode & stat.S_IWGRP and info.st_gid in (account.gid, *account.groups)))


@contextlib.contextmanager
def trusted_dir(path: str, account: Account) -> Iterator[int]:
    """A descriptor of `path`, a directory root made (created when missing; a link in it is root's own:
    /scratch may be the DLAMI's mount), refused when the job user could change what it holds."""
    try:
        os.makedirs(path, exist_ok=True)
        fd = os.open(path, os.O_RDONLY | os.O_DIRECTORY | os.O_CLOEXEC)
    except OSError as e:
        raise JobError(f"cannot open the directory {path}: {e.strerror or e}") from None
    try:
        info = os.fstat(fd)
        if guarded(account) and user_can_change(info, account):
            raise JobError(f"{path} (owner uid {info.st_uid}, mode {stat.S_IMODE(info.st_mode):04o}) may be changed "
                           f"by the job user {account.name}: root acts on job paths only below directories that "
                           "only root may change (the jobuser boot step keeps the scratch so; elsewhere: chown "
                           "root:root, chmod go-w)")
        yield fd
    finally:
        os.close(fd)


def _refusal(parent_fd: int, name: str, where: str, what: str = "a directory") -> JobError:
    try:
        info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
    except OSError:
        return JobError(f"{where} changed while it was opened; try again")
    if stat.S_ISLNK(info.st_mode):
        with contextlib.suppress(OSError):
            target = os.readlink(name, dir_fd=parent_fd)
            return JobError(f"{where} is a symbolic link (to {target!r}): refused, root follows no link on a job's "
                            "paths")
        return JobError(f"{where} is a symbolic link: refused, root follows no link on a job's paths")
    return JobError(f"{where} exists and is not {what}")


def open_dir(parent_fd: int, name: str, where: str, create_mode: int | None = None) -> int | None:
    """A descriptor of the directory `name` in `parent_fd`, never through a link; created with `create_mode`
    when missing (None: not created, and None returned). JobError when it is a link or not a directory."""
    for _ in range(2):
        try:
            return os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except FileNotFoundError:
            if create_mode is None:
                return None
            with contextlib.suppress(FileExistsError):
                os.mkdir(name, create_mode, dir_fd=parent_fd)
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.ELOOP):
                raise _refusal(parent_fd, name, where) from None
            raise JobError(f"cannot open {where}: {e.strerror or e}") from None
    raise JobError(f"{where} vanished as soon as it was created; try again")


def root_dir(parent_fd: int, name: str, where: str, account: Account) -> int:
    """The directory that holds every job's directory of one kind (<scratch>/checkpoints, <scratch>/jobs,
    /fsx/checkpoints): created 0755, and root's again when the job user could change it (a node that ran jobs
    before issue 31 gave the user the whole scratch)."""
    fd = open_dir(parent_fd, name, where, create_mode=0o755)
    assert fd is not None
    info = os.fstat(fd)
    if guarded(account) and user_can_change(info, account):
        os.fchown(fd, os.geteuid(), os.getegid())
        os.fchmod(fd, stat.S_IMODE(info.st_mode) & 0o755)
    return fd


def own_dir(parent_fd: int, name: str, where: str, account: Account) -> int:
    """The job's own directory `name` in `parent_fd` (a root_dir): created, and the job user's. What it holds
    becomes the user's again when root holds the directory (a job that restarts after its directory was sealed,
    or a directory imported from the checkpoint bucket)."""
    fd = open_dir(parent_fd, name, where, create_mode=0o755)
    assert fd is not None
    info = os.fstat(fd)
    if guarded(account) and (info.st_uid, info.st_gid) != (account.uid, account.gid):
        if info.st_uid != account.uid:
            _rechown(fd, os.geteuid(), account.uid, account.gid, seal=False, depth=1)
        os.fchown(fd, account.uid, account.gid)  # last: an interrupted grant is redone at the next start
    return fd


def root_file(parent_fd: int, name: str, where: str, account: Account) -> None:
    """Root's file `name` in `parent_fd` (a job's log, which only its supervisor writes): created when missing;
    one the job user was given by an earlier start becomes root's, 0644; a name with a second link (one the user
    made while it owned the file) is replaced by a new file; refused when it is a link or not a regular file."""
    flags = os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_NONBLOCK | os.O_NOCTTY | os.O_CLOEXEC
    for _ in range(2):
        try:
            fd = os.open(name, flags, 0o644, dir_fd=parent_fd)
        except OSError as e:
            if e.errno in (errno.ELOOP, errno.EISDIR, errno.ENXIO):
                raise _refusal(parent_fd, name, where, "a regular file") from None
            raise JobError(f"cannot open {where}: {e.strerror or e}") from None
        try:
            info = os.fstat(fd)
            if not stat.S_ISREG(info.st_mode):
                raise JobError(f"{where} exists and is not a regular file")
            if not guarded(account):
                return
            if info.st_nlink > 1:
                os.unlink(name, dir_fd=parent_fd)
                continue
            if (info.st_uid, info.st_gid) != (0, 0):
                os.fchown(fd, 0, 0)
            if stat.S_IMODE(info.st_mode) != 0o644:
                os.fchmod(fd, 0o644)
            return
        finally:
            os.close(fd)
    raise JobError(f"{where} got a second link again while it was replaced: refused")


def remove_all_but(dir_fd: int, keep: str) -> None:
    """Remove every entry of `dir_fd` except `keep`: a directory with all it holds, anything else by its name."""
    for name in os.listdir(dir_fd):
        if name != keep:
            remove_tree(dir_fd, name)


def remove_tree(parent_fd: int, name: str) -> None:
    """Remove `name` from `parent_fd` and, for a directory, all it holds, following no link. What cannot be
    removed (a job's process still writing there) stays; the next start tries again."""
    with contextlib.suppress(OSError):
        info = os.stat(name, dir_fd=parent_fd, follow_symlinks=False)
        if not stat.S_ISDIR(info.st_mode):
            os.unlink(name, dir_fd=parent_fd)
            return
        try:
            fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
        except OSError as e:
            if e.errno in (errno.ENOTDIR, errno.ELOOP):  # swapped for a link or a file since the lstat
                os.unlink(name, dir_fd=parent_fd)
            return
        try:
            for _ in range(MAX_PASSES):  # again while parts deeper than MAX_DEPTH were moved up to the top
                if not _empty(fd, fd, 1):
                    break
        finally:
            os.close(fd)
        os.rmdir(name, dir_fd=parent_fd)  # only an empty directory: whatever took its name meanwhile stays


def _empty(fd: int, top_fd: int, depth: int) -> bool:
    """Remove what `fd` holds; True when a directory too deep to hold open was moved up to `top_fd` instead."""
    moved = False
    for name in os.listdir(fd):
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            if not stat.S_ISDIR(info.st_mode):
                os.unlink(name, dir_fd=fd)
                continue
            if depth >= MAX_DEPTH:
                os.rename(name, f".deep-{info.st_ino}", src_dir_fd=fd, dst_dir_fd=top_fd)
                moved = True
                continue
            child = os.open(name, _DIR_FLAGS, dir_fd=fd)
        except OSError:
            continue  # gone, or swapped for a link since the lstat: the next pass or start sees it
        try:
            moved = _empty(child, top_fd, depth + 1) or moved
        finally:
            os.close(child)
        with contextlib.suppress(OSError):
            os.rmdir(name, dir_fd=fd)
    return moved


def seal_tree(parent_fd: int, name: str, account: Account) -> bool:
    """Make the directory `name` in `parent_fd` (another job's) read-only to the job user: each directory and
    file the user owns becomes root's, without write for group and others, readable by all (a later job may
    resume from it), deepest first and the directory itself last, so that an interrupted seal is redone at the
    next start. Links are not followed and other owners' entries not touched. False when there was nothing
    to seal (no boundary, not a directory, or sealed already)."""
    if not guarded(account):
        return False
    try:
        fd = os.open(name, _DIR_FLAGS, dir_fd=parent_fd)
    except OSError:
        return False  # gone, a link or a file: nothing of a job's to seal
    try:
        info = os.fstat(fd)
        if info.st_uid != account.uid:
            return False
        _rechown(fd, account.uid, os.geteuid(), os.getegid(), seal=True, depth=1)
        _set_owner(fd, info, os.geteuid(), os.getegid(), _sealed_mode(info, True))
        return True
    finally:
        os.close(fd)


def _sealed_mode(info: os.stat_result, is_dir: bool) -> int:
    # no set-id bits (a file the user made setuid must not become a setuid root file), no write but root's
    return (stat.S_IMODE(info.st_mode) & 0o755) | (0o555 if is_dir else 0o444)


def _set_owner(fd: int, info: os.stat_result, uid: int, gid: int, mode: int | None) -> None:
    if stat.S_ISDIR(info.st_mode):
        os.fchown(fd, uid, gid)
        if mode is not None:
            os.fchmod(fd, mode)
        return
    proc = f"/proc/self/fd/{fd}"  # the object the O_PATH descriptor holds, whatever its name is now
    os.chown(proc, uid, gid)
    if mode is not None:
        os.chmod(proc, mode)


def _rechown(fd: int, from_uid: int, to_uid: int, to_gid: int, seal: bool, depth: int) -> None:
    """Give what `fd` holds from `from_uid` to `to_uid`:`to_gid`, deepest first: directories and regular files
    only, each checked on its own descriptor. A seal also takes write from group and others; a grant (to the
    job user) leaves a file with other names (a hard link) root's."""
    for name in os.listdir(fd):
        try:
            info = os.stat(name, dir_fd=fd, follow_symlinks=False)
            is_dir = stat.S_ISDIR(info.st_mode)
            if info.st_uid != from_uid or not (is_dir or stat.S_ISREG(info.st_mode)):
                continue
            child = os.open(name, _DIR_FLAGS if is_dir else _PATH_FLAGS, dir_fd=fd)
        except OSError:
            continue  # gone, or swapped for a link since the lstat: nothing there to give
        try:
            info = os.fstat(child)
            if info.st_uid != from_uid or not (stat.S_ISDIR(info.st_mode) or stat.S_ISREG(info.st_mode)):
                continue
            if stat.S_ISDIR(info.st_mode):
                if depth < MAX_DEPTH:
                    _rechown(child, from_uid, to_uid, to_gid, seal, depth + 1)
                elif seal:  # too deep to walk: closed to the job user altogether
                    _set_owner(child, info, to_uid, to_gid, 0o700)
                    continue
                else:
                    continue
            elif not seal and info.st_nlink != 1:
                continue
            _set_owner(child, info, to_uid, to_gid, _sealed_mode(info, stat.S_ISDIR(info.st_mode)) if seal else None)
        finally:
            os.close(child)
