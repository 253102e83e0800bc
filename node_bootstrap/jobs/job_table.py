"""Whether the job table allows a `start` (issue 42): a node starts a job only as the attempt the job table holds
as that job's current one, of a job that is still active there. Without this check, anyone allowed to send the
jobs document could start a finished job's id again with a later --attempt, and the start would give the job
user back that job's sealed checkpoint directory (job_paths.py), whose files the trainer's pruning may then
delete and the data repository association export as deletes to the checkpoint bucket.

The table is cluster_jobs/table.py's: one item per job, key `pk` (the job id), its `state` and its `attempts`
(a list: the current attempt's number is its length). clusterctl and the job keeper write the attempt there
before they send its start. The node reads the item with its role's credentials (GetItem on that table only,
cluster_constructs/compute.py) through the AWS CLI, as the health monitor makes its calls; a read that fails
refuses the start: a node never runs a job it cannot check.

Standard library only (Python >= 3.9).
"""

import json
import subprocess
from typing import Optional

from node_bootstrap.job_contract import TABLE_ACTIVE_STATES
from node_bootstrap.jobs.errors import JobError
from node_bootstrap.jobs.settings import JobSettings

AWS_TIMEOUT_S = 60.0


def get_item_argv(settings: JobSettings, job_id: str) -> list[str]:
    """The AWS CLI call that reads what the check needs of the job's item: a strongly consistent read, so an
    attempt written just before its start is seen."""
    return ["aws", "dynamodb", "get-item", "--region", settings.region, "--table-name", settings.job_table_name,
            "--key", json.dumps({"pk": {"S": job_id}}), "--consistent-read",
            "--projection-expression", "#state, attempts", "--expression-attribute-names",
            json.dumps({"#state": "state"}), "--output", "json"]


def read_job_item(settings: JobSettings, job_id: str) -> Optional[dict[str, object]]:
    """The job's item in DynamoDB's JSON, None when the table has none; JobError when it cannot be read."""
    where = f"the job table {settings.job_table_name}"
    try:
        result = subprocess.run(get_item_argv(settings, job_id), capture_output=True, text=True,
                                timeout=AWS_TIMEOUT_S)
    except (OSError, subprocess.TimeoutExpired) as e:
        raise JobError(f"job {job_id}: cannot read {where} to check the start: {e}; refused") from None
    if result.returncode != 0:
        last = (result.stderr.strip().splitlines() or ["no output"])[-1]
        raise JobError(f"job {job_id}: cannot read {where} to check the start (aws exited {result.returncode}: "
                       f"{last}); refused")
    try:
        answer = json.loads(result.stdout or "{}")
    except ValueError:
        raise JobError(f"job {job_id}: {where} answered no JSON; refused") from None
    item = answer.get("Item") if isinstance(answer, dict) else None
    return item if isinstance(item, dict) else None


def current_attempt(item: dict[str, object]) -> tuple[Optional[str], int]:
    """The item's state and its current attempt's number (the length of `attempts`; 0 when it has none)."""
    state = item.get("state")
    attempts = item.get("attempts")
    name = state.get("S") if isinstance(state, dict) else None
    listed = attempts.get("L") if isinstance(attempts, dict) else None
    return (name if isinstance(name, str) else None), (len(listed) if isinstance(listed, list) else 0)


def check_start_allowed(settings: JobSettings, job_id: str, attempt: int) -> None:
    """Refuse, in one line, a start of `job_id` attempt `attempt` unless the job table holds that attempt as
    the job's current one and the job as active. Nothing is checked when the node config names no table."""
    if not settings.job_table_name:
        return
    item = read_job_item(settings, job_id)
    table = settings.job_table_name
    if item is None:
        raise JobError(f"job {job_id} is not in the job table {table}: a node starts only a job the table holds; "
                       "refused (submit it with clusterctl)")
    state, current = current_attempt(item)
    if state not in TABLE_ACTIVE_STATES:
        raise JobError(f"job {job_id} is {state or 'in no state'} in the job table {table}: only a job in one of "
                       f"{', '.join(TABLE_ACTIVE_STATES)} starts; refused, and its checkpoint directory stays sealed")
    if attempt != current:
        raise JobError(f"attempt={attempt}: the job table {table} holds attempt {current} as job {job_id}'s "
                       "current one, and a node starts only that one; refused")
