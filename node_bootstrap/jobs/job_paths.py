"""What the job user gets at a start, and what it loses: root prepares the job's paths through safe_paths, so
that no link or rename of the job user's redirects it (docs/security.md, "The job user's boundary").

The job user gets only its job's own directories, each inside a directory root owns (its log,
<jobLogDir>/<job id>.log, is root's: the supervisor writes the job's output there):
- its scratch, <scratch>/jobs/<job id>: its HOME and TMPDIR, so each job starts with a clean home (torch's,
  Triton's and pip's caches and ~/.local live there) that a later attempt of the same job on the node finds again;
- a training job's checkpoint directory <checkpointRoot>/<job id> on FSx and its local checkpoint tier
  <scratch>/checkpoints/<job id>;
- an export job's checkpoint directory <checkpointRoot>/<job id> (where it writes the Hugging Face directory).
Other jobs' scratch and local checkpoints go. Other jobs' checkpoint directories on FSx are sealed: root's,
read-only to the job user (seal_tree), which still reads them for a `--resume-from` or an export.
Why at the start and not at the end of a job: the cluster runs one job at a time (the job table's lock), so
every other job has ended for good when one starts, whatever node it ended on (a lost node never reports
an end); and the job user's code runs only from a start on. A later attempt of the same job gets its
directory back (own_dir).
"""

from __future__ import annotations

import contextlib
import os
from collections.abc import Iterator

from node_bootstrap.accounts import Account
from node_bootstrap.jobs.errors import JobError
from node_bootstrap.jobs.safe_paths import (
    open_dir,
    own_dir,
    remove_all_but,
    root_dir,
    root_file,
    seal_tree,
    trusted_dir,
)
from node_bootstrap.jobs.settings import JobSettings
from node_bootstrap.jobs.spec import (
    EXPORT_MODULE,
    TRAINING_MODULE,
    JobFiles,
    JobSpec,
    checkpoint_dir,
    job_scratch_dir,
    local_checkpoint_dir,
)


@contextlib.contextmanager
def _holder(path: str, account: Account) -> Iterator[int]:
    """The root-owned directory that holds every job's directory of one kind (`path`: <scratch>/checkpoints,
    <scratch>/jobs, <checkpointRoot>), in a directory only root may change (<scratch>, /fsx)."""
    parent, name = os.path.split(path.rstrip("/"))
    with trusted_dir(parent, account) as parent_fd:
        fd = root_dir(parent_fd, name, path, account)
    try:
        yield fd
    finally:
        os.close(fd)


def prepare_job_paths(settings: JobSettings, spec: JobSpec, files: JobFiles, account: Account) -> str:
    """What the job user needs for this job, and no more; returns the job's home ("" without a scratch). The
    directory of another job that a resume starts from is only read."""
    # What root reads and acts on (job.json, status.json, stop-request.json) stays where only root writes.
    with trusted_dir(settings.jobs_dir, account):
        pass
    # The job log is root's too: only the supervisor writes it, from the job's output, which it caps (supervise.py),
    # so the job can neither write past the cap into the root file system nor rewrite what was logged.
    with trusted_dir(settings.job_log_dir, account) as log_dir:
        root_file(log_dir, os.path.basename(files.log_path), f"the job log {files.log_path}", account)
    home = prepare_job_scratch(settings, spec.job_id, account)
    # every start ends what earlier jobs left writable, a commcheck's too: it runs code as the job user as well
    training = spec.module == TRAINING_MODULE
    prepare_checkpoints(settings, spec, account, own=training or spec.module == EXPORT_MODULE)
    prepare_local_checkpoints(settings, spec.job_id, account, own=training)
    return home


def prepare_job_scratch(settings: JobSettings, job_id: str, account: Account) -> str:
    """The job's own scratch, <scratch>/jobs/<job id> (its HOME): the user's; other jobs' go."""
    home = job_scratch_dir(settings, job_id)
    if not home:
        return ""
    with _holder(settings.job_scratch_root, account) as holder:
        os.close(own_dir(holder, job_id, f"the job's scratch directory {home}", account))
        remove_all_but(holder, job_id)
    return home


def prepare_checkpoints(settings: JobSettings, spec: JobSpec, account: Account, own: bool = True) -> None:
    """The job's checkpoint directory on FSx (`own`: a training or export job has one), the user's; every other
    job's there sealed. The directory of the job a resume or an export reads must exist, checked first: a start
    refused for its absence leaves nothing behind."""
    with _holder(settings.checkpoint_root, account) as holder:
        if spec.resume_from:
            other = checkpoint_dir(settings, spec.resume_from)
            fd = open_dir(holder, spec.resume_from, f"resume-from={spec.resume_from!r}: {other}")
            if fd is None:
                if spec.module == EXPORT_MODULE:
                    raise JobError(f"export of job {spec.resume_from}: no checkpoint directory {other} on this "
                                   "node (the job saved no checkpoint)")
                raise JobError(f"resume-from={spec.resume_from!r}: no checkpoint directory {other} on this node")
            os.close(fd)
        if own:
            where = f"the job's checkpoint directory {checkpoint_dir(settings, spec.job_id)}"
            os.close(own_dir(holder, spec.job_id, where, account))
        for name in sorted(os.listdir(holder)):
            if name != spec.job_id:
                seal_tree(holder, name, account)


def prepare_local_checkpoints(settings: JobSettings, job_id: str, account: Account, own: bool = True) -> None:
    """The job's local checkpoint tier on this node's scratch (`own`: a training job has one), the user's.
    Other jobs' local checkpoints go: one job runs on the cluster at a time, their durable checkpoints stay on
    FSx, and a restart of this job finds its own directory as it left it (a replacement node: empty, the shards
    come from replicas)."""
    if not settings.local_checkpoint_root:
        return
    with _holder(settings.local_checkpoint_root, account) as holder:
        if own:
            where = f"the job's local checkpoint directory {local_checkpoint_dir(settings, job_id)}"
            os.close(own_dir(holder, job_id, where, account))
        remove_all_but(holder, job_id)
