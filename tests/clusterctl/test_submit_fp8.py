"""submit and the nodes' FP8 backends: a config whose fp8.backend the nodes do not provide (the stack's
Fp8Backends output, from the training lock) is refused before any node is touched, in one line naming what
installs it; the backend a job runs is recorded and `clusterctl status` shows it."""

import json

from job_record_fakes import REPO, TINY

from cluster_aws.errors import EXIT_OK, EXIT_USAGE
from cluster_constructs.bundle import read_lock
from cluster_jobs.request import JobRequest


def test_a_te_config_on_nodes_without_te_is_refused_before_any_node_is_touched(at_now, sent, cluster, fakes):
    cli = at_now
    result = cli("submit", "--config", TINY, "--set", "fp8.backend=te")
    assert result.code == EXIT_USAGE
    assert result.err.strip() == (
        f"clusterctl: error: not submitted: {TINY} runs fp8.backend='te', and the nodes of stack "
        f"{fakes.STACK} provide none, torchao: add Transformer Engine (transformer-engine-torch and its core "
        "wheels) to the training lock training/node-requirements.txt and redeploy (README, 'FP8 on the nodes'), "
        "or --set fp8.backend=torchao")
    assert sent == [] and list(fakes.job_table().jobs()) == []  # no command, no record
    assert fakes.job_table().active_job_id() is None  # and no lock


def test_every_bundled_config_runs_on_the_nodes_as_deployed():
    # the configs a user submits first ask for what the default lock installs
    provided = read_lock().fp8_backends()
    assert provided == ["none", "torchao"]
    for config in sorted((REPO / "training" / "configs").glob("*.toml")):
        request = JobRequest(config=f"training/configs/{config.name}", nodes=2, gpus_per_node=8, max_restarts=0)
        assert request.require_fp8_backend(tuple(provided), "S") in provided, config.name


def test_the_backend_is_recorded_and_shown_by_status(at_now, sent, cluster, fakes):
    cli = at_now
    result = cli("submit", "--config", TINY, "--set", "fp8.backend=torchao", "--set", "fp8.emulate=true")
    assert result.code == EXIT_OK, result.err
    job_id = result.lines[0]
    assert fakes.job_table().get(job_id).fp8_backend == "torchao"
    shown = cli("status", job_id)
    assert "fp8 backend: torchao" in shown.lines


def test_a_stack_deployed_before_the_output_is_not_checked(at_now, sent, moto_aws, fakes):
    fakes.deploy_fake_cluster(fp8_backends=None)
    result = at_now("submit", "--config", TINY, "--set", "fp8.backend=te", "--json")
    assert result.code == EXIT_OK, result.err
    assert json.loads(result.out)["jobId"]
