"""Property-based (hypothesis): arbitrary JSON, bytes and escape sequences as a node's answer never raise in the
parser (cluster_jobs/node_answer.py), in the rendering (clusterctl.jobs.view, clusterctl.render) or in a job
keeper round on moto, and nothing of a value outside the schema is stored or printed raw. Few examples each:
the CI suite's time is tight, and the example tests (test_keeper_untrusted.py, tests/clusterctl/
test_untrusted_job_text.py) hold the issue's exact lines."""

from __future__ import annotations

import json
import math

import boto3
import pytest
from fake_aws import isolate_from_real_aws
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from keeper_world import JOB, REGION, TABLE, FakeSsm, deploy, keeper, raw_item, submit
from moto import mock_aws

from cluster_jobs.node_states import NodeJobState
from cluster_jobs.ssm_commands import Invocation
from cluster_jobs.table import LOCK_KEY
from clusterctl.jobs import view as job_view
from node_bootstrap import job_contract

FIELDS = ("exitCode", "lastStep", "lastLoss", "startedAt", "endedAt", "cancel", "error", "ncclNetwork",
          "ncclProvider", "module", "busbwGbps", "busbwSizeBytes", "attempt", "resumedFromStep", "resumedFromTier",
          "compileCache", "lastValLoss", "lastValStep", "phases", "phaseSeconds", "lastOutputAt", "hangOrigin",
          "hangEvidence")
ESCAPES = st.sampled_from(["\x1b]0;pwned\x07", "\x1b[2J", "\x9b31m", "\r", "\u202e", "\x00", "\n"])
TEXT = st.one_of(st.text(max_size=30), ESCAPES, st.builds("{}{}".format, st.text(max_size=10), ESCAPES))
JSON = st.recursive(
    st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), TEXT),
    lambda inner: st.one_of(st.lists(inner, max_size=4), st.dictionaries(TEXT, inner, max_size=4)),
    max_leaves=8)
PAYLOAD = st.fixed_dictionaries(
    {"state": st.one_of(st.sampled_from(job_contract.STATES), JSON)},
    optional={name: JSON for name in FIELDS})
STDOUT = st.one_of(
    PAYLOAD.map(lambda p: json.dumps(p) + "\n"),  # NaN and Infinity as Python's json writes them
    st.binary(max_size=200).map(lambda b: b.decode("utf-8", "replace")),
    st.builds(lambda depth: "[" * depth, st.integers(1000, 5000)),  # nested past the JSON parser's depth
)


@pytest.fixture(scope="module", autouse=True)
def fake_credentials(tmp_path_factory):
    """moto's fake credentials, once for the module (hypothesis runs many examples in one test call)."""
    with pytest.MonkeyPatch.context() as patch:
        isolate_from_real_aws(patch, tmp_path_factory.mktemp("aws"), REGION)
        yield


def fits_schema(state: NodeJobState) -> bool:
    """Every parsed value is of its field's type and range, and every text is printable."""
    ints = (state.exit_code, state.last_step, state.busbw_size_bytes, state.attempt, state.resumed_from_step,
            state.last_val_step)
    floats = (state.last_loss, state.busbw_gbps, state.last_val_loss)
    texts = (state.started_at, state.ended_at, state.detail, state.nccl_network, state.nccl_provider, state.module,
             state.resumed_from_tier, state.compile_cache, state.last_output_at, state.hang_evidence, *state.dropped,
             *(state.phases or {}).values())
    seconds = state.phase_seconds or {}
    return (all(v is None or (type(v) is int and abs(v) < 10**13) for v in ints)
            and all(v is None or (type(v) is float and math.isfinite(v)) for v in floats)
            and all(v is None or (type(v) is str and v.isprintable()) for v in texts)
            and state.hang_origin in (None, *job_contract.HANG_ORIGINS)
            and all(name in job_contract.PHASE_NAMES and type(v) is float and 0 <= v <= job_contract.MAX_PHASE_SECONDS
                    for name, v in seconds.items()))


# database=None: no .hypothesis/ in the tree; derandomize: every CI run tries the same examples (a property test
# that could fail on a new random draw one run in a hundred would be a flaky test)
@settings(max_examples=100, deadline=None, database=None, derandomize=True)
@given(STDOUT, st.integers(0, 300), st.sampled_from(["Success", "Failed", "TimedOut"]))
def test_any_answer_parses_into_the_schema_and_renders_without_escapes(stdout, code, status):
    state = NodeJobState.from_invocation(Invocation("i-0a", status, code, stdout, stdout[-50:]))
    assert fits_schema(state)
    shown = job_view.format_states([state], "attempt 1's nodes")
    assert not any(c in shown for c in "\x1b\x07\x9b\r\u202e\x00")
    json.dumps(job_view.states_json(JOB, [state]), default=str, allow_nan=False)  # valid JSON: no NaN got through


def strings_in(value: object) -> list[str]:
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in ([v] if k == "S" and isinstance(v, str) else strings_in(v))]
    if isinstance(value, list):
        return [s for v in value for s in strings_in(v)]
    return []


def numbers_in(value: object) -> list[str]:
    if isinstance(value, dict):
        return [s for k, v in value.items() for s in ([v] if k == "N" else numbers_in(v))]
    if isinstance(value, list):
        return [s for v in value for s in numbers_in(v)]
    return []


@pytest.fixture(scope="module")
def world(fake_credentials):
    """One moto world for every example: the group deployed once (per example it would cost ~0.5 s)."""
    with mock_aws():
        yield deploy()


@settings(max_examples=6, deadline=None, database=None, derandomize=True,
          suppress_health_check=[HealthCheck.too_slow])
@given(answers=st.lists(STDOUT, min_size=2, max_size=2))
def test_a_keeper_round_on_any_answers_stores_only_values_in_the_schema(world, answers):
    dynamodb = boto3.client("dynamodb", region_name=REGION)
    for key in (JOB, LOCK_KEY):  # the previous example's job, and its lock
        dynamodb.delete_item(TableName=TABLE, Key={"pk": {"S": key}})
    submit(world)
    ssm = FakeSsm()
    ssm.stdout = dict(zip(world, answers, strict=True))
    keeper(ssm).reconcile()  # whatever the nodes said: no exception
    item = raw_item()
    assert all(s.isprintable() for s in strings_in(item))  # no escape, no line break stored
    assert all(n.lstrip("-").isdigit() for n in numbers_in(item))  # whole numbers only: no float reached save
