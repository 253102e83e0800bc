"""One 4-rank job (gloo, float32, the tiny model) that trains the same run under every layout in turn, in the
same process group, and prints what the test compares (tests/training/test_layouts.py):

1) FSDP 4, HSDP 2 x 2, TP 2 x FSDP 2 and HSDP 2 x TP 2, each STEPS steps from the same seed: the per-step
   losses (the mean over the step's samples, as the step record logs it);
2) the FSDP 4 run saved after SAVE_AT steps (the trainer's Checkpointer, DCP) and loaded into HSDP 2 x 2 and
   TP 2 x FSDP 2: whether every loaded parameter equals the saved one exactly, and the losses of the steps
   after it;
3) tied embeddings (one parameter for the embedding and the output head) under FSDP 4 and TP 2 x FSDP 2, for
   TIED_STEPS steps: the losses, and whether the output head is still the embedding's parameter;
4) under TP 2 x FSDP 2 with FP8 (torchao, emulated, rowwise scaling: the plain TP styles) and activation
   checkpointing: FP8_STEPS steps saved after FP8_SAVE_AT, then resumed at the same layout (the test asks for
   the same losses, bit for bit); and the refusal of tensorwise scaling under TP on the CPU (its Float8 styles
   all-gather FP8 tensors, which gloo cannot);
5) under TP 2 x FSDP 2: the Hugging Face model in HF_DIR imported with the trainer's load (each rank asks DCP
   for its own slices): whether each parameter, gathered, equals the file's tensor and each rank holds a
   quarter of each matrix; the logits (saved to ROOT/hf-logits.pt) and loss on ROOT/hf-tokens.pt's tokens; the
   imported state saved as ROOT/hf/step-0 for the test to export;
6) the held-out loss ([validation], on ROOT/held-out) after the FSDP 4, HSDP 2 x 2, TP 2 x FSDP 2 and TP 2 x
   HSDP 2 x 1 runs, each with its own micro-batch, and the windows its ranks scored; and in 4), the checkpoint
   the resume loads is the one a stop saves (a real SIGTERM on rank 1 alone, agreed by every rank at the step
   boundary: training.faults);
7) the local checkpoint tier under HSDP 2 x 2 with two ranks per "node" (ROOT/local/node0, node1: one replica
   group each): where a shard's twin in the other replica group saved the same state, no replica is sent; the
   node of ranks 2-3 is then lost, and a resume loads them from their twins' shards on node 0;
8) per-block compile under TP 2 x FSDP 2: one step's gradients against eager mode (compiled_under_tp).

Rank 0 prints one JSON line, ``{"layouts": ..., "resumed": ...}``. Run by the test through run_ranks (each rank
forked from a process with the trainer imported), with one node of 4 ranks: a tp group must fit a node.
"""

from __future__ import annotations

import dataclasses
import json
import os
import shutil
import signal
import sys

import torch
import torch.distributed as dist
from torch.distributed.algorithms._checkpoint.checkpoint_wrapper import CheckpointWrapper

from training.checkpoint.checkpointer import Checkpointer
from training.checkpoint.local_layout import inventory, read_shard_info, shard_dir
from training.checkpoint.local_resume import choose_local_resume, load_local
from training.checkpoint.local_tier import LocalCheckpointer, localize
from training.checkpoint.state import build_state, iter_leaves
from training.config import load_config
from training.data.batches import build_batch_source
from training.errors import ConfigError
from training.faults import StopRequest
from training.fp8 import build_fp8_backend
from training.hf.load import load_hf_weights, resolve_init_model
from training.hf.names import to_hf
from training.loss import cross_entropy_loss
from training.optim import apply_lr, build_optimizer, lr_at
from training.parallel.layout import resolve_layout
from training.parallel.process_group import init_distributed
from training.parallel.tp import maybe_loss_parallel
from training.step import clip_grad_norm_, forward_backward
from training.train import build_model
from training.validation import build_validator

STEPS = 20
SAVE_AT = 10
TIED_STEPS = 3
FP8_STEPS, FP8_SAVE_AT = 4, 2
TP_FSDP = (1, 2, 2)  # (dp_replicate, dp_shard, tp) of TP 2 x FSDP 2
LAYOUTS = {"FSDP 4": (1, 4, 1), "HSDP 2 x 2": (2, 2, 1), "TP 2 x FSDP 2": (1, 2, 2), "TP 2 x HSDP 2 x 1": (2, 1, 2)}
# The global batch (128 tokens: 8 samples of 16) is the same samples whatever the split: 4 data-parallel ranks x
# 2 samples, or 2 x 2 samples x 2 micro-batches (TP 2 x FSDP 2: accumulation follows the data-parallel size),
# or 2 x 4 samples in one micro-batch (TP 2 x HSDP 2 x 1, TP 2 x FSDP 2 resumed and the FP8 run: half the
# passes)
MICRO_BATCH = {"TP 2 x HSDP 2 x 1": 4}
RESUMED_MICRO_BATCH = {"TP 2 x FSDP 2": 4}
VALIDATED = ("FSDP 4", "HSDP 2 x 2", "TP 2 x FSDP 2", "TP 2 x HSDP 2 x 1")
HELD_OUT_WINDOWS = 15  # validation.windows: divides over neither 4 nor 2 data-parallel ranks, so ranks pad
RANKS_PER_NODE = 2  # 7): the local tier's "nodes" (ranks 0-1 and 2-3), one HSDP replica group on each
OVERRIDES = [
    "model.preset=tiny", "model.n_layers=1", "run.seq_len=16", "run.micro_batch_size=2", "run.global_batch_tokens=128",
    "parallel.param_dtype=float32", "optim.lr=3e-3", "optim.warmup_steps=2", f"run.steps={STEPS}",
]


def main(checkpoint_root: str, hf_dir: str) -> None:
    os.environ["LOCAL_WORLD_SIZE"] = "4"  # one node of 4 ranks (run_ranks says 1): tp 2 fits a node
    torch.set_num_threads(1)
    base = load_config(None, [*OVERRIDES, f"checkpoint.dir={checkpoint_root}", "checkpoint.async_save=false"])
    info = init_distributed()
    losses, resumed = {}, {}
    for name, degrees in LAYOUTS.items():
        losses[name] = train_steps(base, info, degrees, save_at=SAVE_AT if name == "FSDP 4" else None,
                                   micro_batch_size=MICRO_BATCH.get(name),
                                   then=_held_out_loss(checkpoint_root) if name in VALIDATED else None)
    saved = os.path.join(checkpoint_root, f"step-{SAVE_AT}")
    for name in ("HSDP 2 x 2", "TP 2 x FSDP 2"):
        resumed[name] = train_steps(base, info, LAYOUTS[name], load_from=saved,
                                    micro_batch_size=RESUMED_MICRO_BATCH.get(name))
    tied_cfg = dataclasses.replace(base, model=dataclasses.replace(base.model, tie_embeddings=True),
                                   run=dataclasses.replace(base.run, steps=TIED_STEPS))
    tied = {name: train_steps(tied_cfg, info, LAYOUTS[name]) for name in ("FSDP 4", "TP 2 x FSDP 2")}
    fp8 = fp8_checkpointed_resume(checkpoint_root, info)
    hf = hf_import(checkpoint_root, hf_dir, info)
    twins = local_tier_under_hsdp(checkpoint_root, base, info)
    compiled = compiled_under_tp(base, info)
    if info.rank == 0:
        print(json.dumps({"layouts": losses, "resumed": resumed, "tied": tied, "fp8": fp8, "hf": hf,
                          "local_twins": twins, "compiled_tp": compiled}), flush=True)
    dist.barrier()
    dist.destroy_process_group()


def compiled_under_tp(base, info):
    """8) Per-block torch.compile under TP 2 x FSDP 2 (one block, untied embedding): one forward and backward's
    gradients against the same model in eager mode, each parameter's relative difference. Compiled with
    AOTAutograd's aot_eager backend, the part of torch.compile that lost the embedding's gradient before
    training.parallel.parallelize.maybe_fresh_embedding_output (Inductor's code generation, which a P5 run
    adds, would cost this CPU test tens of seconds)."""
    import functools

    cfg = base  # one block already (OVERRIDES)
    grads = {}
    for compiled in (False, True):
        parallel = dataclasses.replace(cfg.parallel, dp_replicate=1, dp_shard=2, tp=2, compile=compiled)
        run_cfg = dataclasses.replace(cfg, parallel=parallel)
        layout = resolve_layout(parallel, world_size=info.world_size, gpus_per_node=4, model=run_cfg.model,
                                run=run_cfg.run)
        layout_info = dataclasses.replace(info, layout=layout)
        fp8 = build_fp8_backend(run_cfg.fp8)
        real_compile = torch.compile
        torch.compile = functools.partial(real_compile, backend="aot_eager")  # Module.compile calls it
        try:
            model = build_model(run_cfg.model, parallel, fp8, layout_info, seed=run_cfg.run.seed)
            source = build_batch_source(run_cfg.data, seq_len=run_cfg.run.seq_len,
                                        vocab_size=run_cfg.model.vocab_size, seed=run_cfg.run.seed,
                                        dp_rank=layout_info.dp_rank, dp_world_size=layout.dp_size,
                                        micro_batch_size=run_cfg.run.micro_batch_size, grad_accum_steps=1)
            forward_backward(model, fp8, [source.get(0, 0)], 1, loss_parallel=True)
        finally:
            torch.compile = real_compile
        grads[compiled] = {name: p.grad.full_tensor() for name, p in model.named_parameters()}
    return {name: ((grads[True][name] - eager).norm() / eager.norm()).item()
            for name, eager in grads[False].items()}


def fp8_checkpointed_resume(root, info):
    """4) FP8 (torchao's Float8Linear, emulated, rowwise scaling under the plain TP styles) and activation
    checkpointing under TP 2 x FSDP 2: the straight run, saved after FP8_SAVE_AT steps, and its resume at the
    same layout; then tensorwise scaling, whose Float8 styles the CPU refuses (the refusal's line)."""
    cfg = load_config(None, [*OVERRIDES, f"run.steps={FP8_STEPS}", f"checkpoint.dir={os.path.join(root, 'fp8')}",
                             "checkpoint.async_save=false", "fp8.backend=torchao", "fp8.emulate=true",
                             "fp8.torchao_recipe=rowwise", "parallel.activation_checkpointing=true",
                             "run.micro_batch_size=4"])
    straight = train_steps(cfg, info, TP_FSDP)
    stopped = train_steps(cfg, info, TP_FSDP, sigterm_after=FP8_SAVE_AT)  # the stop's save is what resumes
    resumed = train_steps(cfg, info, TP_FSDP, load_from=os.path.join(cfg.checkpoint.dir, f"step-{FP8_SAVE_AT}"))
    tensorwise = dataclasses.replace(cfg, fp8=dataclasses.replace(cfg.fp8, torchao_recipe="tensorwise"))
    try:
        train_steps(tensorwise, info, TP_FSDP)
        refused = None
    except ConfigError as exc:
        refused = str(exc)
    return {"straight": straight, "stopped": stopped, "resumed": resumed, "tensorwise_refused": refused}


def hf_import(root, hf_dir, info):
    """5) The trainer's Hugging Face import under TP 2 x FSDP 2 (see the module docstring)."""
    from safetensors.torch import load_file

    cfg = resolve_init_model(load_config(None, [
        f"init.hf_dir={hf_dir}", "model.preset=", "parallel.param_dtype=float32", "run.seq_len=16",
        "run.micro_batch_size=2", "run.global_batch_tokens=128", f"checkpoint.dir={os.path.join(root, 'hf')}",
        "checkpoint.async_save=false", "parallel.dp_shard=2", "parallel.tp=2"]))
    layout = resolve_layout(cfg.parallel, world_size=info.world_size, gpus_per_node=4, model=cfg.model, run=cfg.run)
    model = build_model(cfg.model, cfg.parallel, build_fp8_backend(cfg.fp8), dataclasses.replace(info, layout=layout),
                        seed=cfg.run.seed)
    optimizer = build_optimizer(model, cfg.optim)
    load_hf_weights(model, cfg, rank=info.rank)
    on_disk = {}
    for name in sorted(os.listdir(hf_dir)):
        if name.endswith(".safetensors"):
            on_disk.update(load_file(os.path.join(hf_dir, name)))
    # each parameter gathered from the ranks' slices equals the file's tensor, and each rank holds only its
    # quarter of every matrix (tp 2 x dp_shard 2; the norms' vectors are split by dp_shard only): the whole
    # model never sits on one rank
    imported = all(torch.equal(p.full_tensor(), on_disk[to_hf(n)].float()) for n, p in model.named_parameters())
    quarters = all(p.to_local().numel() * info.world_size == p.numel() for p in model.parameters() if p.dim() == 2)
    tokens = torch.load(os.path.join(root, "hf-tokens.pt"), weights_only=True)
    model.eval()
    with torch.no_grad(), maybe_loss_parallel(True):
        logits = model(tokens[:, :-1])  # vocabulary-sharded
        loss = cross_entropy_loss(logits, tokens[:, 1:]).full_tensor().item()
        full_logits = logits.full_tensor()
    if info.rank == 0:
        torch.save(full_logits, os.path.join(root, "hf-logits.pt"))
    checkpointer = Checkpointer(cfg.checkpoint, rank=info.rank, world_size=info.world_size,
                                config_snapshot=cfg.to_dict(), device=info.device)
    checkpointer.save(0, model, optimizer, blocking=True)  # the imported state, for the test's export
    checkpointer.close()
    return {"imported": _on_every_rank(imported), "matrices_quartered": _on_every_rank(quarters), "loss": loss,
            "tied": model.output.weight is model.tok_embeddings.weight}


def train_steps(base, info, degrees, *, save_at=None, load_from=None, micro_batch_size=None, sigterm_after=None,
                then=None):
    """The trainer's step (forward_backward, clip, AdamW, the FP8 backend's hook) under ``degrees``; the mean
    loss of each step, and with ``load_from`` also whether the loaded parameters equal those saved
    (``exact``). ``sigterm_after``: rank 1 alone gets a SIGTERM after that many steps, and the loop stops
    and saves as train.py's does (``stopped_at``). ``then(model, optimizer, cfg, layout_info)``: called after
    the steps, its value kept as ``then``."""
    dp_replicate, dp_shard, tp = degrees
    cfg = dataclasses.replace(base, parallel=dataclasses.replace(base.parallel, dp_replicate=dp_replicate,
                                                                 dp_shard=dp_shard, tp=tp))
    if micro_batch_size is not None:
        cfg = dataclasses.replace(cfg, run=dataclasses.replace(cfg.run, micro_batch_size=micro_batch_size))
    layout = resolve_layout(cfg.parallel, world_size=info.world_size, gpus_per_node=4, model=cfg.model,
                            run=cfg.run, fp8_backend=cfg.fp8.backend)
    layout_info = dataclasses.replace(info, layout=layout)
    fp8 = build_fp8_backend(cfg.fp8)
    model = build_model(cfg.model, cfg.parallel, fp8, layout_info, seed=cfg.run.seed)
    optimizer = build_optimizer(model, cfg.optim)
    checkpointer = Checkpointer(cfg.checkpoint, rank=info.rank, world_size=info.world_size,
                                config_snapshot=cfg.to_dict(), device=info.device)
    block = model.layers[0]
    start, result = 0, {"losses": [], "tied": model.output.weight is model.tok_embeddings.weight,
                        "checkpointed": isinstance(block, CheckpointWrapper),
                        "wq": type(block.get_submodule("attention.wq")).__name__,
                        "wq_tp_placements": [str(p) for p in block.get_submodule("attention.wq").weight.placements]}
    if load_from is not None:
        start = checkpointer.load(load_from, model, optimizer).step
        fp8.post_optimizer_step(model)  # as train() does after a load
        result["exact"] = _equals_saved(model, load_from)
    accum = result["accumulated"] = cfg.run.accumulation_steps(layout.dp_size)
    source = build_batch_source(cfg.data, seq_len=cfg.run.seq_len, vocab_size=cfg.model.vocab_size,
                                seed=cfg.run.seed, dp_rank=layout_info.dp_rank, dp_world_size=layout.dp_size,
                                micro_batch_size=cfg.run.micro_batch_size, grad_accum_steps=accum)
    stop = StopRequest().install()
    for step in range(start, cfg.run.steps):
        apply_lr(optimizer, lr_at(step, cfg.optim, cfg.run.steps))
        batches = [source.get(step, micro) for micro in range(accum)]
        loss = forward_backward(model, fp8, batches, accum, loss_parallel=tp > 1)
        clip_grad_norm_(model, cfg.optim.max_grad_norm)
        optimizer.step()
        optimizer.zero_grad(set_to_none=True)
        fp8.post_optimizer_step(model)
        dist.all_reduce(loss)  # the step record's mean over every rank (each sample counted once per tp rank)
        result["losses"].append(loss.item() / info.world_size)
        if sigterm_after == step + 1 and info.rank == 1:
            os.kill(os.getpid(), signal.SIGTERM)  # the handler only sets the flag, as in a real stop
        if stop.agreed():  # train.py's step boundary: every rank learns it, saves and stops
            result["stopped_at"] = step + 1
            _save(checkpointer, step + 1, model, optimizer, cfg, info)
            break
        if save_at == step + 1:
            _save(checkpointer, step + 1, model, optimizer, cfg, info)
    stop.uninstall()
    if then is not None:
        result["then"] = then(model, optimizer, cfg, layout_info)
    checkpointer.close()
    return result


def _save(checkpointer, step, model, optimizer, cfg, info) -> None:
    checkpointer.save(step, model, optimizer, blocking=True)
    full = {n: p.full_tensor() for n, p in model.named_parameters()}  # collective: every rank
    if info.rank == 0:
        torch.save(full, os.path.join(cfg.checkpoint.dir, "full-params.pt"))


def _held_out_loss(root):
    """6) A ``then`` for train_steps: the held-out loss of the trained weights, evaluated as train.py does, with
    the layout's own run.micro_batch_size (4 under TP 2 x HSDP 2 x 1, 2 elsewhere): the held-out set is
    validation.windows whatever the layout (training/validation.py). Also the distinct windows (their numbers in
    the held-out stream) the ranks scored and how many they scored, each tp group's once."""
    def evaluate(model, optimizer, cfg, layout_info):
        layout = layout_info.layout
        cfg = dataclasses.replace(cfg, validation=dataclasses.replace(
            cfg.validation, path=os.path.join(root, "held-out"), windows=HELD_OUT_WINDOWS))
        validator = build_validator(cfg, rank=layout_info.dp_rank, world_size=layout.dp_size,
                                    gather_size=layout_info.world_size, loss_parallel=layout.tp > 1)
        every_rank = _gathered(validator.scored_windows)
        return {"loss": validator.evaluate(model, step=cfg.run.steps, device=layout_info.device).loss,
                "windows": sorted({window for windows in every_rank for window in windows}),
                "scored": sum(len(windows) for windows in every_rank) // layout.tp}
    return evaluate


def local_tier_under_hsdp(root, base, info):
    """7) The local tier under HSDP 2 x 2 on two "nodes" of two ranks (see the module docstring)."""
    node_dir = os.path.join(root, "local", f"node{info.rank // RANKS_PER_NODE}")
    hsdp = LAYOUTS["HSDP 2 x 2"]
    saved = {}

    def tier():
        cfg = load_config(None, [f"checkpoint.local_dir={node_dir}", "checkpoint.local_interval_steps=2"])
        return LocalCheckpointer(cfg.checkpoint, rank=info.rank, world_size=info.world_size,
                                 local_world_size=RANKS_PER_NODE, device=info.device,
                                 layout=dict(zip(("dp_replicate", "dp_shard", "tp"), hsdp, strict=True)))

    def save(model, optimizer, cfg, layout_info):
        local = tier()
        local.save(2, model, optimizer)
        local.wait()
        local.close()
        saved["state"] = _cloned(localize(build_state(model, optimizer)))
        return {"counted": local.counted,
                "held": {step: sorted(shards) for step, shards in inventory(node_dir).items()},
                "same_state_as": list(read_shard_info(shard_dir(node_dir, 2, info.rank)).same_state_as)}

    def resume(model, optimizer, cfg, layout_info):
        local = tier()
        choice = choose_local_resume(local, not_older_than=0)
        load_local(choice, model, optimizer)
        local.close()
        exact = _same_leaves(localize(build_state(model, optimizer)), saved["state"])
        return {"step": choice.step, "fetched": choice.fetched, "exact": _on_every_rank(exact),
                "path": os.path.relpath(choice.path, os.path.join(root, "local"))}

    two_steps = dataclasses.replace(base, run=dataclasses.replace(base.run, steps=2))
    saving = train_steps(two_steps, info, hsdp, then=save)["then"]
    dist.barrier()
    if info.rank == RANKS_PER_NODE:  # node 1 is lost: its replacement starts with an empty local directory
        shutil.rmtree(node_dir)
    dist.barrier()
    other_start = dataclasses.replace(two_steps, run=dataclasses.replace(two_steps.run, steps=0, seed=7))
    resumed = train_steps(other_start, info, hsdp, then=resume)["then"]
    return _gathered({"saved": saving, "resumed": resumed})


def _cloned(tree):
    return {key: value.clone() if isinstance(value, torch.Tensor) else value for key, value in iter_leaves(tree)}


def _same_leaves(tree, saved) -> bool:
    leaves = dict(iter_leaves(tree))
    return leaves.keys() == saved.keys() and all(
        torch.equal(value, saved[key]) if isinstance(value, torch.Tensor) else value == saved[key]
        for key, value in leaves.items())


def _gathered(value):
    values = [None] * dist.get_world_size()
    dist.all_gather_object(values, value)
    return values


def _equals_saved(model, path) -> bool:
    """Every parameter, gathered whole, equal to the saved one (torch.save'd beside the checkpoint by rank 0
    of the saving run, below)."""
    saved = torch.load(os.path.join(path, "..", "full-params.pt"), weights_only=True)
    return _on_every_rank(all(torch.equal(p.full_tensor(), saved[n]) for n, p in model.named_parameters()))


def _on_every_rank(flag: bool) -> bool:
    flags = [None] * dist.get_world_size()
    dist.all_gather_object(flags, flag)
    return all(flags)


if __name__ == "__main__":
    main(sys.argv[1], sys.argv[2])  # a directory every rank sees (the test's tmp_path), the Hugging Face model
