"""logs (moto CloudWatch Logs), cost (the catalog; a job's start from moto SSM) and the error contract:
one line on stderr, a documented exit code, a traceback only with --debug."""

import datetime
import subprocess
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import boto3
import pytest
from botocore.stub import Stubber

from cluster_aws.errors import EXIT_ACCESS, EXIT_CREDENTIALS, EXIT_ENDPOINT, EXIT_OK, EXIT_STACK, EXIT_USAGE
from cluster_aws.session import AwsContext
from clusterctl.jobs import logs as job_logs

JOB = "j-20261120-231502-ab12"
# CloudWatch Logs rejects events older than 14 days: an hour ago, to the second (ms).
T0 = (int(time.time()) - 3600) * 1000


def at(offset_ms):
    return datetime.datetime.fromtimestamp((T0 + offset_ms) / 1000, tz=datetime.UTC).strftime(
        "%Y-%m-%dT%H:%M:%SZ"
    )


def put(logs, group, stream, *events):
    try:
        logs.create_log_stream(logGroupName=group, logStreamName=stream)
    except logs.exceptions.ResourceAlreadyExistsException:
        pass
    logs.put_log_events(
        logGroupName=group,
        logStreamName=stream,
        logEvents=[{"timestamp": t, "message": m} for t, m in events],
    )


@pytest.fixture()
def job_log(cluster, fakes):
    logs = boto3.client("logs", region_name="us-east-1")
    group = fakes.LOG_GROUP
    put(
        logs,
        group,
        f"jobs/{JOB}/i-0aaa",
        (T0, "rank 0 starting"),
        (T0 + 2000, '{"event": "step", "step": 1}'),
    )
    put(logs, group, f"jobs/{JOB}/i-0bbb", (T0 + 1000, "rank 8 starting"))
    put(logs, group, "jobs/j-20261120-231502-ffff/i-0aaa", (T0 + 500, "another job"))
    put(logs, group, "i-0aaa/bootstrap", (T0 + 500, "bootstrap line"))
    return logs, group


def test_logs_interleaves_the_jobs_streams_by_time(cli, job_log):
    result = cli("logs", JOB)
    assert result.code == EXIT_OK, result.err
    assert result.lines == [
        f"{at(0)} [i-0aaa] rank 0 starting",
        f"{at(1000)} [i-0bbb] rank 8 starting",
        f'{at(2000)} [i-0aaa] {{"event": "step", "step": 1}}',
    ]


def test_logs_of_one_node(cli, job_log):
    result = cli("logs", JOB, "--node", "i-0bbb")
    assert result.lines == [f"{at(1000)} [i-0bbb] rank 8 starting"]


def test_logs_of_an_unknown_job(cli, job_log):
    result = cli("logs", "j-20261120-231502-0000")
    assert result.code == 1 and "no log for job j-20261120-231502-0000 in /training-cluster/" in result.err


def test_follow_prints_new_lines_once_until_interrupted(job_log):
    logs, group = job_log
    polls = []

    def sleep(seconds):
        polls.append(seconds)
        if len(polls) == 1:
            put(
                logs,
                group,
                f"jobs/{JOB}/i-0bbb",
                (T0 + 2000, "same millisecond, new line"),
                (T0 + 5000, "later line"),
            )
        else:
            raise KeyboardInterrupt

    lines = job_logs.iter_job_log(logs, group, JOB, follow=True, sleep=sleep)
    seen = []
    with pytest.raises(KeyboardInterrupt):
        for line in lines:
            seen.append((line.instance_id, line.message))
    assert seen == [
        ("i-0aaa", "rank 0 starting"),
        ("i-0bbb", "rank 8 starting"),
        ("i-0aaa", '{"event": "step", "step": 1}'),
        ("i-0bbb", "same millisecond, new line"),
        ("i-0bbb", "later line"),
    ]
    assert polls == [5.0, 5.0]


def test_cost_of_a_plan_from_the_catalog(cli):
    result = cli("cost", "--instance-type", "p5.48xlarge", "--nodes", "4", "--hours", "168")
    assert result.code == EXIT_OK
    # 4 x $55.04 x 168 h (instance_catalog/instance_types.py)
    assert result.lines[0] == "plan: 4 x p5.48xlarge for 168.00 h = $36,986.88 ($220.16/h, 5,376 GPU-hours)"
    assert "$55.04 per instance-hour" in result.lines[1]


@pytest.mark.parametrize("hours", ["nan", "inf", "-1", "-0.5", "NaN", "lots"])
def test_cost_refuses_hours_that_are_not_a_finite_number_of_hours(cli, capsys, hours):
    with pytest.raises(SystemExit) as exit_info:
        cli("cost", "--nodes", "4", "--hours", hours)
    assert exit_info.value.code == EXIT_USAGE
    err = capsys.readouterr().err
    assert f"argument --hours: {hours!r}: allowed: a number of hours >= 0" in err and "$" not in err


def test_cost_needs_a_plan_or_a_job(cli):
    assert cli("cost", "--nodes", "4").code == EXIT_USAGE
    assert cli("cost", "--job", JOB, "--hours", "3").code == EXIT_USAGE


def test_cost_of_a_running_job_so_far(cli, moto_aws, fakes):
    # Two nodes in all: moto's SendCommand adds every instance in the region to a command without Targets.
    cluster = fakes.deploy_fake_cluster(nodes=2)
    ssm = boto3.client("ssm", region_name="us-east-1")
    command = ssm.send_command(
        DocumentName=fakes.DOCUMENT,
        InstanceIds=cluster.instance_ids,
        Parameters={"action": ["start"], "jobId": [JOB]},
    )["Command"]
    cli.now = command["RequestedDateTime"].astimezone(datetime.UTC) + datetime.timedelta(hours=1, minutes=30)
    result = cli("cost", "--job", JOB, "--json")
    assert result.code == EXIT_OK, result.err
    assert '"nodes": 2' in result.out and '"hours": 1.5' in result.out and '"totalUsd": 165.12' in result.out


def test_no_credentials_is_one_line_and_exit_3(cli, monkeypatch, moto_aws):
    monkeypatch.delenv("AWS_ACCESS_KEY_ID")
    monkeypatch.delenv("AWS_SECRET_ACCESS_KEY")
    cli.context = AwsContext(boto3.Session(region_name="us-east-1"))
    result = cli("nodes")
    assert result.code == EXIT_CREDENTIALS
    assert result.err == (
        "clusterctl: error: no AWS credentials: run `aws configure` or `aws sso login`, pass "
        "--profile, or set AWS_PROFILE\n"
    )
    debug = cli("nodes", "--debug")
    assert "Traceback (most recent call last)" in debug.err and "NoCredentialsError" in debug.err


def test_stack_not_deployed_in_the_region(cli, moto_aws):
    result = cli("nodes", "--stack", "OtherStack")
    assert result.code == EXIT_STACK
    assert result.err.strip() == (
        "clusterctl: error: stack OtherStack is not deployed in us-east-1 (deploy it "
        "with `cdk deploy`, or pass --region/--stack)"
    )


def test_access_denied(cli):
    client = boto3.client("cloudformation", region_name="us-east-1")
    cli.context.clients["cloudformation"] = client
    with Stubber(client) as stub:
        stub.add_client_error(
            "describe_stacks",
            "AccessDenied",
            "not authorized to perform DescribeStacks",
            expected_params={"StackName": "TrainingClusterStack"},
        )
        result = cli("nodes")
    assert result.code == EXIT_ACCESS
    assert result.err.startswith("clusterctl: error: access denied: DescribeStacks: not authorized")
    assert result.err.count("\n") == 1


def test_invalid_and_unreachable_region(cli, monkeypatch):
    cli.context = AwsContext(boto3.Session(region_name="us-east-1;rm"))
    result = cli("nodes")
    assert (
        result.code == EXIT_ENDPOINT
        and result.err.strip() == "clusterctl: error: invalid AWS region 'us-east-1;rm'"
    )
    monkeypatch.setenv("AWS_ENDPOINT_URL", "http://127.0.0.1:9")  # nothing listens on the discard port
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    cli.context = AwsContext(boto3.Session(region_name="eu-west-9"))
    result = cli("nodes")
    assert result.code == EXIT_ENDPOINT
    assert result.err.strip().startswith("clusterctl: error: cannot reach http://127.0.0.1:9")
    monkeypatch.delenv("AWS_DEFAULT_REGION")
    cli.context = AwsContext(boto3.Session())
    assert cli("nodes").code == EXIT_ENDPOINT


def test_unknown_profile(capsys):
    from clusterctl.cli import main

    assert main(["--profile", "nope", "nodes"]) == EXIT_CREDENTIALS
    assert capsys.readouterr().err == "clusterctl: error: AWS profile 'nope' not found in ~/.aws/config\n"


def test_python_dash_m_and_help_text():
    result = subprocess.run(
        [sys.executable, "-m", "clusterctl", "--help"],
        capture_output=True,
        text=True,
        cwd=Path(__file__).resolve().parents[2],
        timeout=60,
    )
    assert result.returncode == 0
    for command in ("quota", "capacity", "nodes", "submit", "status", "logs", "cancel", "cost"):
        assert command in result.stdout
    assert "5 access denied" in result.stdout


@pytest.mark.parametrize(
    "argv",
    [
        ["--region", "eu-west-1", "--stack", "S", "--json", "nodes"],
        ["nodes", "--region", "eu-west-1", "--stack", "S", "--json"],
    ],
)
def test_global_options_before_or_after_the_command(argv):
    from clusterctl.cli import build_parser

    args = build_parser().parse_args(argv)
    assert (args.region, args.stack, args.json, args.profile, args.debug) == (
        "eu-west-1",
        "S",
        True,
        None,
        False,
    )


PROXY_PAGE = (
    b"<html>\r\n<head><title>403 Forbidden</title></head>\r\n<body>\r\n<center><h1>403 Forbidden</h1>"
    b"</center>\r\n<hr><center>corporate-proxy</center>\r\n</body>\r\n</html>\r\n"
)


@pytest.fixture()
def html_endpoint():
    """An endpoint on 127.0.0.1 that answers every request the way a proxy or firewall does: HTTP 403 with
    an HTML page instead of an AWS error."""
    import http.server
    import threading

    endpoint = SimpleNamespace(page=PROXY_PAGE, url="")

    class Handler(http.server.BaseHTTPRequestHandler):
        def do_POST(self):  # noqa: N802 (http.server's name)
            self.rfile.read(int(self.headers.get("Content-Length", 0)))
            self.send_response(403)
            self.send_header("Content-Type", "text/html")
            self.send_header("Content-Length", str(len(endpoint.page)))
            self.end_headers()
            self.wfile.write(endpoint.page)

        def log_message(self, *args):
            pass

    server = http.server.ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    endpoint.url = f"http://127.0.0.1:{server.server_port}"
    yield endpoint
    server.shutdown()
    server.server_close()


def test_an_html_error_page_is_one_line(cli, monkeypatch, html_endpoint):
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    # SSM speaks JSON: botocore puts the unparsed HTML page, newlines and all, into the error message.
    ssm = boto3.client("ssm", region_name="us-east-1", endpoint_url=html_endpoint.url)
    cli.context.clients["ssm"] = ssm
    cloudformation = boto3.client("cloudformation", region_name="us-east-1")
    cli.context.clients["cloudformation"] = cloudformation
    with Stubber(cloudformation) as stub:
        outputs = {"AutoScalingGroupName": "g", "LogGroupName": "l", "JobDocumentName": "d",
                   "InstanceType": "p5.48xlarge", "NodeCount": "2", "CapacityMode": "on-demand"}
        stub.add_response("describe_stacks", {"Stacks": [{
            "StackName": "TrainingClusterStack", "StackStatus": "CREATE_COMPLETE",
            "CreationTime": datetime.datetime(2026, 11, 1, tzinfo=datetime.UTC),
            "Outputs": [{"OutputKey": k, "OutputValue": v} for k, v in outputs.items()]}]})
        result = cli("status", JOB)
    assert result.code == EXIT_ENDPOINT
    assert result.err == (
        "clusterctl: error: ListCommands failed: HTTP 403: the endpoint answered with an HTML page (403 "
        "Forbidden), not an AWS error: is a proxy or firewall between you and AWS?\n"
    )


@pytest.mark.parametrize(
    "page, message",
    [
        # not well-formed XML (<hr> is never closed): botocore's parser gives up with the body in its message
        (PROXY_PAGE, "the AWS endpoint answered with an HTML page (403 Forbidden), not an AWS response"),
        # well-formed: botocore finds no AWS error in it
        (b"<html><head><title>403</title></head><body>denied</body></html>",
         "DescribeStacks failed: HTTP 403 with no AWS error in the answer"),
    ],
    ids=["unparseable", "well-formed"],
)
def test_an_html_answer_to_a_query_protocol_call_is_one_line(cli, monkeypatch, html_endpoint, page, message):
    monkeypatch.setenv("AWS_MAX_ATTEMPTS", "1")
    html_endpoint.page = page
    cli.context.clients["cloudformation"] = boto3.client(
        "cloudformation", region_name="us-east-1", endpoint_url=html_endpoint.url
    )
    result = cli("nodes")
    assert result.code == EXIT_ENDPOINT
    assert result.err == f"clusterctl: error: {message}: is a proxy or firewall between you and AWS?\n"


def test_any_error_message_is_printed_as_one_line(cli, monkeypatch):
    from clusterctl import nodes as nodes_command

    def boom(args, runtime):
        raise RuntimeError("first line\nsecond line\n\tthird")

    monkeypatch.setattr(nodes_command, "nodes", boom)
    result = cli("nodes")
    assert result.err == (
        "clusterctl: error: unexpected RuntimeError: first line second line third (rerun with --debug for "
        "the traceback)\n"
    )
