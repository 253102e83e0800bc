"""The unprivileged user training jobs run as, read from the node's user database under a root.

Jobs read code and data an operator does not fully control: DCP's `.metadata` is unpickled, and `--resume
auto` loads whatever newest complete `step-N` appears under `/fsx/checkpoints/<job id>`, where the file
system imports objects written to the checkpoint bucket. Run as root, a crafted checkpoint is code execution
as root on every node; run as this user, it is code execution as a user who owns only its job's files.

The boot step `jobuser` (job_user.py) creates the user; `node_bootstrap.jobs` looks it up at every start. Both
read /etc/passwd and /etc/group directly (the files useradd(8) writes; system users live there on the DLAMI),
so the fake roots of the tests carry their own user database.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

JOB_USER = "cluster-job"
# Its home in the user database: root's and empty (the jobuser step), since torch, Triton and NCCL keep caches
# under $HOME (~/.cache, ~/.triton) and a job gets HOME=<scratch>/jobs/<job id> instead, clean at its first
# start (node_bootstrap/jobs/job_paths.py); not under /home, which a site may mount from elsewhere.
JOB_USER_HOME = "/var/lib/cluster-job"
JOB_USER_SHELL = "/usr/sbin/nologin"  # nobody logs in as it


class AccountError(RuntimeError):
    """The user database cannot be read."""


@dataclass(frozen=True)
class Account:
    name: str
    uid: int
    gid: int  # primary group
    home: str
    groups: tuple[int, ...]  # supplementary groups (the GPUs' and EFA devices' groups when they need one)


def _read_table(path: str) -> list[list[str]]:
    try:
        with open(path, encoding="utf-8") as f:
            lines = f.read().splitlines()
    except FileNotFoundError:
        return []
    except OSError as e:
        raise AccountError(f"cannot read {path}: {e.strerror or e}") from None
    return [line.split(":") for line in lines if line and not line.startswith("#")]


def _under(root: str, path: str) -> str:
    return path if root in ("", "/") else os.path.join(root, path.lstrip("/"))


def group_names(root: str) -> dict[int, str]:
    """gid -> group name, from <root>/etc/group."""
    return {int(f[2]): f[0] for f in _read_table(_under(root, "/etc/group")) if len(f) >= 3 and f[2].isdigit()}


def read_account(root: str, name: str = JOB_USER) -> Account | None:
    """The user `name` from <root>/etc/passwd with its supplementary groups from <root>/etc/group, or None."""
    for fields in _read_table(_under(root, "/etc/passwd")):
        if len(fields) >= 7 and fields[0] == name and fields[2].isdigit() and fields[3].isdigit():
            uid, gid = int(fields[2]), int(fields[3])
            groups = sorted(
                int(g[2])
                for g in _read_table(_under(root, "/etc/group"))
                if len(g) >= 4 and g[2].isdigit() and name in g[3].split(",") and int(g[2]) != gid
            )
            return Account(name=name, uid=uid, gid=gid, home=fields[5], groups=tuple(groups))
    return None
