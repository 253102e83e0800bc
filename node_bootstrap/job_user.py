"""Step jobuser: the unprivileged user training jobs run as (accounts.JOB_USER), with what a job needs.

- The user: a system user with a group of its own, a home that stays root's and empty (a job's HOME is its own
  scratch directory), and no login shell.
- The devices a job opens: the GPUs (/dev/nvidia0..N, nvidiactl, nvidia-uvm) and the EFA devices
  (/dev/infiniband/uverbsN, which libfabric's efa provider opens). A device node that anyone may read and
  write needs nothing (the NVIDIA driver creates its nodes 0666 unless NVreg_DeviceFileMode says otherwise);
  one that a group may read and write makes the user a member of that group; one that only root may open
  fails the step with its name and mode, because no job could use it.
- /scratch (the instance-store scratch) and the user's home are root's, writable by root alone: at each
  start, `node_bootstrap.jobs start` gives the user only the job's own directories, in the scratch and on FSx,
  and its log file (node_bootstrap/jobs/job_paths.py; docs/security.md, "The job user's boundary").

Runs after `health` (the drivers are loaded, so the device nodes exist) and before `training`.
"""

from __future__ import annotations

import glob
import os

from node_bootstrap.accounts import (
    JOB_USER,
    JOB_USER_HOME,
    JOB_USER_SHELL,
    Account,
    AccountError,
    group_names,
    read_account,
)
from node_bootstrap.config import NodeConfig
from node_bootstrap.errors import StepError
from node_bootstrap.host import Host
from node_bootstrap.plan import StepPlan
from node_bootstrap.runner import Runner

DEVICE_GLOBS = (
    "/dev/nvidia[0-9]*",
    "/dev/nvidiactl",
    "/dev/nvidia-uvm",
    "/dev/nvidia-uvm-tools",
    "/dev/infiniband/uverbs*",
)
WORLD_RW = 0o006
GROUP_RW = 0o060


def find_device_nodes(host: Host) -> list[str]:
    """The GPU and EFA device nodes present, as node paths."""
    found: set[str] = set()
    for pattern in DEVICE_GLOBS:
        found.update(host.node_path(p) for p in glob.glob(host.path(pattern)))
    return sorted(found)


def stat_paths(host: Host, runner: Runner, node_paths: list[str]) -> dict[str, tuple[int, int, int]]:
    """node path -> (permission bits, owner uid, group gid), from `stat -L` (following /scratch's symlink)."""
    if not node_paths:
        return {}
    result = runner.run(["stat", "-L", "-c", "%a %u %g %n", *(host.path(p) for p in node_paths)],
                        mutating=False, check=False)
    if not result.ok:
        detail = (result.stderr.strip() or result.stdout.strip()).splitlines()[-1:] or ["no output"]
        raise StepError(f"`stat` of {len(node_paths)} device nodes and directories exited "
                        f"{result.returncode}: {detail[0]}")
    by_host_path = {host.path(p): p for p in node_paths}
    stats: dict[str, tuple[int, int, int]] = {}
    for line in result.stdout.splitlines():
        mode, uid, gid, path = line.split(" ", 3)
        stats[by_host_path.get(path, path)] = (int(mode, 8), int(uid), int(gid))
    return stats


def device_groups(stats: dict[str, tuple[int, int, int]]) -> set[int]:
    """The groups the job user needs for the devices; StepError for a device only root can open."""
    needed: set[int] = set()
    for path, (mode, _uid, gid) in sorted(stats.items()):
        if mode & WORLD_RW == WORLD_RW:
            continue
        if mode & GROUP_RW == GROUP_RW and gid != 0:
            needed.add(gid)
            continue
        raise StepError(f"{path} (mode {mode:04o}, group {gid}): the job user {JOB_USER} could not open it; "
                        "jobs need every GPU and EFA device readable and writable by a group or by all")
    return needed


def _account(host: Host) -> Account | None:
    try:
        return read_account(host.root, JOB_USER)
    except AccountError as e:
        raise StepError(str(e)) from None


def plan_job_user(config: NodeConfig, host: Host, runner: Runner) -> StepPlan:
    plan = StepPlan("jobuser")
    account = _account(host)
    if account is None:
        plan.add(f"create the system user {JOB_USER} (home {JOB_USER_HOME}, no login) that training jobs run as",
                 ("useradd", "--system", "--user-group", "--create-home", "--home-dir", JOB_USER_HOME,
                  "--shell", JOB_USER_SHELL, "--comment", "training jobs (node_bootstrap)", JOB_USER))
    else:
        plan.note(f"{JOB_USER}: uid {account.uid}, gid {account.gid}, groups {list(account.groups)}")

    devices = find_device_nodes(host)
    roots = root_only_dirs(config, account)
    # /scratch exists once the scratch step ran, the home once the user does (in a dry run they may not: then
    # their chown is planned anyway)
    stats = stat_paths(host, runner, devices + [p for p in roots if os.path.exists(host.path(p))])
    needed = device_groups({p: s for p, s in stats.items() if p not in roots})
    plan.note(f"{len(devices)} GPU and EFA device nodes; groups they need: {sorted(needed) or 'none'}")
    missing = sorted(needed - set(account.groups if account else ()) - {account.gid if account else -1})
    if missing:
        names = group_names(host.root)
        unnamed = [gid for gid in missing if gid not in names]
        if unnamed:
            raise StepError(f"the device groups {unnamed} have no name in /etc/group")
        groups = ",".join(names[gid] for gid in missing)
        plan.add(f"add {JOB_USER} to the groups {groups}, which own the GPU or EFA device nodes",
                 ("usermod", "--append", "--groups", groups, JOB_USER))

    for path, why in roots.items():
        mode, uid, gid = stats.get(path, (0, -1, -1))
        if (uid, gid) != (0, 0):
            plan.add(f"give {path} to root: {why}", ("chown", "root:root", host.path(path)))
        if mode & 0o022:
            plan.add(f"take group and others' write from {path}: {why}", ("chmod", "go-w", host.path(path)))
    plan.verify = lambda: _verify(host, runner, needed, roots)
    return plan


def root_only_dirs(config: NodeConfig, account: Account | None) -> dict[str, str]:
    """The directories the job user must not change (issue 31), and why: root acts on what they hold."""
    return {
        config.scratch.mount_point: "each job gets its own directories in the scratch at its start "
                                    "(node_bootstrap/jobs/job_paths.py), never the scratch itself",
        account.home if account else JOB_USER_HOME: "each job's HOME is its own scratch directory, so nothing a "
                                                     "job leaves in its home reaches the next",
    }


def _verify(host: Host, runner: Runner, needed: set[int], roots: dict[str, str]) -> None:
    account = _account(host)
    if account is None:
        raise StepError(f"the user {JOB_USER} does not exist after useradd")
    lacking = sorted(needed - set(account.groups) - {account.gid})
    if lacking:
        raise StepError(f"{JOB_USER} is still not in the device groups {lacking}")
    if not os.path.isdir(host.path(account.home)):
        raise StepError(f"{JOB_USER}'s home {account.home} does not exist")
    for path, (mode, uid, gid) in stat_paths(host, runner, list(roots)).items():
        if (uid, gid) != (0, 0) or mode & 0o022:
            raise StepError(f"{path} (mode {mode:04o}, owner {uid}:{gid}) is still not root's alone")
