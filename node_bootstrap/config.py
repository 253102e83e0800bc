"""The node config (/etc/cluster/node-config.json) as frozen dataclasses.

The stack renders this file at synth time (cluster_constructs/node_config.py); its schema is
docs/architecture.md section 2. Every missing or invalid key fails with one line that names the key, the value
and what is allowed, because a node that guesses a default would be healthy-looking and wrong.
"""

from __future__ import annotations

import json
import re
from dataclasses import dataclass
from typing import Any, TypeVar

from node_bootstrap.package_lock import FP8_BACKEND_PACKAGES

DEFAULT_CONFIG_PATH = "/etc/cluster/node-config.json"
SCHEMA_VERSION = 5  # must match cluster_constructs/node_config.py

FP8_BACKENDS = ("none", *FP8_BACKEND_PACKAGES)  # training.fp8Backends values
MIN_MONITOR_INTERVAL_SECONDS = 10  # a round runs nvidia-smi, fi_info and the aws CLI: seconds of work
# training.jobHangFloorSeconds when the node config has none: the least a learned hang timeout can be. Longer
# than the pauses between step lines the trainer makes on purpose before their interval was seen (a
# checkpoint's staging wait, a local-tier replica transfer, a validation: seconds to tens of seconds on the
# presets) and shorter than the process-group timeout (parallel.train_timeout_seconds, 300 s), so a rank
# stuck outside a collective is found before a peer stuck inside one times out (docs/operations.md).
DEFAULT_JOB_HANG_FLOOR_SECONDS = 120
# training.jobStepHangFloorSeconds when the node config has none: with a trainer that prints its phase records
# (a save, a validation, a compile: node_bootstrap/jobs/progress.py) the least the timeout learned from the steps
# between phases can be. Seconds: a P5 step at 8B takes a few (issue 45).
DEFAULT_JOB_STEP_HANG_FLOOR_SECONDS = 20
# DynamoDB's table names (Amazon DynamoDB Developer Guide, "Naming rules")
TABLE_NAME_RE = re.compile(r"^[A-Za-z0-9_.-]{3,255}$")

T = TypeVar("T")


class ConfigError(ValueError):
    """The node config is missing, unreadable or invalid; the message names the key."""


@dataclass(frozen=True)
class ExpectedHardware:
    gpu_count: int  # GPUs nvidia-smi must list
    gpu_memory_gib: int  # memory per GPU from the catalog
    efa_interface_count: int  # EFA devices `fi_info -p efa` must list
    nvme_device_count: int  # instance-store NVMe devices
    nvswitch: bool  # GPUs joined by NVSwitches: NVIDIA Fabric Manager must run before CUDA works
    fp8: bool  # FP8 tensor cores (H100, H200, B200; not A100): the health gate runs an FP8 matmul on each GPU


@dataclass(frozen=True)
class ScratchConfig:
    mount_point: str  # where the node's fast scratch lives, e.g. /scratch
    dlami_mount_point: str  # where the DLAMI mounts the instance-store array before user-data runs


@dataclass(frozen=True)
class LustreConfig:
    dns_name: str  # fs-....fsx.<region>.amazonaws.com
    mount_name: str  # the file system's MountName
    mount_point: str  # e.g. /fsx
    efa_enabled: bool  # the file system was created with EFA support

    @property
    def source(self) -> str:
        """The mount source, as the FSx User Guide writes it: dns@tcp:/mountname."""
        return f"{self.dns_name}@tcp:/{self.mount_name}"


@dataclass(frozen=True)
class BootstrapConfig:
    deadline_seconds: int  # the whole boot sequence must end within this; then the node is marked failed
    auto_scaling_group_name: str  # the node's group: protected mode suspends its replacements
    protected_mode_failures: int  # this many failures in a row, for the same reason, stop replacements
    protected_mode_window_seconds: int  # ... counted within this window


@dataclass(frozen=True)
class LoggingConfig:
    log_group_name: str


@dataclass(frozen=True)
class MetricsConfig:
    interval_seconds: int  # how often the agent and the EFA collector sample
    namespace: str  # CloudWatch namespace of the EFA collector's EMF metrics
    auto_scaling_group_name: str  # the group dimension the dashboard and alarms filter on (bootstrap section's)
    efa_metrics_dir: str  # where the EFA collector writes its EMF files (the agent tails them)


@dataclass(frozen=True)
class TrainingConfig:
    bundle_dir: str  # the unpacked bundle: node_bootstrap/, training/, cluster_constructs/
    env_file: str  # KEY=value lines that jobs source
    python: str  # the DLAMI's PyTorch interpreter
    lock_file: str  # the training lock (training/node-requirements.txt in the bundle)
    wheelhouse_dir: str  # the lock's wheels, in the bundle
    packages_dir: str  # where the packages step installs the lock, one directory per lock and torch
    fp8_backends: tuple[str, ...]  # fp8.backend values the lock provides ("none" first)
    jobs_dir: str
    job_log_dir: str
    checkpoint_root: str
    data_root: str
    rendezvous_port: int
    job_hang_timeout_seconds: int  # no trainer step for this long: the supervisor stops the job as hung; 0: off
    job_start_timeout_seconds: int  # ... and this long for the first step after a start or a restart
    # the least a learned hang timeout can be (node_bootstrap/jobs/progress.py); optional in the node config
    job_hang_floor_seconds: int = DEFAULT_JOB_HANG_FLOOR_SECONDS
    # ... and the least one learned from the steps between a trainer's phases can be; optional too
    job_step_hang_floor_seconds: int = DEFAULT_JOB_STEP_HANG_FLOOR_SECONDS
    # the job table (cluster_jobs/table.py) a `start` checks its job and attempt against (node_bootstrap/jobs/
    # job_table.py); "": none named (a node config rendered before it existed, a test's fake node): unchecked
    job_table_name: str = ""


@dataclass(frozen=True)
class MonitorConfig:
    interval_seconds: int  # the node health monitor runs a round this often; 0: the monitor is off

    @property
    def enabled(self) -> bool:
        return self.interval_seconds > 0


@dataclass(frozen=True)
class NodeConfig:
    schema_version: int
    stack_name: str
    region: str
    instance_type: str
    expected: ExpectedHardware
    scratch: ScratchConfig
    lustre: LustreConfig
    logging: LoggingConfig
    metrics: MetricsConfig
    cloudwatch_agent: dict[str, Any]  # the agent's JSON configuration, written as rendered by the stack
    training: TrainingConfig
    bootstrap: BootstrapConfig
    monitor: MonitorConfig


def load_node_config(path: str) -> NodeConfig:
    """Read and validate the node config at `path` (a host path)."""
    try:
        with open(path, encoding="utf-8") as f:
            text = f.read()
    except OSError as e:
        raise ConfigError(f"cannot read node config {path}: {e.strerror or e}") from None
    try:
        data = json.loads(text)
    except json.JSONDecodeError as e:
        raise ConfigError(f"node config {path} is not valid JSON: {e}") from None
    return parse_node_config(data)


def parse_node_config(data: Any) -> NodeConfig:
    """Build a NodeConfig from the decoded JSON document."""
    r = _Reader(data, "")
    version = r.integer("schemaVersion", minimum=1)
    if version != SCHEMA_VERSION:
        raise ConfigError(
            f"schemaVersion={version} is not supported by this node_bootstrap; allowed: {SCHEMA_VERSION}"
        )
    expected = r.section("expected")
    scratch = r.section("scratch")
    lustre = r.section("lustre")
    logging_ = r.section("logging")
    metrics = r.section("metrics")
    agent = r.section("cloudwatchAgent")
    training = r.section("training")
    bootstrap = r.section("bootstrap")
    monitor = r.section("monitor")
    interval = monitor.integer("intervalSeconds", minimum=0, maximum=3600)
    if 0 < interval < MIN_MONITOR_INTERVAL_SECONDS:
        raise ConfigError(f"monitor.intervalSeconds={interval} is out of range; allowed: 0 (off) or an integer "
                          f"from {MIN_MONITOR_INTERVAL_SECONDS} to 3600")
    return NodeConfig(
        schema_version=version,
        stack_name=r.string("stackName"),
        region=r.string("region"),
        instance_type=r.string("instanceType"),
        expected=ExpectedHardware(
            gpu_count=expected.integer("gpuCount", minimum=1),
            gpu_memory_gib=expected.integer("gpuMemoryGiB", minimum=1),
            efa_interface_count=expected.integer("efaInterfaceCount", minimum=0),
            nvme_device_count=expected.integer("nvmeDeviceCount", minimum=0),
            nvswitch=expected.boolean("nvswitch"),
            fp8=expected.boolean("fp8"),
        ),
        scratch=ScratchConfig(
            mount_point=scratch.abs_path("mountPoint"),
            dlami_mount_point=scratch.abs_path("dlamiMountPoint"),
        ),
        lustre=LustreConfig(
            dns_name=lustre.string("dnsName"),
            mount_name=lustre.string("mountName"),
            mount_point=lustre.abs_path("mountPoint"),
            efa_enabled=lustre.boolean("efaEnabled"),
        ),
        logging=LoggingConfig(log_group_name=logging_.string("logGroupName")),
        metrics=MetricsConfig(
            interval_seconds=metrics.integer("intervalSeconds", minimum=1, maximum=3600),
            namespace=metrics.string("namespace"),
            auto_scaling_group_name=bootstrap.string("autoScalingGroupName"),
            efa_metrics_dir=metrics.abs_path("efaMetricsDir"),
        ),
        cloudwatch_agent=agent.raw(required=("logs",)),
        training=TrainingConfig(
            bundle_dir=training.abs_path("bundleDir"),
            env_file=training.abs_path("envFile"),
            python=training.abs_path("python"),
            lock_file=training.abs_path("lockFile"),
            wheelhouse_dir=training.abs_path("wheelhouseDir"),
            packages_dir=training.abs_path("packagesDir"),
            fp8_backends=training.string_list("fp8Backends", allowed=FP8_BACKENDS),
            jobs_dir=training.abs_path("jobsDir"),
            job_log_dir=training.abs_path("jobLogDir"),
            checkpoint_root=training.abs_path("checkpointRoot"),
            data_root=training.abs_path("dataRoot"),
            rendezvous_port=training.integer("rendezvousPort", minimum=1, maximum=65535),
            job_hang_timeout_seconds=training.integer("jobHangTimeoutSeconds", minimum=0),
            job_start_timeout_seconds=training.integer("jobStartTimeoutSeconds", minimum=1),
            job_hang_floor_seconds=training.integer("jobHangFloorSeconds", minimum=1,
                                                    default=DEFAULT_JOB_HANG_FLOOR_SECONDS),
            job_step_hang_floor_seconds=training.integer("jobStepHangFloorSeconds", minimum=1,
                                                         default=DEFAULT_JOB_STEP_HANG_FLOOR_SECONDS),
            job_table_name=training.optional_match("jobTableName", TABLE_NAME_RE,
                                                   "a DynamoDB table name: 3-255 of A-Z a-z 0-9 _ . -"),
        ),
        bootstrap=BootstrapConfig(
            deadline_seconds=bootstrap.integer("deadlineSeconds", minimum=60),
            auto_scaling_group_name=bootstrap.string("autoScalingGroupName"),
            protected_mode_failures=bootstrap.integer("protectedModeFailures", minimum=1, maximum=100),
            protected_mode_window_seconds=bootstrap.integer("protectedModeWindowSeconds", minimum=60),
        ),
        monitor=MonitorConfig(interval_seconds=interval),
    )


class _Reader:
    """Typed access to one JSON object; errors carry the dotted key."""

    def __init__(self, data: Any, prefix: str) -> None:
        if not isinstance(data, dict):
            where = prefix.rstrip(".") or "the node config"
            raise ConfigError(f"{where} must be a JSON object, got {_json_type(data)}")
        self._data: dict[str, Any] = data
        self._prefix = prefix

    def section(self, key: str) -> _Reader:
        return _Reader(self._get(key, dict), self._prefix + key + ".")

    def raw(self, *, required: tuple[str, ...] = ()) -> dict[str, Any]:
        """The whole object as decoded JSON, after checking that `required` keys are present."""
        for key in required:
            self._get(key, dict)
        return self._data

    def string(self, key: str) -> str:
        value = self._get(key, str)
        if not value.strip():
            raise ConfigError(f"{self._prefix + key} must be a non-empty string, got {value!r}")
        return value

    def optional_match(self, key: str, pattern: re.Pattern[str], allowed: str) -> str:
        """An optional string `pattern` matches whole; "" when the key is absent or empty."""
        if key not in self._data or self._data[key] == "":
            return ""
        value = self._get(key, str)
        if not pattern.fullmatch(value):
            raise ConfigError(f"{self._prefix + key}={value!r}: allowed: {allowed}")
        return value

    def abs_path(self, key: str) -> str:
        value = self.string(key)
        if not value.startswith("/") or "\n" in value:
            raise ConfigError(f"{self._prefix + key}={value!r} must be an absolute path (starting with /)")
        return value.rstrip("/") or "/"

    def integer(self, key: str, *, minimum: int, maximum: int = 2**31, default: int | None = None) -> int:
        """`default`: the key is optional (a node config rendered before it existed)."""
        if default is not None and key not in self._data:
            return default
        value = self._get(key, int)
        if isinstance(value, bool) or not minimum <= value <= maximum:
            raise ConfigError(
                f"{self._prefix + key}={value!r} is out of range; "
                f"allowed: an integer from {minimum} to {maximum}"
            )
        return value

    def string_list(self, key: str, *, allowed: tuple[str, ...]) -> tuple[str, ...]:
        value = self._get(key, list)
        wrong = [v for v in value if v not in allowed]
        if wrong or len(set(value)) != len(value):
            raise ConfigError(f"{self._prefix + key}={json.dumps(value)}: allowed: distinct values from "
                              f"{', '.join(allowed)}")
        return tuple(value)

    def boolean(self, key: str) -> bool:
        return self._get(key, bool)

    def _get(self, key: str, kind: type[T]) -> T:
        name = self._prefix + key
        if key not in self._data:
            raise ConfigError(f"missing key {name} in the node config")
        value = self._data[key]
        if not isinstance(value, kind) or (kind is int and isinstance(value, bool)):
            raise ConfigError(
                f"{name}={json.dumps(value)} has the wrong type; allowed: {_TYPE_NAMES[kind]}"
            )
        return value


_TYPE_NAMES = {str: "a string", int: "an integer", bool: "true or false", dict: "a JSON object",
               list: "a JSON array"}


def _json_type(value: Any) -> str:
    if isinstance(value, list):
        return "an array"
    if value is None:
        return "null"
    return type(value).__name__
