"""`clusterctl logs` shows what a job wrote without letting the operator's terminal obey it: control characters
but newline and tab are printed as escapes (moto CloudWatch Logs)."""

import time

import boto3
import pytest

from cluster_aws.errors import EXIT_OK
from clusterctl.render import terminal_safe

JOB = "j-20261120-231502-ab12"
T0 = (int(time.time()) - 3600) * 1000  # CloudWatch Logs rejects events older than 14 days


@pytest.mark.parametrize(("text", "shown"), [
    ("plain text, unicode: überall ✓", "plain text, unicode: überall ✓"),
    ("tab\tand\nnewline stay", "tab\tand\nnewline stay"),
    ("\x1b[31mred\x1b[0m", "\\x1b[31mred\\x1b[0m"),  # colours and cursor moves (CSI)
    ("\x1b]0;new title\x07", "\\x1b]0;new title\\x07"),  # window title (OSC ... BEL)
    ("\x1b]52;c;cm0gLXJmIH4=\x1b\\", "\\x1b]52;c;cm0gLXJmIH4=\\x1b\\"),  # clipboard write (OSC 52)
    ("done\rfake: all good", "done\\x0dfake: all good"),  # a return that rewrites the line
    ("\x9b2J\x00\x7f\x08", "\\x9b2J\\x00\\x7f\\x08"),  # C1 CSI, NUL, DEL, backspace
])
def test_control_characters_are_shown_not_sent(text, shown):
    assert terminal_safe(text) == shown


def test_logs_prints_a_jobs_escape_sequences_as_text(cli, cluster, fakes):
    logs = boto3.client("logs", region_name="us-east-1")
    logs.create_log_stream(logGroupName=fakes.LOG_GROUP, logStreamName=f"jobs/{JOB}/i-0aaa")
    logs.put_log_events(logGroupName=fakes.LOG_GROUP, logStreamName=f"jobs/{JOB}/i-0aaa", logEvents=[
        {"timestamp": T0, "message": "step 1\x1b]0;pwned\x07\x1b[2J\tloss 2.0"}])
    result = cli("logs", JOB)
    assert result.code == EXIT_OK, result.err
    (line,) = result.lines
    assert line.endswith(" [i-0aaa] step 1\\x1b]0;pwned\\x07\\x1b[2J\tloss 2.0")
    assert "\x1b" not in result.out and "\x07" not in result.out
