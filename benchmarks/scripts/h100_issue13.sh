#!/bin/bash
# Issue 13's remaining H100 measurements, in parts that each fit one 10-minute device call:
#
#   bash benchmarks/scripts/h100_issue13.sh loss     # bf16 1b: fused chunked loss off/on, micro-batch 4, 6, 8
#   bash benchmarks/scripts/h100_issue13.sh fp8-8b   # Llama 3 8B's matmul shapes (4 layers): bf16 vs torchao, vs torchtitan
#   bash benchmarks/scripts/h100_issue13.sh fp8-1b   # 1b torchao tensorwise and rowwise, three processes each (the spread)
#   bash benchmarks/scripts/h100_issue13.sh ckpt     # 1b checkpoint: staging inline (before) vs auto (after)
#   bash benchmarks/scripts/h100_issue13.sh resume   # correctness first: resume from an async checkpoint staged on
#                                                    # the side CUDA stream (checkpoint.staging=auto), and with the fused loss
#
# Run from the repository root. It installs torchao 0.18.0 and torchtitan 0.2.2 (with their dependencies) from
# wheels carried in .whl/ when the machine cannot reach PyPI (the device tool's carry: .whl), else from PyPI.
# Every bench run writes its JSON under $OUT (default /tmp/h100-issue13); each part prints a short summary last.
# Each run is capped by `timeout`, so one hung row cannot take the whole call.
set -u
OUT=${OUT:-/tmp/h100-issue13}
mkdir -p "$OUT"
export PYTHONPATH=/tmp/site:$PWD PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore

install() {  # into /tmp/site, as the 2026-11-23 GPU runs did: the machine's own packages stay untouched
  python3 -c "import torchao, torchtitan" 2>/dev/null && return
  if [ -d .whl ]; then
    python3 -m pip install -q --no-index --no-deps --no-compile --target /tmp/site .whl/ao18/*.whl .whl/tt022/*.whl \
      > /dev/null 2>&1 || echo "wheel install failed"
  else
    python3 -m pip install -q --no-compile --target /tmp/site torchao==0.18.0 torchtitan==0.2.2 > /dev/null 2>&1 \
      || echo "install from PyPI failed"
  fi
}

versions() {
  nvidia-smi --query-gpu=name,driver_version,power.limit --format=csv,noheader
  python3 -c "import torch; print('torch', torch.__version__, 'cuda', torch.version.cuda, 'cudnn', torch.backends.cudnn.version())"
  python3 -c "import torchao; print('torchao', torchao.__version__)" 2>/dev/null
  python3 -c "from importlib.metadata import version; print('torchtitan', version('torchtitan'))" 2>/dev/null
}

bench() {  # bench NAME ARGS...: one process (add --compile where wanted), JSON to $OUT/NAME.json, the table to $OUT/NAME.txt
  local name=$1; shift
  timeout 540 python3 -m training.bench "$@" --json "$OUT/$name.json" > "$OUT/$name.txt" 2> "$OUT/$name.err" \
    || echo "$name: exit $?; $(tail -2 "$OUT/$name.err")"
}

summary() {  # the rows of every JSON of this part: name, row, tokens/s, MFU, peak GiB, ours/titan
  python3 - "$OUT" "$1" <<'EOF'
import json, pathlib, sys
for path in sorted(pathlib.Path(sys.argv[1]).glob(sys.argv[2] + "*.json")):
    data = json.loads(path.read_text())
    for r in data.get("results", []):
        mfu = f"{100 * r['mfu']:.1f}%" if r.get("mfu") else "-"
        ratio = f"{r['vs_torchtitan']:.3f}x" if r.get("vs_torchtitan") else ""
        tokens = f"{r['tokens_per_s']:,.0f}" if r.get("tokens_per_s") else r["status"]
        peak = f"{r['peak_memory_gib']:.1f}" if r.get("peak_memory_gib") else "-"
        print(f"{path.stem:<28} {r['backend']:<26} {tokens:>10} {mfu:>7} {peak:>6} GiB {ratio} {r.get('reason', '')[:80]}")
EOF
}

part=${1:?"which part: loss, fp8-8b, fp8-1b, ckpt or resume"}
install
versions | tee "$OUT/versions-$part.txt"
case "$part" in
  loss)
    # the peak clusterctl's memory model is pinned to (44.78 GiB eager at mb 2, measured before the bf16
    # logits were freed before backward: tests/clusterctl/test_plan_memory.py)
    bench loss-mb2-eager-full --backends none --micro-batch-size 2 --steps 4 --warmup-steps 2
    bench loss-mb4-full --compile --backends none --micro-batch-size 4 --steps 12 --warmup-steps 4
    bench loss-mb4-chunk4k --compile --backends none --micro-batch-size 4 --steps 12 --warmup-steps 4 --loss-chunk-tokens 4096
    bench loss-mb6-chunk4k --compile --backends none --micro-batch-size 6 --steps 10 --warmup-steps 4 --loss-chunk-tokens 4096
    bench loss-mb8-chunk4k --compile --backends none --micro-batch-size 8 --steps 8 --warmup-steps 3 --loss-chunk-tokens 4096
    summary loss ;;
  fp8-8b)
    bench fp8-8b-l4 --compile --preset llama3-8b --layers 4 --backends none,torchao --compare-torchtitan \
      --micro-batch-size 2 --steps 10 --warmup-steps 4
    summary fp8-8b ;;
  fp8-1b)
    for i in 1 2 3; do
      bench "fp8-1b-mb4-run$i" --compile --backends none,torchao --micro-batch-size 4 --steps 12 --warmup-steps 4
    done
    summary fp8-1b ;;
  ckpt)
    for staging in inline auto; do
      timeout 280 python3 -m training.bench_io checkpoint --preset 1b --dir /tmp/ckpt-bench --repeats 2 \
        --staging $staging --json "$OUT/ckpt-1b-$staging.json" > /dev/null 2> "$OUT/ckpt-1b-$staging.err" \
        || echo "ckpt $staging: exit $?"
      tail -12 "$OUT/ckpt-1b-$staging.err"
    done ;;
  resume)
    OUT=$OUT/resume bash benchmarks/scripts/gpu_resume_check.sh
    OUT=$OUT/resume VARIANTS=none TAG=-fused-loss EXTRA="--set parallel.loss_chunk_tokens=2048" \
      bash benchmarks/scripts/gpu_resume_check.sh ;;
  *) echo "unknown part $part: allowed: loss, fp8-8b, fp8-1b, ckpt, resume"; exit 2 ;;
esac
