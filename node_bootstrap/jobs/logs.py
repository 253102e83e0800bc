"""Ships one job's log to CloudWatch Logs: a per-job agent config fragment, merged with `append-config`."""

import os
import subprocess

from node_bootstrap.jobs.settings import JobSettings, under_root
from node_bootstrap.jobs.spec import write_json_atomic

CLOUDWATCH_AGENT_CTL = "/opt/aws/amazon-cloudwatch-agent/bin/amazon-cloudwatch-agent-ctl"
CLOUDWATCH_JOBS_CONFIG_DIR = "/etc/cluster/cloudwatch-agent-jobs"


METRICS_STREAM = "metrics/jobs/{job_id}/{{instance_id}}"  # outside jobs/<id>/: `clusterctl logs` shows no EMF


def build_cloudwatch_config(settings: JobSettings, job_id: str, log_path: str,
                            metrics_path: str = "") -> dict[str, object]:
    """An agent config fragment that ships this job's log, and the metrics the supervisor publishes for it
    (job_metrics.py) to a stream of their own; `append-config` merges it with the bootstrap's."""
    metrics = [{"file_path": metrics_path, "log_group_name": settings.log_group_name,
                "log_stream_name": METRICS_STREAM.format(job_id=job_id)}] if metrics_path else []
    return {
        "logs": {
            "logs_collected": {
                "files": {
                    "collect_list": [
                        {
                            "file_path": log_path,
                            "log_group_name": settings.log_group_name,
                            # {instance_id} is expanded by the agent (CloudWatch agent configuration docs).
                            "log_stream_name": f"jobs/{job_id}/{{instance_id}}",
                        }
                    ] + metrics
                }
            }
        }
    }


def maybe_ship_job_log(settings: JobSettings, job_id: str, log_path: str, metrics_path: str = "") -> str:
    """Adds the job log to the CloudWatch agent when the agent is installed; returns what happened. A
    failure here does not stop the job: its log is still on the node."""
    ctl = under_root(settings.root, CLOUDWATCH_AGENT_CTL)
    if not os.access(ctl, os.X_OK):
        return f"CloudWatch agent not installed: the job log is only on the node at {log_path}"
    config_dir = under_root(settings.root, CLOUDWATCH_JOBS_CONFIG_DIR)
    os.makedirs(config_dir, exist_ok=True)
    config_path = os.path.join(config_dir, job_id + ".json")
    write_json_atomic(config_path, build_cloudwatch_config(settings, job_id, log_path, metrics_path))
    argv = [ctl, "-a", "append-config", "-m", "ec2", "-c", "file:" + config_path, "-s"]
    try:
        result = subprocess.run(argv, stdout=subprocess.PIPE, stderr=subprocess.STDOUT, timeout=120,
                                text=True)
    except (OSError, subprocess.TimeoutExpired) as e:
        return f"CloudWatch agent append-config failed: {e}"
    if result.returncode != 0:
        tail = result.stdout.strip().splitlines()[-1:] or ["no output"]
        return f"CloudWatch agent append-config exited {result.returncode}: {tail[0]}"
    return f"shipping to CloudWatch Logs {settings.log_group_name} stream jobs/{job_id}/<instance id>"
