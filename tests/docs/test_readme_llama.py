"""The README's "Fine-tune Llama 3.1 8B on your data" (issues 27, 44): its shell commands are ones this checkout
takes. clusterctl's by the real parser, a submit's config and --set items by the trainer's own loader (as
`clusterctl submit` checks them), the data preparation by its parser with the model's directory, the submit is
the plan's own line, and the paths line up: the directory synced to the data bucket is the init.hf_dir the job
reads, the shards synced are the data and validation paths."""

from __future__ import annotations

import io
import re
import shlex
from pathlib import Path

from cluster_jobs.request import JobRequest
from clusterctl.cli import build_parser as clusterctl_parser
from clusterctl.cli import main as clusterctl_main
from clusterctl.runtime import Runtime
from training.config import load_config
from training.config.schedule import run_length_warnings
from training.data.prepare import build_parser as prepare_parser

REPO = Path(__file__).resolve().parents[2]
README = (REPO / "README.md").read_text()
HEADING = "Fine-tune Llama 3.1 8B on your data"


def section() -> str:
    start = README.index(f"\n## {HEADING}\n")
    end = README.find("\n## ", start + 1)
    return README[start:end]


def commands() -> list[list[str]]:
    """The shell blocks' command lines (a ```python or ```text block is not one): comments dropped, continuations
    joined."""
    found = []
    for language, block in re.findall(r"^```(\w*)\n(.*?)^```$", section(), re.S | re.M):
        if language:
            continue
        joined = re.sub(r"\\\n\s*", " ", block)
        found += [shlex.split(line, comments=True) for line in joined.splitlines() if line.strip()]
    return found


def by_program(name: str) -> list[list[str]]:
    return [c for c in commands() if c[0] == name or c[:3] == ["python", "-m", name]]


def test_the_section_follows_the_job_commands_and_walks_every_step():
    headings = re.findall(r"^## (.+)$", README, re.M)
    assert headings.index(HEADING) > headings.index("Operations: from a plan to a job's logs")
    assert [c[0] for c in commands()] == ["hf", "aws", "python", "python", "aws", "aws", "clusterctl",
                                          "clusterctl", "clusterctl", "aws", "vllm"]
    assert "AutoModelForCausalLM.from_pretrained(" in section() and "```python\n" in section()


def test_the_clusterctl_commands_parse_and_the_submit_passes_the_trainers_checks(monkeypatch):
    plan, submit, export = by_program("clusterctl")
    monkeypatch.setenv("AWS_DEFAULT_REGION", "us-east-1")  # plan asks no AWS API; the context wants a region
    out = io.StringIO()
    assert clusterctl_main(plan[1:], Runtime(out=out, err=io.StringIO())) == 0
    # the submit shown is the plan's own line, whole: a plan that changes (a measured MFU, a new recipe) fails here
    assert shlex.join(submit) in [line.strip() for line in out.getvalue().splitlines()]
    args = clusterctl_parser().parse_args(submit[1:])
    assert args.command == "submit"
    # what `clusterctl submit` checks before any AWS call (clusterctl.jobs.submit.checked_request)
    JobRequest(config=args.config, nodes=0, gpus_per_node=0, max_restarts=args.max_restarts,
               overrides=tuple(args.overrides)).validate()
    cfg = load_config(REPO / args.config, args.overrides)
    assert run_length_warnings(cfg, cluster_job=True) == []  # the fine-tune's schedule fits its length
    assert cfg.validation.enabled and cfg.validation.interval_steps < cfg.run.steps
    settings = {"init.hf_dir": cfg.init.hf_dir, "data.path": cfg.data.path, "validation.path": cfg.validation.path}
    exported = clusterctl_parser().parse_args(export[1:])
    assert (exported.command, exported.step) == ("export", 2000)

    # the paths line up with what the section put in the data bucket, which /fsx/data imports
    synced = {c[4].removeprefix("s3://<DataBucketName>/").rstrip("/") for c in by_program("aws")
              if c[1:3] == ["s3", "sync"] and c[4].startswith("s3://<DataBucketName>/")}
    for key in ("init.hf_dir", "data.path", "validation.path"):
        assert settings[key].removeprefix("/fsx/data/") in synced, key


def test_the_data_is_prepared_with_the_models_own_tokenizer():
    (download,) = by_program("hf")
    model_dir = download[download.index("--local-dir") + 1]
    outputs = []
    for argv in by_program("training.data.prepare"):
        args = prepare_parser().parse_args(argv[3:])
        assert args.tokenizer == model_dir  # prepare reads the directory's tokenizer.json
        outputs.append(str(args.output))
    uploaded = [c[3].rstrip("/") for c in by_program("aws") if c[1:3] == ["s3", "sync"]]
    assert uploaded[0] == model_dir and sorted(uploaded[1:3]) == sorted(outputs)
