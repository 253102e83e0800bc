"""The CloudWatch Embedded Metric Format (EMF) rules, as tests check them, and what CloudWatch extracts.

From the CloudWatch User Guide, "Specification: Embedded metric format":
- the log event is a JSON object with nothing before or after it;
- the root has `_aws`, an object with `Timestamp` (an integer: milliseconds since the epoch) and
  `CloudWatchMetrics`, an array of MetricDirective objects;
- a MetricDirective has `Namespace` (a string of 1-255 characters), `Dimensions` (an array of DimensionSets:
  arrays of at most 30 dimension keys, each a root member with a string value) and `Metrics` (at most 100
  MetricDefinitions: `Name`, a root member whose value is a number or an array of at most 100 numbers, and an
  optional `Unit` among CloudWatch's units);
- the event is limited to 1 MB (256 KB in older versions of the page: the tests hold lines to that).
And from the CloudWatch agent (plugins/outputs/cloudwatchlogs, cwDest.Publish): a stream is sent as EMF once a
line starts with "{", ends with "}" and contains "CloudWatchMetrics".
"""

from __future__ import annotations

import json
import math
from typing import Any

UNITS = {
    "Seconds", "Microseconds", "Milliseconds", "Bytes", "Kilobytes", "Megabytes", "Gigabytes", "Terabytes",
    "Bits", "Kilobits", "Megabits", "Gigabits", "Terabits", "Percent", "Count", "Bytes/Second",
    "Kilobytes/Second", "Megabytes/Second", "Gigabytes/Second", "Terabytes/Second", "Bits/Second",
    "Kilobits/Second", "Megabits/Second", "Gigabits/Second", "Terabits/Second", "Count/Second", "None",
}
MAX_EVENT_BYTES = 256 * 1024
MAX_DIMENSION_KEYS = 30
MAX_METRICS = 100


class EmfError(AssertionError):
    pass


def _check(condition: bool, message: str) -> None:
    if not condition:
        raise EmfError(message)


def parse_emf_line(line: str) -> dict[str, Any]:
    """Validate one log line as an EMF document and return it."""
    _check(len(line.encode()) <= MAX_EVENT_BYTES, f"event of {len(line.encode())} bytes is over 256 KB")
    _check(line.startswith("{") and line.endswith("}"), "an EMF event is a JSON object and nothing else")
    _check('"CloudWatchMetrics"' in line, "the agent only treats lines with CloudWatchMetrics as EMF")
    document = json.loads(line)  # strict: NaN/Infinity would fail here only with parse_constant
    validate_emf(document)
    return document


def validate_emf(document: Any) -> None:
    _check(isinstance(document, dict), "the root is a JSON object")
    meta = document.get("_aws")
    _check(isinstance(meta, dict), "the root has an _aws object")
    timestamp = meta.get("Timestamp")
    _check(isinstance(timestamp, int) and not isinstance(timestamp, bool),
           f"_aws.Timestamp is an integer, got {timestamp!r}")
    _check(1_500_000_000_000 < timestamp < 4_000_000_000_000, f"_aws.Timestamp {timestamp} is not epoch ms")
    directives = meta.get("CloudWatchMetrics")
    _check(isinstance(directives, list) and directives, "_aws.CloudWatchMetrics is a non-empty array")
    for directive in directives:
        _check(isinstance(directive, dict), "a MetricDirective is an object")
        _check(set(directive) >= {"Namespace", "Dimensions", "Metrics"}, f"directive members: {set(directive)}")
        namespace = directive["Namespace"]
        _check(isinstance(namespace, str) and 1 <= len(namespace) <= 255, f"Namespace {namespace!r}")
        _check(not namespace.startswith("AWS/"), "AWS/ namespaces are reserved")
        dimension_sets = directive["Dimensions"]
        _check(isinstance(dimension_sets, list) and dimension_sets, "Dimensions is a non-empty array")
        for dimension_set in dimension_sets:
            _check(isinstance(dimension_set, list) and len(dimension_set) <= MAX_DIMENSION_KEYS,
                   f"a DimensionSet is an array of at most {MAX_DIMENSION_KEYS} keys: {dimension_set!r}")
            for key in dimension_set:
                _check(isinstance(key, str) and 1 <= len(key) <= 255, f"dimension key {key!r}")
                _check(isinstance(document.get(key), str) and document[key] != "",
                       f"dimension {key} is a root member with a non-empty string value")
        metrics = directive["Metrics"]
        _check(isinstance(metrics, list) and len(metrics) <= MAX_METRICS, f"at most {MAX_METRICS} metrics")
        for definition in metrics:
            _check(isinstance(definition, dict) and isinstance(definition.get("Name"), str),
                   f"a MetricDefinition has a Name: {definition!r}")
            name = definition["Name"]
            _check(1 <= len(name) <= 255, f"metric name {name!r}")
            _check("Unit" not in definition or definition["Unit"] in UNITS, f"unit of {name}: {definition}")
            value = document.get(name)
            values = value if isinstance(value, list) else [value]
            _check(len(values) <= 100, f"{name}: at most 100 values")
            for v in values:
                _check(isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v),
                       f"metric {name} is a root member with a number, got {v!r}")


def extracted_metrics(document: dict[str, Any]) -> list[dict[str, Any]]:
    """What CloudWatch Logs publishes for a valid EMF document: one datum per metric and DimensionSet, in
    PutMetricData's shape plus the namespace."""
    data = []
    for directive in document["_aws"]["CloudWatchMetrics"]:
        for dimension_set in directive["Dimensions"]:
            for definition in directive["Metrics"]:
                name = definition["Name"]
                data.append({
                    "Namespace": directive["Namespace"],
                    "MetricName": name,
                    "Dimensions": [{"Name": k, "Value": document[k]} for k in dimension_set],
                    "Value": float(document[name]),
                    "Unit": definition.get("Unit", "None"),
                    "TimestampMs": document["_aws"]["Timestamp"],
                })
    return data
