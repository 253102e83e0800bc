"""Readiness tags, the Unhealthy signal, and the IMDSv2 client against a local server that enforces tokens."""

from __future__ import annotations

import json
import threading
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer

import pytest

from node_bootstrap.imds import Imds, ImdsError
from node_bootstrap.plan import execute_plan
from node_bootstrap.readiness import TAG_REASON, TAG_STATE, build_reason, plan_ready, signal_failure

TOKEN = "AQAEAOf1-token"


class ImdsV2Handler(BaseHTTPRequestHandler):
    """Answers like IMDS with HttpTokens=required: 401 without a token."""

    def do_PUT(self):  # noqa: N802 (http.server's API)
        if self.path == "/latest/api/token" and self.headers.get("X-aws-ec2-metadata-token-ttl-seconds"):
            self._reply(200, TOKEN)
        else:
            self._reply(400, "")

    def do_GET(self):  # noqa: N802
        if self.headers.get("X-aws-ec2-metadata-token") != TOKEN:
            self._reply(401, "")
            return
        values = {"/latest/meta-data/instance-id": "i-0a1b2c3d4e5f60718",
                  "/latest/meta-data/placement/region": "eu-west-1"}
        if self.path in values:
            self._reply(200, values[self.path])
        else:
            self._reply(404, "")

    def _reply(self, code, body):
        data = body.encode()
        self.send_response(code)
        self.send_header("Content-Length", str(len(data)))
        self.end_headers()
        self.wfile.write(data)

    def log_message(self, *args):
        pass


@pytest.fixture(scope="module")
def imds_url():
    server = ThreadingHTTPServer(("127.0.0.1", 0), ImdsV2Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    yield f"http://127.0.0.1:{server.server_address[1]}"
    server.shutdown()
    server.server_close()


def test_imds_v2_reads_identity_with_a_token(imds_url):
    identity = Imds(imds_url).identity()
    assert (identity.instance_id, identity.region) == ("i-0a1b2c3d4e5f60718", "eu-west-1")


def test_imds_errors_name_the_path(imds_url):
    with pytest.raises(ImdsError, match="IMDS meta-data/no-such-key: HTTP 404"):
        Imds(imds_url).get("no-such-key")


def test_unreachable_imds_is_reported_after_retries():
    with pytest.raises(ImdsError, match="unreachable at http://127.0.0.1:9 after 2 attempts"):
        Imds("http://127.0.0.1:9", attempts=2, retry_delay_s=0, timeout_s=0.5).identity()


def test_reason_is_one_line_of_at_most_256_characters():
    assert build_reason("health gate failed:\n  gpu-count: 7 GPUs") == "health gate failed: gpu-count: 7 GPUs"
    long = build_reason("x" * 400)
    assert len(long) == 256 and long.endswith("...")


def test_ready_is_tagged_once_and_a_stale_reason_removed(fake_node, kit):
    fake_node.tags = {TAG_STATE: "running", TAG_REASON: "lustre: mount failed"}
    identity = fake_node.identity()
    execute_plan(plan_ready(identity, fake_node.runner), fake_node.runner, dry_run=False)
    assert fake_node.tags == {TAG_STATE: "ready"}
    assert fake_node.runner.commands(mutating=True)[1] == (
        f"aws ec2 delete-tags --region {kit.REGION} --resources {kit.INSTANCE_ID} "
        "--tags Key=cluster:bootstrap-reason")
    fake_node.runner.calls.clear()
    execute_plan(plan_ready(identity, fake_node.runner), fake_node.runner, dry_run=False)
    assert fake_node.runner.mutating_calls == []


def test_failure_tags_the_reason_as_json_and_marks_unhealthy_past_the_grace_period(fake_node, kit):
    reason = "health gate failed: efa: 31 EFA devices, expected 32; xid: Xid 79, 48"
    signal_failure(fake_node.identity(), fake_node.runner, reason)
    assert fake_node.tags == {TAG_STATE: "failed", TAG_REASON: reason}  # commas survive (JSON, not shorthand)
    create, health = fake_node.runner.calls
    assert json.loads(create.argv[-1])[1] == {"Key": "cluster:bootstrap-reason", "Value": reason}
    assert health.argv == (
        "aws", "autoscaling", "set-instance-health", "--region", kit.REGION, "--instance-id", kit.INSTANCE_ID,
        "--health-status", "Unhealthy", "--no-should-respect-grace-period")
    assert fake_node.health_status == "Unhealthy"
