#!/bin/bash
# The real training loop (python -m training) on one GPU: a straight run vs a resume from its async periodic
# checkpoint at step 8, for bf16 and torchao FP8 (tensorwise and rowwise), compile on, the 125m preset.
mkdir -p ${OUT:-/tmp/resume-check}
# needs torchao importable (pip install torchao==0.18.0)
# VARIANTS: which backends (default all three); EXTRA: more --set options for both runs of each, e.g.
# EXTRA="--set parallel.loss_chunk_tokens=2048 --set checkpoint.staging=inline"; TAG: a suffix for the file names
# --overwrite-checkpoints: both runs save into $d, the resumed one from step 8 beside the straight run's step 16
export PYTHONPATH=$PWD${PYTHONPATH:+:$PYTHONPATH} PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
for v in ${VARIANTS:-none torchao:tensorwise torchao:rowwise}; do
  b=${v%%:*}; r=${v#*:}; d=/tmp/ck-$b-$r${TAG:-}
  S="--config training/configs/125m.toml --set data.source=synthetic --set run.steps=16 --set run.seq_len=2048 --set run.micro_batch_size=8 --set run.log_interval_steps=1 --set parallel.compile=true --set parallel.param_dtype=bfloat16 --set fp8.backend=$b --set checkpoint.dir=$d --set checkpoint.interval_steps=8 --set optim.warmup_steps=2 ${EXTRA:-}"
  [ "$b" = torchao ] && S="$S --set fp8.torchao_recipe=$r"
  timeout 200 python3 -m training $S --resume none --overwrite-checkpoints > ${OUT:-/tmp/resume-check}/$b-$r${TAG:-}-straight.jsonl 2> /tmp/$b-$r${TAG:-}-straight.err || { echo "$v straight failed"; tail -5 /tmp/$b-$r${TAG:-}-straight.err; }
  timeout 200 python3 -m training $S --resume $d/step-8 --overwrite-checkpoints > ${OUT:-/tmp/resume-check}/$b-$r${TAG:-}-resumed.jsonl 2> /tmp/$b-$r${TAG:-}-resumed.err || { echo "$v resume failed"; tail -5 /tmp/$b-$r${TAG:-}-resumed.err; }
  grep -h "checkpoint step\|unverified\|WARNING" /tmp/$b-$r${TAG:-}-*.err | head -4
  python3 benchmarks/scripts/resume_check.py ${OUT:-/tmp/resume-check}/$b-$r${TAG:-}-straight.jsonl ${OUT:-/tmp/resume-check}/$b-$r${TAG:-}-resumed.jsonl "$v${TAG:-}"
done
