"""What tests/training/test_hf_torchrun.py runs on each of 2 ranks under torchrun: the trainer's own Hugging Face
import (build_model on the meta device, fully_shard, to_empty, load_hf_weights) for every model named in
WORK/kinds.json, with the sharded model's logits on WORK/tokens.pt saved by rank 0 and the freshly imported
state saved as a checkpoint (WORK/import-<kind>/step-0, with the run's config in train_state.json) for the
export; then a real run of the trainer (training.train.train) on WORK/train.json's --set items."""

from __future__ import annotations

import json
import sys
from pathlib import Path

import torch

from training.checkpoint.checkpointer import Checkpointer
from training.config import load_config
from training.fp8 import build_fp8_backend
from training.hf.load import load_hf_weights, resolve_init_model
from training.optim import build_optimizer
from training.parallel.process_group import init_distributed
from training.train import build_model, train


def main(work: Path) -> None:
    info = init_distributed()
    tokens = torch.load(work / "tokens.pt")
    for kind, hf_dir in json.loads((work / "kinds.json").read_text()).items():
        cfg = resolve_init_model(load_config(None, [f"init.hf_dir={hf_dir}", "model.preset=",
                                                    f"checkpoint.dir={work / f'import-{kind}'}"]))
        model = build_model(cfg.model, cfg.parallel, build_fp8_backend(cfg.fp8), info, seed=0)
        optimizer = build_optimizer(model, cfg.optim)
        load_hf_weights(model, cfg, rank=info.rank)
        model.eval()
        with torch.no_grad():
            logits = model(tokens)  # a collective: every rank runs the forward (FSDP2 gathers the blocks)
        if info.is_main:
            torch.save(logits, work / f"logits-{kind}.pt")
        checkpointer = Checkpointer(cfg.checkpoint, rank=info.rank, world_size=info.world_size,
                                    config_snapshot=cfg.to_dict(), device=info.device)
        checkpointer.save(0, model, optimizer, blocking=True)
        checkpointer.close()
    train(load_config(None, json.loads((work / "train.json").read_text())), resume="auto")


if __name__ == "__main__":
    main(Path(sys.argv[1]))
