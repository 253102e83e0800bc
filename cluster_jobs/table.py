"""The job table: one DynamoDB item per job, and one lock item that makes a cluster run one job at a time.

The stack creates the table (cluster_constructs/job_keeper.py; output JobTableName). Its only key is the
string `pk`: a job's id for a job item, LOCK_KEY for the lock. Writers are clusterctl (submit, cancel, status)
and the job keeper (job_keeper/keeper.py, run by a Lambda function). Every write of a job item is a whole-item
put on the condition that `version` is still the one read (optimistic concurrency): two writers never both
win, and the loser reads the item again and decides anew. So a `cancel` written while the keeper prepares a
restart makes the keeper's write fail, and the keeper then sees the cancel instead of undoing it.

Submit writes the job item and takes the lock in one transaction; a job that reaches a final state gives the
lock back in the same transaction that records that state.
"""

from __future__ import annotations

import dataclasses
import datetime
import logging
from collections.abc import Iterator
from decimal import Decimal
from typing import Any

import botocore.exceptions
from boto3.dynamodb.types import TypeDeserializer, TypeSerializer

from cluster_aws.errors import ClusterctlError
from cluster_jobs import compaction, record_schema
from cluster_jobs.job_record import (
    ACTIVE_STATES,
    FINAL_STATES,
    STATES,
    Attempt,
    JobRecord,
    NodeReport,
    NodeSummary,
    parse_time,
    utc_now_text,
)

LOCK_KEY = "cluster#active-job"  # never a job id (node_bootstrap.jobs.JOB_ID_RE)
MAX_CONFIG_TEXT_BYTES = 64 * 1024  # a DynamoDB item holds 400 KB; a training TOML is a few KB
LOG = logging.getLogger("cluster_jobs.table")

_SERIALIZER = TypeSerializer()
_DESERIALIZER = TypeDeserializer()

# the record's classes live in cluster_jobs/job_record.py; their readers import them from here as before
__all__ = ["ACTIVE_STATES", "FINAL_STATES", "LOCK_KEY", "MAX_CONFIG_TEXT_BYTES", "STATES", "Attempt",
           "JobAlreadyActive", "JobRecord", "JobTable", "JobTableError", "NodeReport", "NodeSummary", "StaleRecord",
           "UnreadableRecord", "parse_time", "utc_now_text"]


class JobTableError(ClusterctlError):
    pass


class JobAlreadyActive(JobTableError):
    """The lock is held: another job runs (or restarts) on this cluster."""

    def __init__(self, active_job_id: str, state: str | None) -> None:
        self.active_job_id = active_job_id
        self.active_state = state
        shown = f"{active_job_id} ({state})" if state else active_job_id
        super().__init__(
            f"not submitted: job {shown} is active on this cluster, and a cluster runs one job at a time; "
            f"stop it with: clusterctl cancel {active_job_id} (several jobs at once: deploy several stacks)"
        )


class UnreadableRecord(JobTableError):
    """A job item whose required fields do not fit the record (record_schema.UnreadableRecord's line)."""


class StaleRecord(JobTableError):
    """Someone else wrote the job since it was read: read it again and decide anew."""


# --- (de)serialization -----------------------------------------------------------------------------------


def _to_item(record: JobRecord) -> dict[str, Any]:
    data = dataclasses.asdict(record)
    data.pop("dropped_on_read")
    data["pk"] = record.job_id
    plain = {key: value for key, value in _camel(data).items() if value is not None}
    return {key: _SERIALIZER.serialize(value) for key, value in _drop_none(plain).items()}


def _from_item(item: dict[str, Any]) -> JobRecord:
    """The record through record_schema: a stored value that does not fit its field is dropped and named in
    dropped_on_read; UnreadableRecord when a required one does not fit."""
    data = _snake(_numbers({key: _DESERIALIZER.deserialize(value) for key, value in item.items()}))
    job_id = str(data.pop("pk", "?"))
    dropped: list[str] = []
    try:
        attempts = []
        for n, raw in enumerate(_items(data.pop("attempts", []), "attempts")):
            reports = []
            for i, report in enumerate(_items(raw.pop("node_reports", []), f"attempts[{n}].node_reports")):
                try:
                    reports.append(record_schema.build(NodeReport, report, f"attempts[{n}].node_reports[{i}].",
                                                       dropped))
                except record_schema.UnreadableRecord as e:  # a node's report is for people only: left out
                    dropped.append(f"{e}: the report dropped")
            summary = _summary(raw.pop("node_summary", None), f"attempts[{n}].node_summary", dropped)
            attempts.append(record_schema.build(Attempt, {**raw, "node_reports": reports, "node_summary": summary},
                                                f"attempts[{n}].", dropped))
        record = record_schema.build(JobRecord, {**data, "attempts": attempts}, "", dropped)
    except record_schema.UnreadableRecord as e:
        raise UnreadableRecord(f"job {job_id}: its record in the job table cannot be read: {e}") from None
    return dataclasses.replace(record, dropped_on_read=dropped) if dropped else record


def _summary(value: Any, where: str, dropped: list[str]) -> NodeSummary | None:
    """An earlier attempt's summary (absent in records written before compaction.py: None, and the readers
    summarize its reports); one that does not fit is dropped."""
    if value is None:
        return None
    if not isinstance(value, dict):
        dropped.append(f"{where}: {record_schema.describe(value)}, not a map: dropped")
        return None
    return record_schema.build(NodeSummary, value, f"{where}.", dropped)  # no required field: never raises


def _items(value: Any, where: str) -> list[dict[str, Any]]:
    if not isinstance(value, list) or not all(isinstance(v, dict) for v in value):
        raise record_schema.UnreadableRecord(f"{where}: {record_schema.describe(value)}, not a list of maps")
    return value


def _camel_name(name: str) -> str:
    head, *rest = name.split("_")
    return head + "".join(part.title() for part in rest)


def _snake_name(name: str) -> str:
    return "".join("_" + c.lower() if c.isupper() else c for c in name)


def _camel(value: Any) -> Any:
    if isinstance(value, dict):
        return {_camel_name(k): _camel(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_camel(v) for v in value]
    return value


def _snake(value: Any) -> Any:
    if isinstance(value, dict):
        return {_snake_name(k): _snake(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_snake(v) for v in value]
    return value


def _drop_none(value: Any) -> Any:
    """DynamoDB has NULL, but leaving a key out reads back as the dataclass default, which keeps items small."""
    if isinstance(value, dict):
        return {k: _drop_none(v) for k, v in value.items() if v is not None}
    if isinstance(value, list):
        return [_drop_none(v) for v in value]
    return value


def _numbers(value: Any) -> Any:
    if isinstance(value, Decimal):
        return int(value) if value == value.to_integral_value() else float(value)
    if isinstance(value, dict):
        return {k: _numbers(v) for k, v in value.items()}
    if isinstance(value, list):
        return [_numbers(v) for v in value]
    return value


def _error_code(error: botocore.exceptions.ClientError) -> str:
    return str(error.response.get("Error", {}).get("Code", ""))


# --- the table ---------------------------------------------------------------------------------------------


class JobTable:
    """The table's operations, on a boto3 DynamoDB client."""

    def __init__(self, dynamodb: Any, table_name: str) -> None:
        self.dynamodb = dynamodb
        self.table_name = table_name
        self.unreadable: list[str] = []  # the last jobs()'s items that could not be read, one line each

    def create(self, record: JobRecord) -> JobRecord:
        """Writes a new job and takes the lock, both or neither; JobAlreadyActive names the job holding it."""
        record = dataclasses.replace(record, version=1)
        try:
            self.dynamodb.transact_write_items(TransactItems=[
                {"Put": {
                    "TableName": self.table_name,
                    "Item": {"pk": {"S": LOCK_KEY}, "jobId": {"S": record.job_id}},
                    "ConditionExpression": "attribute_not_exists(pk)",
                }},
                {"Put": {
                    "TableName": self.table_name,
                    "Item": _to_item(record),
                    "ConditionExpression": "attribute_not_exists(pk)",
                }},
            ])
        except botocore.exceptions.ClientError as e:
            if _error_code(e) != "TransactionCanceledException":
                raise
            active = self.active_job_id()
            if active is None or active == record.job_id:
                raise JobTableError(f"job {record.job_id}: not recorded: {e}") from None
            holder = self.get(active)
            raise JobAlreadyActive(active, holder.state if holder else None) from None
        return record

    def get(self, job_id: str) -> JobRecord | None:
        item = self.dynamodb.get_item(
            TableName=self.table_name, Key={"pk": {"S": job_id}}, ConsistentRead=True
        ).get("Item")
        return _from_item(item) if item else None

    def active_job_id(self) -> str | None:
        item = self.dynamodb.get_item(
            TableName=self.table_name, Key={"pk": {"S": LOCK_KEY}}, ConsistentRead=True
        ).get("Item")
        return item["jobId"]["S"] if item else None

    def active(self) -> JobRecord | None:
        job_id = self.active_job_id()
        return self.get(job_id) if job_id else None

    def jobs(self) -> Iterator[JobRecord]:
        """Every job, newest first: by the time it was recorded, then its id (a submit's id starts with its
        time; an export's, <job>-hf-xxxx, with its source's). An item that cannot be read is left out and
        described in `unreadable`, so one bad record never hides the others."""
        records = []
        self.unreadable = []
        for page in self.dynamodb.get_paginator("scan").paginate(TableName=self.table_name, ConsistentRead=True):
            for item in page.get("Items", []):
                if item["pk"].get("S") == LOCK_KEY:
                    continue
                try:
                    records.append(_from_item(item))
                except UnreadableRecord as e:  # one bad item does not hide the others: listed apart
                    self.unreadable.append(str(e))
        return iter(sorted(records, key=lambda r: (r.created_at, r.job_id), reverse=True))

    def save(self, record: JobRecord, now: datetime.datetime) -> JobRecord:
        """Writes `record` if nobody wrote the job since it was read (StaleRecord otherwise); a record in a
        final state gives the lock back, if it holds it, in the same transaction. Returns the record as written."""
        written = dataclasses.replace(record, version=record.version + 1, updated_at=utc_now_text(now))
        # earlier attempts compacted, and more dropped while the item is near DynamoDB's 400 KB (compaction.py)
        written = compaction.fit_record(written, lambda r: compaction.item_size_bytes(_to_item(r)))
        item = _to_item(written)
        if (size := compaction.item_size_bytes(item)) > compaction.SAFE_ITEM_BYTES:
            LOG.warning("job %s: its record is %d bytes after compaction (DynamoDB refuses over %d)",
                        record.job_id, size, compaction.MAX_ITEM_BYTES)
        put = {
            "TableName": self.table_name,
            "Item": item,
            "ConditionExpression": "#version = :read",
            "ExpressionAttributeNames": {"#version": "version"},
            "ExpressionAttributeValues": {":read": {"N": str(record.version)}},
        }
        try:
            # Only a job that holds the lock gives it back: a finished job's record is still written (status
            # copying the nodes' last answers) after the next job took the lock, and the Delete's condition
            # would then cancel the whole transaction. The lock cannot become this job's after the read
            # (create never takes it for an existing record); if another writer gave it back after the read,
            # that writer saved a final state, so the Put's version condition fails: StaleRecord.
            if written.state in FINAL_STATES and self.active_job_id() == record.job_id:
                self.dynamodb.transact_write_items(TransactItems=[
                    {"Put": put},
                    {"Delete": {
                        "TableName": self.table_name,
                        "Key": {"pk": {"S": LOCK_KEY}},
                        # only this job's lock: a lock already given back is not an error
                        "ConditionExpression": "attribute_not_exists(pk) OR jobId = :job",
                        "ExpressionAttributeValues": {":job": {"S": record.job_id}},
                    }},
                ])
            else:
                self.dynamodb.put_item(**put)
        except botocore.exceptions.ClientError as e:
            if _error_code(e) not in ("ConditionalCheckFailedException", "TransactionCanceledException"):
                raise
            raise StaleRecord(f"job {record.job_id} changed while it was being updated; read it again") from None
        return written

    def release_lock(self, job_id: str) -> bool:
        """Gives the lock back if `job_id` holds it (a record in a final state whose lock was left behind)."""
        try:
            self.dynamodb.delete_item(
                TableName=self.table_name,
                Key={"pk": {"S": LOCK_KEY}},
                ConditionExpression="jobId = :job",
                ExpressionAttributeValues={":job": {"S": job_id}},
            )
        except botocore.exceptions.ClientError as e:
            if _error_code(e) != "ConditionalCheckFailedException":
                raise
            return False
        return True
