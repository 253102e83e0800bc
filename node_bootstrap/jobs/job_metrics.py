"""Metrics come only from the node's own processes (issue 42): what a job prints is never turned into metrics as
printed.

Why: the CloudWatch agent switches a log stream to Embedded Metric Format once one of its lines is a JSON object
containing "CloudWatchMetrics" (cluster_constructs/cloudwatch_agent.py), and CloudWatch Logs then extracts
whatever metric such a line names, in any namespace, with any dimensions. Shipped as printed, a job could
publish TrainingCluster/NodeUnhealthy=1 for its group and fire the node health alarm, with no credentials.

How: the supervisor (root) writes every job line that holds "CloudWatchMetrics" to the job log behind DEFUSED,
so no job-log line is EMF and the job's stream is never switched. From such a line it takes only what the
trainer's step record legitimately carries (training/metrics.py build_emf_record): the metric names of
TRAINER_METRICS with their units, each a finite number; the namespace, the dimensions and their values it sets
itself (the node config's metrics namespace, Cluster = the stack's name, JobId = the job's id). That document
goes to the job's metrics file, root's, shipped to a stream of its own (logs.py). A job can thus publish its
own training metrics (wrong ones, if it lies), and no other metric, namespace or dimension.

Standard library only (Python >= 3.9).
"""

import json
import math
import os
import sys
import time
from typing import BinaryIO, Optional

from node_bootstrap.jobs.job_output import file_size
from node_bootstrap.jobs.job_report import Rejections

EMF_TOKEN = b"CloudWatchMetrics"
# In front of a job's EMF-looking line in the job log: the line no longer starts with "{", so the agent does not
# take it (or its stream) for EMF; people still read what the job printed.
DEFUSED = b"[node_bootstrap.jobs: EMF from the job, published through the supervisor] "
# The trainer's step metrics and their units (training/metrics.py _EMF_METRICS; tests/node_bootstrap/
# test_job_metrics.py holds the two lists equal).
TRAINER_METRICS = {
    "Step": "Count", "RunSteps": "Count", "EtaSeconds": "Seconds", "Loss": "None", "LearningRate": "None",
    "GradNorm": "None", "TokensPerSecond": "Count/Second", "TFLOPSPerGPU": "None", "MFU": "Percent",
    "StepTimeMax": "Seconds", "StepTimeMedian": "Seconds", "StepTimeMin": "Seconds", "StragglerRatio": "None",
    "SlowestRank": "None", "PeakMemoryGiB": "None", "ValidationLoss": "None", "ValidationPerplexity": "None",
    "Goodput": "Percent",
}
# Also published per cluster (the alarms' fixed dimensions): training/metrics.py _EMF_CLUSTER_METRICS.
CLUSTER_METRICS = ("TokensPerSecond", "MFU", "StragglerRatio")
MAX_VALUE = 1e15  # far above any of them (steps, tokens/s); a bound keeps a value a plain number


def trainer_values(line: bytes, rejected: Rejections) -> Optional[dict[str, float]]:
    """The values of TRAINER_METRICS in a job's EMF line, each a finite number; None when the line is no JSON
    object with such values (counted as "emf"). Whatever else the line names is ignored."""
    text = line.decode("utf-8", "replace")
    start = text.find("{")
    try:
        document = json.loads(text[start:]) if start >= 0 else None
    except (ValueError, RecursionError):
        document = None
    if not isinstance(document, dict):
        rejected.add("emf")
        return None
    values: dict[str, float] = {}
    for name in TRAINER_METRICS:
        value = document.get(name)
        if value is None:
            continue
        if isinstance(value, (int, float)) and not isinstance(value, bool) and math.isfinite(value) \
                and abs(value) <= MAX_VALUE:
            values[name] = float(value)
        else:
            rejected.add("emf")
    if not values:
        rejected.add("emf")
        return None
    return values


def build_document(values: dict[str, float], *, namespace: str, cluster: str, job_id: str,
                   timestamp_ms: Optional[int] = None) -> dict[str, object]:
    """The EMF document the supervisor publishes for `values`: the trainer's shape, the node's namespace and
    dimensions."""
    directives = [{"Namespace": namespace, "Dimensions": [["Cluster", "JobId"]],
                   "Metrics": [{"Name": n, "Unit": TRAINER_METRICS[n]} for n in values]}]
    cluster_metrics = [n for n in CLUSTER_METRICS if n in values]
    if cluster_metrics:
        directives.append({"Namespace": namespace, "Dimensions": [["Cluster"]],
                           "Metrics": [{"Name": n, "Unit": TRAINER_METRICS[n]} for n in cluster_metrics]})
    when = int(time.time() * 1000) if timestamp_ms is None else timestamp_ms
    return {"_aws": {"Timestamp": when, "CloudWatchMetrics": directives}, "Cluster": cluster, "JobId": job_id,
            **values}


def looks_like_emf(line: bytes) -> bool:
    """Whether a job line holds the EMF token: as printed, or spelt with JSON escapes in an object (a job's
    "Cloud\\u0057atchMetrics" is the same key to any JSON reader, and so possibly to the agent)."""
    if EMF_TOKEN in line:
        return True
    if b"\\u" not in line or not line.lstrip().startswith(b"{"):
        return False
    try:
        decoded = json.dumps(json.loads(line.decode("utf-8", "replace")))
    except (ValueError, RecursionError):
        return False
    return EMF_TOKEN.decode() in decoded


def defused(line: bytes) -> bytes:
    """A job line as the job log keeps it: behind DEFUSED when it looks like EMF (looks_like_emf)."""
    return DEFUSED + line if looks_like_emf(line) else line


class MetricsFile:
    """A job's metrics file (<jobLogDir>/<job id>.metrics.log), root's, opened at the first EMF line: the
    documents the supervisor publishes, at most `limit_bytes` (the rest counted as "emf")."""

    def __init__(self, path: str, namespace: str, cluster: str, job_id: str, limit_bytes: int,
                 rejected: Rejections) -> None:
        self.path, self.namespace, self.cluster, self.job_id = path, namespace, cluster, job_id
        self.limit_bytes = limit_bytes
        self.rejected = rejected
        self._file: Optional[BinaryIO] = None

    def publish(self, line: bytes) -> None:
        values = trainer_values(line, self.rejected)
        if values is None:
            return
        document = build_document(values, namespace=self.namespace, cluster=self.cluster, job_id=self.job_id)
        data = (json.dumps(document, sort_keys=True) + "\n").encode()
        try:
            if self._file is None:  # never through a link: its directory is root's, and so is the file
                fd = os.open(self.path, os.O_WRONLY | os.O_APPEND | os.O_CREAT | os.O_NOFOLLOW | os.O_CLOEXEC, 0o644)
                self._file = os.fdopen(fd, "ab")
            if file_size(self._file) + len(data) > self.limit_bytes:
                self.rejected.add("emf")
                return
            self._file.write(data)
            self._file.flush()
        except OSError as e:  # the metrics are lost; the job goes on
            self.rejected.add("emf")
            print(f"[node_bootstrap.jobs] cannot write {self.path}: {e}", file=sys.stderr, flush=True)

    def close(self) -> None:
        if self._file is not None:
            self._file.close()
            self._file = None
