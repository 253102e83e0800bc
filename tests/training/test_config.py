"""Loading the typed config: TOML files, --set overrides, presets, and errors that name the field."""

from __future__ import annotations

from pathlib import Path

import pytest

from training.config import CONFIGS_DIR, DEFAULT_CONFIG, TrainConfig, load_config, resolve_config_path
from training.errors import ConfigError
from training.model import MODEL_PRESETS

PACKAGED = ("tiny-cpu", "125m", "1b", "llama3-8b", "llama3-70b", "llama3-8b-finetune")
PRESET_OF = {"tiny-cpu": "tiny", "llama3-8b-finetune": "llama3-8b"}  # where a config's name is not its preset


def write(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "run.toml"
    path.write_text(text)
    return path


@pytest.mark.parametrize("name", PACKAGED)
def test_packaged_configs_load_and_validate(name):
    cfg = load_config(CONFIGS_DIR / f"{name}.toml")
    preset = PRESET_OF.get(name, name)
    assert cfg.model.preset == preset
    for key, value in MODEL_PRESETS[preset].items():
        assert getattr(cfg.model, key) == value


def test_every_packaged_config_is_tested():
    assert sorted(p.stem for p in CONFIGS_DIR.glob("*.toml")) == sorted(PACKAGED)


def test_no_path_gives_the_embedded_tiny_cpu_default_and_names_resolve_to_packaged_files():
    assert resolve_config_path(None) == DEFAULT_CONFIG
    assert resolve_config_path("1b") == CONFIGS_DIR / "1b.toml"
    cfg = load_config(None)
    assert (cfg.model.dim, cfg.data.source, cfg.parallel.param_dtype) == (64, "synthetic", "float32")


def test_missing_config_lists_the_packaged_names():
    with pytest.raises(ConfigError, match=r"--config='nope.toml': no such file; allowed: .*1b, .*tiny-cpu"):
        load_config("nope.toml")


def test_set_overrides_are_coerced_from_the_field_type(tmp_path):
    path = write(tmp_path, "[run]\nsteps = 5\n")
    cfg = load_config(
        path,
        [
            "run.steps=12",  # int
            "optim.lr=1e-3",  # float
            "optim.max_grad_norm=2",  # an int literal for a float field
            "parallel.compile=true",  # bool
            "parallel.activation_checkpointing=yes",
            "fp8.backend=torchao",  # a bare string
            "fp8.emulate=true",
            "optim.betas=[0.8, 0.9]",  # a TOML array for a tuple
            "checkpoint.dir=2024",  # a string field keeps digits verbatim
        ],
    )
    assert cfg.run.steps == 12
    assert cfg.optim.lr == 1e-3 and isinstance(cfg.optim.max_grad_norm, float)
    assert cfg.parallel.compile is True and cfg.parallel.activation_checkpointing is True
    assert (cfg.fp8.backend, cfg.fp8.emulate) == ("torchao", True)
    assert cfg.optim.betas == (0.8, 0.9)
    assert cfg.checkpoint.dir == "2024"


def test_precedence_defaults_then_preset_then_file_then_set(tmp_path):
    path = write(tmp_path, '[model]\npreset = "125m"\nn_layers = 3\n')
    cfg = load_config(path, ["model.vocab_size=1024"])
    assert cfg.model.dim == 768  # from the preset
    assert cfg.model.n_layers == 3  # the file beats the preset
    assert cfg.model.vocab_size == 1024  # --set beats both
    assert cfg.model.norm_eps == 1e-5  # the dataclass default
    # a preset given only on the command line fills the shape too
    assert load_config(write(tmp_path, ""), ["model.preset=1b"]).model.ffn_dim == 8192


@pytest.mark.parametrize(
    ("toml", "overrides", "message"),
    [
        (
            "[modle]\ndim = 1\n",
            [],
            r"\[modle\] in .*: unknown section; allowed: run, model, parallel, fp8, data",
        ),
        ("[model]\ndimm = 1\n", [], r"model.dimm: unknown key; allowed: preset, dim, n_layers"),
        ('[run]\nsteps = "ten"\n', [], r"run.steps='ten': allowed: an integer$"),
        ("[run]\nsteps = 1.5\n", [], r"run.steps=1.5: allowed: an integer$"),
        ("[parallel]\ncompile = 1\n", [], r"parallel.compile=1: allowed: true or false$"),
        ("[optim]\nbetas = [0.9]\n", [], r"optim.betas=\[0.9\]: allowed: a list \[a number, a number\]"),
        ("run = 3\n", [], r"run=3 in .*: allowed: a table \[run\]"),
        ("", ["run.steps=abc"], r"run.steps='abc': allowed: an integer$"),
        ("", ["run.steps"], r"--set 'run.steps': allowed: section.field=value"),
        ("", ["steps=3"], r"--set 'steps=3': allowed: section.field=value"),
        ("", ["runn.steps=3"], r"--set 'runn.steps=3': unknown section 'runn'; allowed: run, model"),
        ("", ["fp8.backend=fp4"], r"^fp8.backend='fp4': allowed: none, torchao, te$"),
        ("", ["run.seq_len=0"], r"^run.seq_len=0: allowed: an integer >= 1$"),
        ("", ["parallel.param_dtype=fp16"], r"^parallel.param_dtype='fp16': allowed: bfloat16, float32$"),
        ("", ["parallel.loss_chunk_tokens=-4096"],
         r"^parallel.loss_chunk_tokens=-4096: allowed: an integer >= 0 \(0 = the loss on the full logits, "),
        ("[parallel]\nloss_chunk_tokens = 4096.0\n", [], r"^parallel.loss_chunk_tokens=4096.0: allowed: an integer$"),
        ("", ["model.preset=2b"], r"^model.preset='2b': allowed: tiny, 125m, 1b, llama3-8b, llama3-70b"),
        (
            "",
            ["fp8.backend=te", "parallel.compile=true"],
            r"^parallel.compile=True: not allowed with fp8.backend='te'",
        ),
        (
            "",
            ["data.source=shards"],
            r"^data.path='': allowed: a shard directory",
        ),  # another section's validate()
        ("[run\n", [], r"run.toml: invalid TOML"),
    ],
)
def test_errors_name_the_field_the_value_and_what_is_allowed(tmp_path, toml, overrides, message):
    with pytest.raises(ConfigError, match=message):
        load_config(write(tmp_path, toml), overrides)


def test_to_dict_round_trips_through_the_dataclasses():
    cfg = load_config(None, ["run.steps=7"])
    data = cfg.to_dict()
    assert data["run"]["steps"] == 7 and data["model"]["preset"] == "tiny"
    assert set(data) == {"run", "model", "parallel", "fp8", "data", "optim", "checkpoint", "metrics",
                         "validation", "init", "export"}
    assert TrainConfig().run.steps != 7  # defaults are per instance, not shared


def test_tokens_per_step():
    cfg = load_config(None, ["run.seq_len=32", "run.micro_batch_size=4", "run.grad_accum_steps=2"])
    assert cfg.run.tokens_per_step(dp_world_size=3) == 32 * 4 * 2 * 3


def test_a_wsd_decay_that_does_not_fit_after_the_warmup_is_refused():
    with pytest.raises(ConfigError, match=r"^optim.decay_steps=95: with optim.schedule='wsd' the decay \(95 steps\) "
                                          r"and optim.warmup_steps \(10\) exceed run.steps \(100\); allowed: "):
        load_config(None, ["run.steps=100", "optim.schedule=wsd", "optim.decay_steps=95"])
    cfg = load_config(None, ["run.steps=100", "optim.schedule=wsd", "optim.decay_steps=90"])
    assert cfg.optim.decay_window(cfg.run.steps) == (10, 90)
