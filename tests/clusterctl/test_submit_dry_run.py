"""submit checks its config and --set items offline, before any AWS call: `--dry-run` prints what would be sent
without credentials, and a plain submit refuses a bad key in one line before it looks for the stack (issue 28,
"Checking before you spend"). No credentials are in the environment here, and any AWS client made is a failure."""

import json

import boto3
import pytest
from job_record_fakes import TINY

from cluster_aws.errors import EXIT_CREDENTIALS, EXIT_OK, EXIT_USAGE
from cluster_aws.session import AwsContext

REGION = "us-east-1"


@pytest.fixture()
def no_credentials(monkeypatch):
    """An environment with no AWS credentials at all (the clusterctl conftest's fake ones removed; no IMDS, no
    container or web-identity provider, no config files)."""
    for key in ("AWS_ACCESS_KEY_ID", "AWS_SECRET_ACCESS_KEY", "AWS_CONTAINER_CREDENTIALS_RELATIVE_URI",
                "AWS_CONTAINER_CREDENTIALS_FULL_URI", "AWS_WEB_IDENTITY_TOKEN_FILE", "AWS_ROLE_ARN"):
        monkeypatch.delenv(key, raising=False)
    assert boto3.Session(region_name=REGION).get_credentials() is None  # and AWS_EC2_METADATA_DISABLED=true


class NoAws(AwsContext):
    """A context that fails the test on the first AWS client a command asks for."""

    def client(self, service):
        raise AssertionError(f"an AWS client was made: {service}")


@pytest.fixture()
def offline(cli, no_credentials):
    cli.context = NoAws(boto3.Session(region_name=REGION))
    return cli


def test_dry_run_prints_the_settings_and_parameters_with_no_aws_call(offline):
    result = offline("submit", "--config", "training/configs/llama3-8b.toml", "--nodes", "2",
                     "--set", "run.steps=1000", "--set", "optim.lr=2e-4", "--dry-run")
    assert result.code == EXIT_OK, result.err
    assert result.lines[0] == ("dry run: training/configs/llama3-8b.toml with --set run.steps=1000 optim.lr=2e-4 "
                               "is valid; nothing was sent (no AWS call)")
    settings = result.out.split("settings:\n")[1].split("jobs document")[0]
    rows = dict(line.split(None, 1) for line in settings.splitlines())
    assert rows["model.preset"] == "'llama3-8b'" and rows["model.n_layers"] == "32"
    assert rows["run.steps"] == "1000" and rows["optim.lr"] == "0.0002"  # the --set items, applied
    assert rows["fp8.backend"] == "'torchao'" and rows["data.path"] == "'/fsx/data/tokens-llama3'"
    parameters = result.out.split("parameters (one ssm:SendCommand per 50 nodes):\n")[1]
    assert [line.split(None, 1) for line in parameters.splitlines()] == [
        ["action", "start"],
        ["jobId", "<assigned at submit: j-YYYYMMDD-HHMMSS-xxxx>"],
        ["config", "training/configs/llama3-8b.toml"],
        ["nodes", "2"],
        ["gpusPerNode", "<the GPUs of the stack's InstanceType>"],
        ["rendezvousHost", "<the first ready node's private IP>"],
        ["maxRestarts", "3"],
        ["overrides", "run.steps=1000 optim.lr=2e-4"],
    ]


def test_dry_run_as_json_names_what_only_the_stack_knows(offline):
    result = offline("submit", "--config", TINY, "--json", "--dry-run", "--resume-from", "j-20261120-231502-ab12")
    assert result.code == EXIT_OK, result.err
    report = json.loads(result.out)
    assert report["dryRun"] is True and report["settings"]["model.preset"] == "tiny"
    assert report["parameters"]["nodes"] == ["<the stack's NodeCount>"]
    assert report["parameters"]["resumeFrom"] == ["j-20261120-231502-ab12"]


def test_dry_run_of_a_config_on_the_nodes_checks_the_set_items_alone(offline):
    result = offline("submit", "--config", "/fsx/configs/run.toml", "--set", "run.steps=10", "--dry-run",
                     "--remote-path")
    assert result.code == EXIT_OK, result.err
    assert "/fsx/configs/run.toml is a path on the nodes: not read here" in result.out
    bad = offline("submit", "--config", "/fsx/configs/run.toml", "--set", "run.stepz=10", "--dry-run",
                  "--remote-path")
    assert bad.code == EXIT_USAGE and "run.stepz: unknown key" in bad.err


def test_dry_run_of_a_path_it_cannot_read_says_not_checked_and_fails(offline):
    # issue 44: it printed "is valid" for a file it never read
    result = offline("submit", "--config", "/fsx/configs/run.toml", "--dry-run")
    assert (result.code, result.out) == (EXIT_USAGE, "")
    assert result.err == ("clusterctl: error: dry run: /fsx/configs/run.toml: not checked (no such file on this "
                          "machine); pass --remote-path if it is a path on the nodes (the --set items alone are "
                          "then checked)\n")


def test_dry_run_reads_a_local_absolute_path_and_refuses_an_unknown_key(offline, tmp_path):
    config = tmp_path / "run.toml"
    config.write_text('[model]\npreset = "tiny"\n[run]\nstpes = 100\n')
    bad = offline("submit", "--config", str(config), "--dry-run")
    assert (bad.code, bad.out) == (EXIT_USAGE, "")
    assert bad.err.startswith(f"clusterctl: error: not submitted: {config} with the --set items: run.stpes: "
                              "unknown key; allowed: seed, steps,")
    config.write_text('[model]\npreset = "tiny"\n[run]\nsteps = 100\n')
    good = offline("submit", "--config", str(config), "--dry-run", "--json")
    assert good.code == EXIT_OK, good.err
    assert json.loads(good.out)["settings"]["run.steps"] == 100


def test_a_packaged_name_is_its_file_in_the_bundle(offline):
    result = offline("submit", "--config", "1b", "--dry-run", "--json")
    assert result.code == EXIT_OK, result.err
    report = json.loads(result.out)
    assert report["config"] == "training/configs/1b.toml" and report["settings"]["model.preset"] == "1b"
    assert report["parameters"]["config"] == ["training/configs/1b.toml"]


def test_dry_run_says_the_trainers_warnings_about_the_runs_length(offline):
    # issue 44's fine-tune: 477 steps of llama3-8b kept a warmup of 2000 and a checkpoint interval of 500
    result = offline("submit", "--config", "llama3-8b", "--set", "run.steps=477", "--dry-run")
    assert result.code == EXIT_OK, result.err
    assert result.err.splitlines() == [
        "clusterctl: warning: optim.warmup_steps=2000 >= run.steps=477: the learning rate never reaches its peak "
        "optim.lr=3.00e-04 (the last step runs at 7.15e-05); set fewer warmup steps than the run has, e.g. --set "
        "optim.warmup_steps=23 (5%)",
        "clusterctl: warning: checkpoint.interval_steps=500 >= run.steps=477: no checkpoint is written before the "
        "end of the run, only at the end and on SIGTERM or Ctrl-C; the local tier saves every 50 steps, but not "
        "to checkpoint.dir; set it below run.steps, e.g. --set checkpoint.interval_steps=119",
    ]


@pytest.mark.parametrize("dry_run", [[], ["--dry-run"]])
def test_a_bad_set_key_is_refused_before_any_aws_call(offline, dry_run):
    """The issue's command line: without credentials it used to say only "no AWS credentials"."""
    result = offline("submit", "--config", TINY, "--set", "run.step=200", *dry_run)
    assert result.code == EXIT_USAGE and result.out == ""
    assert result.err == (
        f"clusterctl: error: not submitted: {TINY} with the --set items: run.step: unknown key; allowed: seed, "
        "steps, seq_len, micro_batch_size, grad_accum_steps, global_batch_tokens, log_interval_steps\n"
    )


def test_without_credentials_a_bad_key_is_named_and_a_good_submit_needs_credentials(cli, no_credentials):
    """With a real boto3 session and no credentials: the validator answers first; a valid submit goes on to
    the stack lookup, where the missing credentials are the answer (botocore finds none: no request is sent)."""
    bad = cli("submit", "--config", TINY, "--set", "run.step=200")
    assert bad.code == EXIT_USAGE and "run.step: unknown key" in bad.err
    good = cli("submit", "--config", TINY, "--set", "run.steps=200")
    assert good.code == EXIT_CREDENTIALS and good.err.startswith("clusterctl: error: no AWS credentials")
