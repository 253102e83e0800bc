"""The sections of Hugging Face weights in and out: ``[init]`` and ``[export]`` (docs/weights.md).

Apart from training.config.sections only to keep modules small; like it, no torch: clusterctl validates these
settings with training.config.load_config on a machine without torch.
"""

from __future__ import annotations

import os
from dataclasses import dataclass

from training.errors import ConfigError


@dataclass
class InitConfig:
    """The ``[init]`` section: where a fresh run's weights come from (docs/weights.md)."""

    # A Hugging Face Llama model directory (config.json, *.safetensors, model.safetensors.index.json), e.g.
    # /fsx/data/Llama-3.1-8B: its config.json gives the model's shape and its weights are loaded at a fresh
    # start; a resume loads the job's own checkpoint instead. "" = random initial weights (run.seed).
    hf_dir: str = ""

    def validate(self) -> None:
        if not isinstance(self.hf_dir, str):
            raise ConfigError(f"init.hf_dir={self.hf_dir!r}: allowed: a Hugging Face model directory, or '' for none")


@dataclass
class ExportConfig:
    """The ``[export]`` section: a Hugging Face model directory written at the end of a run (docs/weights.md)."""

    # Written from the final checkpoint (so checkpoint.dir and checkpoint.save_final are required) once every
    # step is done; not after a SIGTERM. A relative path is under checkpoint.dir ("hf-final": on the cluster the
    # job owns only its own /fsx/checkpoints/<job id>, whose id a config cannot know). "" = no export
    # (python -m training.export does it any time).
    hf_dir: str = ""

    def resolve(self, checkpoint_dir: str) -> str:
        """Where the export goes: hf_dir, or checkpoint_dir/hf_dir for a relative one."""
        return os.path.join(checkpoint_dir, self.hf_dir) if self.hf_dir else ""

    def validate(self) -> None:
        if not isinstance(self.hf_dir, str):
            raise ConfigError(f"export.hf_dir={self.hf_dir!r}: allowed: a directory to write, or '' for none")
