"""Which metrics the nodes really publish, and which ones a synthesized template reads.

The producer side is derived from the artefacts themselves, not from the names the dashboard uses:
- the CloudWatch agent's JSON config (as rendered into the node config), interpreted by the agent's documented
  rules (CloudWatch User Guide, "Manually create or edit the CloudWatch agent configuration file" and "Collect
  NVIDIA GPU metrics"; amazon-cloudwatch-agent source: the allow-list in
  translator/translate/metrics/config/registered_metrics.go, the nvidia-smi tags in
  plugins/inputs/nvidia_smi/schema_v11|v12, roll-ups in plugins/outputs/cloudwatch ProcessRollup, the `host`
  dimension dropped with append_dimensions in translator/translate/metrics/ruleTagExclude.go);
- the EMF documents the EFA collector and the trainer really write (tests/emf_spec.py extracts them).
The consumer side is read from the template: the dashboard body's metric arrays and SEARCH expressions, and
every alarm's metrics.
"""

from __future__ import annotations

import json
import re
from collections.abc import Iterable
from dataclasses import dataclass
from typing import Any

from emf_spec import extracted_metrics

# The agent's allow-list (Linux) for the plugins the cluster uses: an unknown measurement fails the config.
REGISTERED_LINUX = {
    "cpu": {"time_active", "time_guest", "time_guest_nice", "time_idle", "time_iowait", "time_irq", "time_nice",
            "time_softirq", "time_steal", "time_system", "time_user", "usage_active", "usage_guest",
            "usage_guest_nice", "usage_idle", "usage_iowait", "usage_irq", "usage_nice", "usage_softirq",
            "usage_steal", "usage_system", "usage_user"},
    "disk": {"free", "inodes_free", "inodes_total", "inodes_used", "total", "used", "used_percent"},
    "mem": {"active", "available", "available_percent", "buffered", "cached", "free", "inactive", "shared",
            "total", "used", "used_percent"},
    "nvidia_smi": {"utilization_gpu", "temperature_gpu", "power_draw", "utilization_memory", "fan_speed",
                   "memory_total", "memory_used", "memory_free", "pcie_link_gen_current",
                   "pcie_link_width_current", "encoder_stats_session_count", "encoder_stats_average_fps",
                   "encoder_stats_average_latency", "clocks_current_graphics", "clocks_current_sm",
                   "clocks_current_memory", "clocks_current_video"},
}
# config section -> (metric name prefix, the tags each variant of the plugin sets on its metrics). nvidia-smi's
# XML schema v11 gives index and name; v12 (current drivers) adds arch; compute_mode, pstate and uuid are on the
# agent's tag deny list. The disk plugin tags path, device, fstype (mode is excluded by the agent).
PLUGINS = {
    "nvidia_gpu": ("nvidia_smi", ({"index", "name"}, {"index", "name", "arch"})),
    "cpu": ("cpu", ({"cpu"},)),
    "mem": ("mem", (set(),)),
    "disk": ("disk", ({"path", "device", "fstype"},)),
}

Metric = tuple[str, str, frozenset[str]]  # namespace, metric name, dimension names


def _measurement_name(item: Any) -> str:
    return item if isinstance(item, str) else item["name"]


def agent_published(config: dict[str, Any]) -> set[Metric]:
    """The (namespace, name, dimension names) the agent publishes for `config`, for every nvidia-smi schema
    variant; a metric counts only if every variant publishes it."""
    metrics = config["metrics"]
    namespace = metrics.get("namespace", "CWAgent")
    appended = set(metrics.get("append_dimensions", {}))
    host = set() if appended else {"host"}
    rollups = [frozenset(d) for d in metrics.get("aggregation_dimensions", [])]
    published: set[Metric] | None = None
    variants = max(len(v[1]) for v in PLUGINS.values())
    for variant in range(variants):
        found: set[Metric] = set()
        for section, plugin in metrics["metrics_collected"].items():
            prefix, tag_variants = PLUGINS[section]
            tags = set(tag_variants[min(variant, len(tag_variants) - 1)])
            if section == "disk" and plugin.get("drop_device"):
                tags.discard("device")
            if section == "cpu" and not plugin.get("totalcpu", True):
                raise AssertionError("the model covers totalcpu only")
            dims = frozenset(tags | appended | host)
            dropped = set(plugin.get("drop_original_metrics", []))
            for item in plugin["measurement"]:
                measurement = _measurement_name(item)
                if measurement not in REGISTERED_LINUX[prefix]:
                    raise AssertionError(f"{section}: measurement {measurement!r} is not in the agent's allow-list")
                name = f"{prefix}_{measurement}"
                if measurement not in dropped:
                    found.add((namespace, name, dims))
                for rollup in rollups:
                    if rollup <= dims and len(rollup) < len(dims):
                        found.add((namespace, name, rollup))
        published = found if published is None else published & found
    return published or set()


def emf_published(lines: Iterable[str]) -> set[Metric]:
    from emf_spec import parse_emf_line

    return {
        (d["Namespace"], d["MetricName"], frozenset(x["Name"] for x in d["Dimensions"]))
        for line in lines
        for d in extracted_metrics(parse_emf_line(line))
    }


def cli_published(argvs: Iterable[tuple[str, ...]]) -> set[Metric]:
    """Metrics put with `aws cloudwatch put-metric-data --namespace N`, either `--metric-name M --dimensions
    K=V,...` or `--metric-data JSON` (a list of MetricDatum)."""
    found: set[Metric] = set()
    for argv in argvs:
        if tuple(argv[:3]) != ("aws", "cloudwatch", "put-metric-data"):
            continue
        option = {argv[i]: argv[i + 1] for i in range(3, len(argv) - 1) if argv[i].startswith("--")}
        if "--metric-data" in option:
            for datum in json.loads(option["--metric-data"]):
                dims = frozenset(d["Name"] for d in datum.get("Dimensions", []))
                found.add((option["--namespace"], datum["MetricName"], dims))
            continue
        dims = frozenset(pair.split("=", 1)[0] for pair in option.get("--dimensions", "").split(",") if pair)
        found.add((option["--namespace"], option["--metric-name"], dims))
    return found


def aws_published(template: dict[str, Any]) -> set[Metric]:
    """AWS metrics the template's resources make available: Auto Scaling group metrics when the group collects
    them (EC2 Auto Scaling User Guide, "Monitor CloudWatch metrics for your Auto Scaling groups"), FSx for
    Lustre's file system metrics (FSx for Lustre User Guide, "Amazon FSx for Lustre metrics") and a Lambda
    function's invocation metrics (Lambda Developer Guide, "Types of metrics for Lambda functions")."""
    found: set[Metric] = set()
    for resource in template["Resources"].values():
        props = resource.get("Properties", {})
        if resource["Type"] == "AWS::AutoScaling::AutoScalingGroup" and props.get("MetricsCollection"):
            for name in ("GroupInServiceInstances", "GroupDesiredCapacity", "GroupMinSize", "GroupMaxSize"):
                found.add(("AWS/AutoScaling", name, frozenset({"AutoScalingGroupName"})))
        if resource["Type"] == "AWS::Lambda::Function":
            for name in ("Invocations", "Errors", "Throttles", "Duration"):
                found.add(("AWS/Lambda", name, frozenset({"FunctionName"})))
        if resource["Type"] == "AWS::FSx::FileSystem":
            for name in ("DataReadBytes", "DataWriteBytes", "FreeDataStorageCapacity", "DataReadOperations",
                         "DataWriteOperations", "MetadataOperations"):
                found.add(("AWS/FSx", name, frozenset({"FileSystemId"})))
    return found


# ----- the consumer side -------------------------------------------------------------------------------
@dataclass(frozen=True)
class Reference:
    where: str  # widget title or alarm id
    namespace: str
    name: str
    dimensions: frozenset[str]
    filters: tuple[tuple[str, str], ...] = ()  # dimension values pinned (SEARCH terms or metric dims)

    @property
    def metric(self) -> Metric:
        return (self.namespace, self.name, self.dimensions)


_SEARCH = re.compile(
    r"SEARCH\('\{(?P<schema>[^}]*)\}(?P<terms>[^']*)',\s*'(?P<stat>[A-Za-z0-9.]+)',\s*(?P<period>\d+)\)"
)
_TERM = re.compile(r'(\w+)="([^"]*)"')


def parse_searches(expression: str, where: str) -> list[Reference]:
    refs = []
    for match in _SEARCH.finditer(expression):
        namespace, *dims = [part.strip() for part in match["schema"].split(",")]
        terms = dict(_TERM.findall(match["terms"]))
        name = terms.pop("MetricName")
        assert set(terms) <= set(dims), f"{where}: SEARCH filters {set(terms)} outside its schema {dims}"
        refs.append(Reference(where, namespace.strip('"'), name, frozenset(dims), tuple(sorted(terms.items()))))
    return refs


def _resolve(value: Any, tokens: dict[str, str]) -> str:
    """A template value as text: strings as they are, CloudFormation intrinsics as a placeholder."""
    if isinstance(value, str):
        return value
    return tokens.setdefault(json.dumps(value, sort_keys=True), f"TOKEN{len(tokens)}")


def dashboard_bodies(template: dict[str, Any]) -> list[dict[str, Any]]:
    bodies = []
    for resource in template["Resources"].values():
        if resource["Type"] != "AWS::CloudWatch::Dashboard":
            continue
        body = resource["Properties"]["DashboardBody"]
        if isinstance(body, dict):
            separator, parts = body["Fn::Join"]
            tokens: dict[str, str] = {}
            body = separator.join(_resolve(p, tokens) for p in parts)
        bodies.append(json.loads(body))
    return bodies


def dashboard_references(template: dict[str, Any]) -> list[Reference]:
    refs = []
    for body in dashboard_bodies(template):
        for widget in body["widgets"]:
            props = widget.get("properties", {})
            title = props.get("title", widget["type"])
            for entry in props.get("metrics", []):
                if isinstance(entry[-1], dict) and "expression" in entry[-1]:
                    refs += parse_searches(entry[-1]["expression"], title)
                    continue
                values = entry[:-1] if isinstance(entry[-1], dict) else entry
                namespace, name, *dims = values
                pairs = tuple(zip(dims[0::2], dims[1::2], strict=True))
                refs.append(Reference(title, namespace, name, frozenset(k for k, _ in pairs),
                                      tuple(sorted(pairs))))
    return refs


def alarm_references(template: dict[str, Any]) -> list[Reference]:
    refs = []
    for logical_id, resource in template["Resources"].items():
        if resource["Type"] != "AWS::CloudWatch::Alarm":
            continue
        props = resource["Properties"]
        stats = [props] if "MetricName" in props else [
            m["MetricStat"]["Metric"] for m in props.get("Metrics", []) if "MetricStat" in m]
        for metric in stats:
            dims = metric.get("Dimensions", [])
            refs.append(Reference(logical_id, metric["Namespace"], metric["MetricName"],
                                  frozenset(d["Name"] for d in dims),
                                  tuple(sorted((d["Name"], json.dumps(d["Value"])) for d in dims))))
    return refs


def unproduced(refs: Iterable[Reference], produced: set[Metric]) -> list[str]:
    """The references no producer publishes, as readable lines (empty when every graph and alarm has data)."""
    return sorted({f"{r.where}: {r.namespace} {r.name} {sorted(r.dimensions)}" for r in refs
                   if r.metric not in produced})
