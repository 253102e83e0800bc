"""The ``[metrics]`` section (training/metrics.py, training/tensorboard.py; docs/observability.md).

Apart from training.config.sections only to keep modules small; like it, no torch: clusterctl validates these
settings with training.config.load_config on a machine without torch.
"""

from __future__ import annotations

import os
from collections.abc import Mapping
from dataclasses import dataclass

from training.config.sections import JOB_ID_ENV
from training.errors import ConfigError

# when to write EMF step records and TensorBoard event files
EMF_MODES = ("auto", "on", "off")


@dataclass
class MetricsConfig:
    """The ``[metrics]`` section. How often to log is ``run.log_interval_steps``."""

    # JSON lines on rank 0's stdout, which the jobs launcher reads: one per logged step, and the resume line
    json_lines: bool = True
    progress: bool = True  # a short human-readable progress line per logged step on rank 0's stderr
    nvml: bool = True  # add GPU utilization, temperature, power and clocks through NVML when available
    # Refused when true: publishing with PutMetricData from the job needed the node role's credentials, and
    # jobs no longer get them (docs/security.md). The EMF lines below reach CloudWatch through the agent.
    cloudwatch: bool = False
    # The namespace written into the EMF lines. No effect on the cluster: the job supervisor publishes the
    # trainer's metrics under the node config's metrics.namespace, whatever the line says
    # (node_bootstrap/jobs/job_metrics.py); it counts only where the lines reach CloudWatch as printed.
    cloudwatch_namespace: str = "TrainingCluster"
    # "auto": a CloudWatch EMF line per logged step on rank 0's stderr when running as a cluster job
    # (CLUSTER_JOB_ID set by the job supervisor); "on" / "off" force it.
    emf: str = "auto"
    # TensorBoard event files in <checkpoint.dir>/tensorboard/ from rank 0 (training/tensorboard.py): "auto" in a
    # cluster job with a checkpoint.dir; "on" (needs checkpoint.dir) / "off" force it
    tensorboard: str = "auto"

    def validate(self) -> None:
        for key in ("emf", "tensorboard"):
            if getattr(self, key) not in EMF_MODES:
                raise ConfigError(f"metrics.{key}={getattr(self, key)!r}: allowed: {', '.join(EMF_MODES)}")
        if self.cloudwatch:
            raise ConfigError(
                "metrics.cloudwatch=true: allowed: false. Jobs have no AWS credentials (docs/security.md); step "
                "metrics reach CloudWatch as EMF lines the nodes' CloudWatch agent ships: metrics.emf='auto' "
                "(the default: on in cluster jobs) or 'on'"
            )
        if not self.cloudwatch_namespace or self.cloudwatch_namespace.startswith("AWS/"):
            raise ConfigError(
                f"metrics.cloudwatch_namespace={self.cloudwatch_namespace!r}: allowed: a non-empty name "
                "not starting with 'AWS/'"
            )

    def emf_enabled(self, environ: Mapping[str, str] | None = None) -> bool:
        environ = os.environ if environ is None else environ
        return self.emf == "on" or (self.emf == "auto" and bool(environ.get(JOB_ID_ENV)))
