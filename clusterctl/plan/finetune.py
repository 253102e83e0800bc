"""`clusterctl plan --finetune`: the schedule of a run that continues published weights, sized for its length, each
setting with its reason and the published recipe it follows (issue 44: a 477-step fine-tune kept pretraining's
2000 warmup steps, 500-step checkpoint interval and 3e-4 peak, so it never reached its peak and saved nothing on
the way).

The recipes, as read in their repositories:
- torchtune, recipes/configs/llama3_1/8B_full.yaml (full fine-tune of Llama 3.1 8B on several GPUs): AdamW at
  lr 2e-5. Its LoRA recipe (llama3_1/8B_lora.yaml) schedules with get_cosine_schedule_with_warmup: linear warmup,
  then a cosine to 0.
- Tulu 3 SFT of Llama 3.1 8B, allenai/open-instruct configs/train_configs/tulu3/tulu3_sft.yaml: lr 5e-6 ("best LR
  so far"), warmup_ratio 0.03, an effective batch of 128 sequences of up to 4096 tokens.
The sizes that depend on the run's length (warmup, checkpoint and validation intervals) are fractions of its steps,
so a 400-step run and a 40,000-step one get the same shape; the trainer's own check
(training.config.schedule.run_length_warnings) is what proves it.
"""

from __future__ import annotations

from dataclasses import dataclass

from training.config import TrainConfig
from training.config.schedule import describe_lr_schedule

TORCHTUNE_FULL = "torchtune recipes/configs/llama3_1/8B_full.yaml"
TORCHTUNE_COSINE = "torchtune llama3_1/8B_lora.yaml's get_cosine_schedule_with_warmup"
TULU3_SFT = "Tulu 3 SFT, allenai/open-instruct configs/train_configs/tulu3/tulu3_sft.yaml"
PEAK_LR = 2e-5  # torchtune's full fine-tune of Llama 3.1 8B (AdamW lr 2e-5)
TULU3_PEAK_LR = 5e-6  # Tulu 3's: the lower end, where the validation loss rises at PEAK_LR
FINAL_LR = 0.0  # both recipes' schedules end at 0 (cosine in torchtune's, linear in Tulu 3's)
WARMUP_FRACTION = 0.03  # Tulu 3's warmup_ratio
GLOBAL_BATCH_TOKENS = 128 * 4096  # Tulu 3's effective batch: 128 sequences of 4096 tokens, 2**19; pretraining: 2**22
CHECKPOINTS_PER_RUN = 10  # ours: a durable checkpoint every tenth of the run (a loss costs at most 10% of it)
VALIDATIONS_PER_RUN = 20  # ours: a held-out loss every twentieth, beside the one before step 1 and at the end


@dataclass(frozen=True)
class FinetuneSchedule:
    """The run-length-dependent settings of a fine-tune of `steps` optimizer steps."""

    steps: int  # run.steps
    global_batch_tokens: int  # tokens per optimizer step
    warmup_steps: int  # optim.warmup_steps: WARMUP_FRACTION of the run, at least 1, fewer than the run
    checkpoint_interval_steps: int  # checkpoint.interval_steps: a CHECKPOINTS_PER_RUN-th of the run
    validation_interval_steps: int  # validation.interval_steps; 0: the config has no validation.path
    init_hf_dir: str  # init.hf_dir to set ("" keeps the config's)

    def overrides(self, cfg: TrainConfig) -> list[str]:
        """The --set items that make `cfg` run this schedule (the schedule's shape only where cfg differs)."""
        items = [f"optim.lr={_lr(PEAK_LR)}", f"optim.min_lr={FINAL_LR}", f"optim.warmup_steps={self.warmup_steps}"]
        if cfg.optim.schedule != "cosine":
            items.append("optim.schedule=cosine")
        if cfg.optim.decay_steps:
            items.append("optim.decay_steps=0")  # 0: the cosine runs to the last step
        items.append(f"checkpoint.interval_steps={self.checkpoint_interval_steps}")
        if self.validation_interval_steps:
            items.append(f"validation.interval_steps={self.validation_interval_steps}")
        if self.init_hf_dir:
            items.append(f"init.hf_dir={self.init_hf_dir}")
        return items

    def lines(self, cfg: TrainConfig, batch_given: bool) -> list[str]:
        """Each setting and why, for the plan's output; `cfg` is the config the submit line runs."""
        start = (f"from init.hf_dir={cfg.init.hf_dir}" if cfg.init.hf_dir else
                 "from random weights: no init.hf_dir yet (--init-hf-dir DIR sets it)")
        tulu = f"{TULU3_SFT}: 128 sequences x 4096 tokens, an eighth of pretraining's 4Mi"
        batch = ("--global-batch-tokens or the config's run.global_batch_tokens"
                 + (f", as {tulu}" if self.global_batch_tokens == GLOBAL_BATCH_TOKENS else "")) if batch_given else tulu
        validation = (
            f"every {self.validation_interval_steps} steps (a twentieth of the run; ours), before step 1 "
            f"(validation.at_start={str(cfg.validation.at_start).lower()}: the imported model's own loss, the "
            "baseline) and after the last" if self.validation_interval_steps else
            "off: the config has no validation.path; add --set validation.path=DIR (held-out shards) --set "
            f"validation.interval_steps={max(1, self.steps // VALIDATIONS_PER_RUN)} --set validation.windows=128")
        return [
            f"fine-tune: {self.steps:,} steps {start}; each setting and the recipe it follows:",
            f"  global batch {self.global_batch_tokens:,} tokens: {batch}",
            f"  peak lr {_lr(PEAK_LR)}: {TORCHTUNE_FULL} (AdamW lr 2e-5); Tulu 3 used {_lr(TULU3_PEAK_LR)}, the one to "
            "try if the validation loss rises",
            f"  warmup {self.warmup_steps} steps: {WARMUP_FRACTION:.0%} of the run, Tulu 3's warmup_ratio",
            f"  decay: cosine to {FINAL_LR:g} over the remaining {self.steps - self.warmup_steps:,} steps, "
            f"{TORCHTUNE_COSINE} (Tulu 3 decays linearly to 0)",
            f"  durable checkpoint every {self.checkpoint_interval_steps} steps: a tenth of the run (ours), so a "
            "lost node costs at most that back to FSx; the local tier "
            + (f"saves every {cfg.checkpoint.local_interval_steps}" if cfg.checkpoint.local_interval_steps else
               "is off in this config"),
            f"  validation: {validation}",
            f"  {describe_lr_schedule(cfg.optim, self.steps)}",
        ]


def finetune_schedule(steps: int, global_batch_tokens: int, cfg: TrainConfig, init_hf_dir: str = "") -> (
        FinetuneSchedule):
    """The schedule for a fine-tune of `steps` steps of `cfg` (its validation.path decides whether to validate).
    A one-step run has no room for a warmup or a checkpoint before its end: the trainer's check says so."""
    return FinetuneSchedule(
        steps=steps,
        global_batch_tokens=global_batch_tokens,
        warmup_steps=min(max(1, round(WARMUP_FRACTION * steps)), steps - 1),
        checkpoint_interval_steps=max(1, steps // CHECKPOINTS_PER_RUN),
        validation_interval_steps=max(1, steps // VALIDATIONS_PER_RUN) if cfg.validation.enabled else 0,
        init_hf_dir=init_hf_dir,
    )


def _lr(value: float) -> str:
    """2e-05 -> '2e-5', as the recipes write it."""
    return f"{value:.0e}".replace("e-0", "e-")
