"""Validated strings are matched whole: `re.match` with a pattern ending in `$` lets a trailing newline
through (Python's `$` also matches before a final "\\n"), so every anchored pattern is used with fullmatch.

The scan finds module-level `NAME = re.compile("...$")` patterns and literal `re.match("...$", ...)` calls in
the packages that validate input, and fails on any `.match(` of such a pattern; the behaviour tests below
show what the rule protects against."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[1]
PACKAGES = ("clusterctl", "node_bootstrap", "stacks", "training", "cluster_constructs", "cluster_aws", "cluster_jobs",
            "cluster_spec", "instance_catalog", "job_keeper")


def _anchored_literal(node: ast.AST) -> bool:
    return isinstance(node, ast.Constant) and isinstance(node.value, str) and node.value.endswith("$")


def _anchored_pattern_names(tree: ast.Module) -> set[str]:
    names = set()
    for node in ast.walk(tree):
        if (
            isinstance(node, ast.Assign)
            and isinstance(node.value, ast.Call)
            and isinstance(node.value.func, ast.Attribute)
            and node.value.func.attr == "compile"
            and node.value.args
            and _anchored_literal(node.value.args[0])
        ):
            names.update(t.id for t in node.targets if isinstance(t, ast.Name))
    return names


def _sources() -> list[Path]:
    return sorted(p for package in PACKAGES for p in (REPO / package).rglob("*.py"))


def test_no_anchored_pattern_is_used_with_match():
    anchored: set[str] = set()
    trees = {}
    for path in _sources():
        trees[path] = ast.parse(path.read_text(), str(path))
        anchored |= _anchored_pattern_names(trees[path])
    assert {"JOB_ID_RE", "OVERRIDE_RE", "CONFIG_RE", "HOST_RE"} <= anchored  # the scan sees the job patterns
    offenders = []
    for path, tree in trees.items():
        for node in ast.walk(tree):
            if not (isinstance(node, ast.Call) and isinstance(node.func, ast.Attribute)):
                continue
            if node.func.attr != "match":
                continue
            target = node.func.value
            name = target.attr if isinstance(target, ast.Attribute) else getattr(target, "id", None)
            literal = name == "re" and node.args and _anchored_literal(node.args[0])
            if name in anchored or literal:
                offenders.append(f"{path.relative_to(REPO)}:{node.lineno}")
    assert offenders == [], "use fullmatch: " + ", ".join(offenders)


@pytest.mark.parametrize(
    "check",
    [
        lambda: __import__("cluster_jobs.request", fromlist=["x"]).validate_job_id("j-20261120-231502-ab12\n"),
        lambda: __import__("node_bootstrap.jobs", fromlist=["x"]).validate_job_id("j-20261120-231502-ab12\n"),
    ],
    ids=["cluster_jobs", "node"],
)
def test_a_job_id_with_a_trailing_newline_is_refused(check):
    with pytest.raises(Exception, match="allowed"):
        check()


def test_node_job_spec_refuses_trailing_newlines_in_every_validated_field():
    from node_bootstrap.jobs import JobError, JobSpec

    good = dict(job_id="j-1", config="training/configs/tiny-cpu.toml", nodes=1, gpus_per_node=8,
                rendezvous_host="10.0.0.1", max_restarts=0, overrides=("run.steps=10",))
    JobSpec(**good).validate()
    for field, value in (("config", good["config"] + "\n"), ("rendezvous_host", "10.0.0.1\n"),
                         ("overrides", ("run.steps=10\n",))):
        with pytest.raises(JobError, match="allowed"):
            JobSpec(**{**good, field: value}).validate()


def test_the_node_env_file_refuses_a_value_with_a_trailing_newline():
    from node_bootstrap.errors import StepError
    from node_bootstrap.training_env import render_env_file

    assert render_env_file({"A": "x"}).endswith("\nA=x\n")
    with pytest.raises(StepError, match="newlines are not allowed"):
        render_env_file({"A": "x\n"})
