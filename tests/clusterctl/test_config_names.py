"""One set of names for a model and its run (issue 28: `plan` said `tiny` where training says `tiny-cpu`): the
packaged configs' names, which `python -m training --config` and `clusterctl plan --model` both take, list and
print."""

from __future__ import annotations

import json
import re

import pytest

from cluster_aws.errors import EXIT_USAGE
from training.__main__ import build_parser as training_parser
from training.config import CONFIGS_DIR, load_config, packaged_config_names, resolve_config_path
from training.errors import ConfigError

NAMES = sorted(p.stem for p in CONFIGS_DIR.glob("*.toml"))


def listed(text: str) -> list[str]:
    """The names in the first parenthesised, comma-separated list of `text` (argparse wraps help lines after a
    hyphen: "tiny-" / "cpu" is joined back)."""
    joined = " ".join(text.split()).replace("- ", "-")
    return re.search(r"\(([a-z0-9-]+(?:, [a-z0-9-]+)+)\)", joined).group(1).split(", ")


def test_training_and_plan_list_the_same_names(cli):
    assert packaged_config_names() == NAMES and "tiny-cpu" in NAMES
    with pytest.raises(ConfigError) as refused:
        resolve_config_path("tiny")
    names, guess = str(refused.value).split("; did you mean ")  # a mistyped name: the closest, difflib's
    assert listed(names.replace("one of: ", "(") + ")") == NAMES and guess == "tiny-cpu?"
    assert listed(training_parser().format_help().split("--config TOML")[-1]) == NAMES
    plan_refusal = cli("plan", "--model", "tiny", "--tokens", "1B")
    assert plan_refusal.code == EXIT_USAGE
    assert listed(plan_refusal.err) == NAMES
    from clusterctl.cli import build_parser

    plan_help = build_parser()._subparsers._group_actions[0].choices["plan"].format_help()
    assert listed(plan_help.split("--model MODEL")[-1]) == NAMES


@pytest.mark.parametrize("name", NAMES)
def test_each_name_is_taken_by_both(cli, name):
    assert resolve_config_path(name) == CONFIGS_DIR / f"{name}.toml"
    result = cli("--json", "plan", "--model", name, "--tokens", "1B", "--instance-types", "p5.48xlarge")
    if load_config(name).parallel.param_dtype != "bfloat16":  # tiny-cpu: the CPU try-out, float32
        assert result.code == EXIT_USAGE and "the planner models bf16 mixed precision" in result.err
        return
    report = json.loads(result.out)
    assert report["model"] == name  # the plan names the model as training does
    assert report["config"] == f"training/configs/{name}.toml"
