"""A later attempt of a job on a node that already ran it (`start --attempt N`).

The job keeper restarts a job that lost a node on a new node set: same job id, checkpoint directory and
rendezvous id, attempt + 1, `--resume auto` (issue 10). On a node that survived, the job's directory is
already there. `start` then decides here:
- the job still runs there: refused (the keeper stops what is left of a job before it restarts it);
- it ended there (succeeded, failed, cancelled, hung) and N is greater than its recorded attempt: what
  `status` says about that attempt is kept aside as status.attempt-<K>.json (with its last step and resume
  point, which the next attempt's log lines would otherwise hide), its stop request likewise, and the new
  attempt starts; the job log is kept and appended to (the supervisor marks where the attempt begins);
- N is not greater: refused, as a repeated delivery of a start already made.
status.json itself stays until the new attempt's supervisor replaces it, so `status` always answers.
"""

import os
from typing import Optional

from node_bootstrap.jobs.control import job_status, process_alive
from node_bootstrap.jobs.errors import JobError
from node_bootstrap.jobs.settings import JobSettings
from node_bootstrap.jobs.spec import JobFiles, JobSpec, read_json, write_json_atomic


def keep_previous_attempt(settings: JobSettings, spec: JobSpec, files: JobFiles) -> Optional[str]:
    """None when the node has no directory for the job (its first start here); else the path the previous
    attempt's status was kept at. Raises JobError (exit 1) when the job may not start again. The caller holds
    the start lock (launch.start_lock): no other start reads or moves these files meanwhile."""
    if not os.path.exists(files.job_dir):
        return None
    where = f"job {spec.job_id} already exists on this node ({files.job_dir})"
    if read_json(files.status_path) is None:
        raise JobError(f"{where} without a recorded status: its start never recorded one (see "
                       f"{files.supervisor_log} or journalctl -u {files.unit}); not started again")
    status = job_status(settings, spec.job_id)  # a `running` whose supervisor is gone reads `failed`
    previous, state = status.get("attempt", 1), status.get("state")
    if not isinstance(previous, int):
        raise JobError(f"{where}: its status records attempt={previous!r}, not a number; not started again")
    if state == "running":
        raise JobError(f"{where}: attempt {previous} is running; cancel it before starting attempt {spec.attempt}")
    if spec.attempt <= previous:
        raise JobError(f"{where}: attempt {previous} is {state}, and attempt {spec.attempt} is not later (a repeated "
                       f"start); allowed: an attempt greater than {previous}")
    torchrun_pid = status.get("pid")
    if process_alive(torchrun_pid, spec.job_id):  # its argv names the job (--rdzv-id): no pid reuse
        raise JobError(f"{where}: attempt {previous} is {state}, but its torchrun (pid {torchrun_pid}) still runs "
                       "without its supervisor; stop it before starting the next attempt")
    kept = files.kept_aside(files.status_path, previous)
    write_json_atomic(kept, status)
    if os.path.exists(files.stop_request_path):  # a new attempt is not stopped for the previous one's reason
        os.replace(files.stop_request_path, files.kept_aside(files.stop_request_path, previous))
    return kept
