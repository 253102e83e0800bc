"""The README (issue 28, "Help and README"): its list of stack outputs is the synthesized template's, its quick
start's commands are ones this checkout runs (each parsed by the real parser, each config and --set item by the
trainer's loader, each make target by make), and its links, and those of the pages its detail moved to, lead
somewhere."""

from __future__ import annotations

import re
import shlex
import subprocess
from pathlib import Path

import pytest

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()


def section(text: str, heading: str) -> str:
    """The text under a `## ` heading, up to the next one."""
    start = text.index(f"\n## {heading}")
    end = text.find("\n## ", start + 1)
    return text[start:end if end > 0 else None]


def commands(text: str) -> list[list[str]]:
    """The command lines of the fenced blocks in `text`: comments dropped, continuation lines joined."""
    found = []
    for block in re.findall(r"```\n(.*?)```", text, re.S):
        joined = re.sub(r"\\\n\s*", " ", block)
        found += [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip()]
    return [c for c in found if c]


def test_the_stack_outputs_table_is_the_templates(synth):
    table = section(README, "Deploy").split("| output | what it is |")[1].split("\n\n")[0]
    listed = re.findall(r"^\| `(\w+)` \|", table, re.M)
    # the default stack, and one on an existing reservation (CapacityReservationId exists only then)
    outputs = set(synth("default-p5-on-demand").template_json["Outputs"])
    outputs |= set(synth("odcr-existing").template_json["Outputs"])
    assert "SpareNodes" in outputs and "Fp8Backends" in outputs and "CapacityPurchaserPolicyArn" in outputs
    assert sorted(listed) == sorted(outputs)
    assert len(listed) == len(set(listed))


QUICK_START = commands(section(README, "Quick start"))


def test_the_quick_start_comes_first_and_has_the_five_steps():
    first_heading = re.search(r"^## (.*)$", README, re.M)
    assert first_heading.group(1).startswith("Quick start") and README[:first_heading.start()].count("\n") < 30
    programs = [c[0] if c[0] != "python" else f"python {c[2]}" for c in (strip_env(c) for c in QUICK_START)]
    assert programs == ["make", "export", "python training.data.prepare", "python training", "torchrun",
                        "clusterctl", "make"]


def strip_env(argv: list[str]) -> list[str]:
    while argv and re.fullmatch(r"[A-Z_]+=\S*", argv[0]):
        argv = argv[1:]
    return argv


@pytest.mark.parametrize("argv", [strip_env(c) for c in QUICK_START], ids=lambda argv: " ".join(argv[:3]))
def test_each_quick_start_command_is_one_this_checkout_runs(argv):
    program = argv[0]
    if program == "make":
        dry = subprocess.run(["make", "-n", "-o", "setup", *argv[1:]], cwd=REPO, capture_output=True, text=True,
                             timeout=60)
        assert dry.returncode == 0, dry.stderr
    elif program == "export":
        assert argv[1].startswith("PATH=$PWD/.venv/bin:") and (REPO / ".venv" / "bin" / "clusterctl").exists()
    elif program == "clusterctl":
        from clusterctl.cli import build_parser

        assert build_parser().parse_args(argv[1:]).command == "plan"
    elif argv[:3] == ["python", "-m", "training.data.prepare"]:
        from training.data.prepare import build_parser as prepare_parser

        args = prepare_parser().parse_args(argv[3:])
        assert str(args.output) == "/tmp/shards" and args.tokenizer == "byte"
    else:
        train_argv = argv[argv.index("-m") + 2:]
        if program == "torchrun":
            from torch.distributed.run import get_args_parser

            torchrun = get_args_parser().parse_args(argv[1:])
            assert (torchrun.standalone, torchrun.nproc_per_node, torchrun.module) == (True, "2", True)
        else:
            assert argv[:3] == ["python", "-m", "training"]
        from training.__main__ import build_parser as training_parser
        from training.config import load_config

        args = training_parser().parse_args(train_argv)
        config = load_config(args.config, args.overrides)
        # the byte tokenizer's ids (257) fit the config's vocabulary: training.data.prepare's default shards train
        assert config.data.source == "shards" and config.data.path == "/tmp/shards"
        assert config.model.vocab_size >= 257


DEPLOYS = [c for c in commands(section(README, "Deploy")) if c[0] == "make"]


@pytest.mark.parametrize("argv", DEPLOYS, ids=" ".join)
def test_the_deploy_commands_are_make_targets_with_valid_settings(argv):
    from cdk_support import build_settings

    target, *variables = argv[1:]
    assert target in {"deploy", "diff", "bootstrap", "destroy"}
    dry = subprocess.run(["make", "-n", "-o", "setup", target, *variables], cwd=REPO, capture_output=True,
                         text=True, timeout=60)
    assert dry.returncode == 0, dry.stderr
    cdk_args = shlex.split(dict(v.split("=", 1) for v in variables).get("CDK_ARGS", ""))
    if target == "bootstrap":
        assert re.fullmatch(r"aws://ACCOUNT_ID/[a-z0-9-]+", cdk_args[0])
        return
    assert f"npx --no-install cdk {target} TrainingClusterStack" in dry.stdout
    build_settings(**dict(cdk_args[i + 1].split("=", 1) for i, a in enumerate(cdk_args) if a == "-c"))


def links(path: Path) -> list[tuple[str, str]]:
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return [(target, anchor) for target, anchor in
            re.findall(r"\]\(((?!https?:)[^)#\s]*)(?:#([^)\s]*))?\)", text)]


def anchors(path: Path) -> set[str]:
    """GitHub's heading ids: lower case, punctuation dropped, spaces to hyphens."""
    text = re.sub(r"```.*?```", "", path.read_text(), flags=re.S)
    return {re.sub(r"[^\w\- ]", "", h.strip().lower()).replace(" ", "-")
            for h in re.findall(r"^#+ (.*)$", text, re.M)}


@pytest.mark.parametrize("page", ["README.md", "docs/settings.md", "docs/training.md", "docs/operations.md"])
def test_links_lead_somewhere(page):
    path = REPO / page
    broken = []
    for target, anchor in links(path):
        linked = (path.parent / target).resolve() if target else path
        if not linked.exists():
            broken.append(target)
        elif anchor and linked.suffix == ".md" and anchor not in anchors(linked):
            broken.append(f"{target}#{anchor}")
    assert broken == []
