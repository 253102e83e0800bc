#!/bin/bash
# The H100 check (issue 29): one script, one device call, everything the plan and docs/benchmarks.md claim
# and only a GPU can show. Run from anywhere; it works in the repository root.
#
#   bash benchmarks/scripts/h100_check.sh [--out DIR] [--only PART,...] [--deadline-s S] [--layers-8b N]
#   bash benchmarks/scripts/h100_check.sh --dry-run --out DIR     # every part on the CPU at toy sizes, 3x the
#                                                                  # budgets below (the tests run it)
#
# THE PLAN FOR 15 MINUTES OF DEVICE TIME (the machine's start and every idle wait count)
#   0:00-2:00  the machine starts (1-2 min; it is bare: no torchao, no torchtitan, no network)
#   then ONE call, the script's own deadline 480 s, so that the call ends by ~10:30 with the transfers; a part
#   starts only with its minimum left (else "skipped: out of time") and never runs past the deadline:
#     (expected total ~445 s; the budgets add up to more, so an overrun costs the last parts, not the first)
#     part         budget  expected  what (most valuable first)
#     1 node-fp8     60 s    ~30 s   the packages step (node_bootstrap/packages.py) installs the lock's torchao
#                                    from build/wheelhouse and runs its import check; then the health gate's FP8
#                                    check (fp8_check.py -> fp8_probe.py --backends torchao --device cuda). Every
#                                    node runs it at boot: if it fails, fix that before anything else.
#     2 fp8-8b      200 s   ~150 s   Llama 3 8B's shapes (--preset llama3-8b --layers 10, seq 8192, mb 1, compile):
#                                    bf16 vs torchao tensorwise vs rowwise, target FP8 >= 1.3x bf16. 10 layers: the
#                                    most clusterctl's memory model (an upper bound) fits: 68.5 GiB of the 73 it
#                                    allows on 80 GB (11 layers: 73.4). The bench writes its JSON after each row
#     3 mfu-1b       75 s    ~60 s   1b bf16, seq 4096, mb 4, compile, a fresh inductor cache: target MFU >= 50%
#     4 local-tier  150 s   ~115 s   the 1b config (torchao tensorwise, eager) with the local tier every 4 steps:
#                                    the loop's hold, the save + verify time (16.7 GiB written, hashed), then a
#                                    resume from the local tier whose first step must equal the straight run's
#     5a hf-parity   45 s    ~25 s   trainer started from HF weights (init.hf_dir) vs transformers, on the GPU
#     5b compile-cache 45 s  ~30 s   part 3 again on its now warm inductor cache: warm vs cold compile
#     6 layout-tp1   60 s    ~35 s   the trainer's layout path on one GPU (issue 43): the 1b config with
#                                    parallel.dp_replicate=1 dp_shard=1 tp=1 set, torchao tensorwise FP8, eager,
#                                    mb 2, 6 steps: the step records' layout and peak memory against
#                                    clusterctl/plan/memory.py's prediction for that shape (target: at or under
#                                    it: the plan must not promise memory a layout does not have)
#     2b titan-8b   (own call)       torchtitan's float8 at part 2's shapes: only with --only titan-8b (it needs
#                                    ~300 s and its wheels carried in .whl/: torchtitan 0.2.2 and its
#                                    dependencies), so that the full run's files stay 8
#   ~10:30     the call returns; ~4 min are left: if one part failed for a reason fixed in minutes, rerun it at
#              once on the still-warm machine (warm only 30 s after a call): --only PART, timeout_s 200 (5b
#              needs 3's cache: --only mfu-1b,compile-cache); $OUT comes back empty before each call, so keep
#              the first call's files (files_at) first; else give_back.
#   The call (build/wheelhouse is ignored by git: carry it; add ".whl" to carry only with torchtitan's wheels):
#     run(command="bash benchmarks/scripts/h100_check.sh 2>&1", carry=["build/wheelhouse"], timeout_s=540)
#
# Output: one JSON file per part under $OUT (default ./out; the device tool sets $OUT), written even when the
# part or a later one fails or runs out of time (status "failed: ..." / "skipped: ..."), the tools' records
# embedded, then summary.json and a table (status, key figure, target, met) printed last. $OUT holds 8 files
# at most (the device tool brings back 8): 1-, 2-, 3-, 4-, 5a-, 5b-, 6-*.json and summary.json (--only
# titan-8b: 2b-*.json and summary.json). Scratch
# (checkpoints, caches, the installed lock) goes to --work DIR (default a temporary directory, removed).
set -u
CALLER=$PWD  # relative --out and --work are the caller's
REPO=$(cd "$(dirname "${BASH_SOURCE[0]}")/../.." && pwd)
cd "$REPO" || exit 2
DRY=0 ONLY="" DEADLINE_S="" L8B=10 WORK="" KEEP_WORK=0
OUT=${OUT:-./out}
while [ $# -gt 0 ]; do
  case "$1" in
    --dry-run) DRY=1 ;;
    --out) OUT=${2:?"--out needs a value"}; shift ;;
    --only) ONLY=${2:?"--only needs a value"}; shift ;;
    --deadline-s) DEADLINE_S=${2:?"--deadline-s needs a value"}; shift ;;
    --layers-8b) L8B=${2:?"--layers-8b needs a value"}; shift ;;
    --work) WORK=${2:?"--work needs a directory"}; KEEP_WORK=1; shift ;;
    -h|--help) sed -n '2,/^set -u/{/^set -u/d;p}' "$0"; exit 0 ;;
    *) echo "h100_check.sh: unknown argument $1: allowed: --dry-run --out DIR --only PART,... --deadline-s S" \
         "--layers-8b N --work DIR" >&2; exit 2 ;;
  esac
  shift
done
[[ "$L8B" =~ ^[1-9][0-9]*$ ]] || { echo "h100_check.sh: --layers-8b=$L8B: allowed: an integer >= 1" >&2; exit 2; }
[[ "$DEADLINE_S" =~ ^[0-9]*$ ]] || {
  echo "h100_check.sh: --deadline-s=$DEADLINE_S: allowed: seconds, an integer >= 0" >&2; exit 2; }
PARTS="node-fp8 fp8-8b mfu-1b local-tier hf-parity compile-cache layout-tp1 titan-8b"
for p in ${ONLY//,/ }; do
  case " $PARTS " in *" $p "*) ;; *) echo "h100_check.sh: --only $p: allowed: ${PARTS// /, }" >&2; exit 2 ;; esac
done
case "$OUT" in /*) ;; *) OUT=$CALLER/$OUT ;; esac
case "$WORK" in /*|"") ;; *) WORK=$CALLER/$WORK ;; esac
PY=${PYTHON:-python3}
[ -n "$WORK" ] || WORK=$(mktemp -d "${TMPDIR:-/tmp}/h100-check.XXXXXX")
RAW=$WORK/raw
mkdir -p "$OUT" "$RAW"
OUT=$(cd "$OUT" && pwd)
# a full run starts clean; --only replaces its parts' files and summarizes them with the others found there
[ -n "$ONLY" ] || rm -f "$OUT"/[0-9]*-*.json
rm -f "$OUT"/summary.json
[ "$KEEP_WORK" = 1 ] || trap 'rm -rf "$WORK"' EXIT
if [ "$DRY" = 1 ]; then
  DEVICE=cpu DEADLINE_S=${DEADLINE_S:-300}
  export OMP_NUM_THREADS=${OMP_NUM_THREADS:-1}  # 2-core CI: a second OpenMP thread spin-waits
else
  DEVICE=cuda DEADLINE_S=${DEADLINE_S:-480}
fi
export PY RAW WORK DRY DEVICE L8B REPO PYTHONUNBUFFERED=1 PYTHONWARNINGS=ignore
export PYTHONPATH=$REPO
STARTED=$(date +%s)
REPORT="$PY $REPO/benchmarks/scripts/h100_check_report.py"

# ---- the parts: each runs under `timeout` in its own bash, writing its tools' output under $RAW ----
bench() {  # bench NAME ARGS...: python -m training.bench, its JSON to $RAW/NAME.json
  local name=$1; shift
  $PY -m training.bench "$@" --json "$RAW/$name.json"
}
inductor_cache() {  # inductor_cache DIR: torch.compile's caches (FX graph, AOTAutograd, Triton) in DIR only
  export TORCHINDUCTOR_CACHE_DIR=$1 TRITON_CACHE_DIR=$1/triton
}
part_node_fp8() {
  $PY benchmarks/scripts/h100_node_check.py --work "$WORK/node" --device "$DEVICE" --json "$RAW/node-fp8.json"
}
part_fp8_8b() {
  if [ "$DRY" = 1 ]; then
    bench fp8-8b --preset tiny --seq-len 32 --micro-batch-size 2 --steps 2 --warmup-steps 1 \
      --backends none,torchao --torchao-recipes tensorwise,rowwise
  else
    inductor_cache "$WORK/inductor-8b"
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # fewer fragmentation OOMs near 80 GB; not part 3
    bench fp8-8b --compile --preset llama3-8b --layers "$L8B" --seq-len 8192 --micro-batch-size 1 --steps 8 \
      --warmup-steps 3 --backends none,torchao --torchao-recipes tensorwise,rowwise
  fi
}
mfu_1b_bench() {  # part 3 and 5b: the same compile, the second time on the first one's cache
  inductor_cache "$WORK/inductor-1b"
  if [ "$DRY" = 1 ]; then
    bench "$1" --compile --backends none --preset tiny --seq-len 32 --micro-batch-size 2 --steps 2 --warmup-steps 1
  else
    bench "$1" --compile --backends none --micro-batch-size 4 --steps 12 --warmup-steps 4
  fi
}
part_mfu_1b() { rm -rf "$WORK/inductor-1b"; mfu_1b_bench mfu-1b; }
part_compile_cache() { mfu_1b_bench compile-warm; }
part_local_tier() {
  local args=(--set data.source=synthetic --set run.steps=8 --set run.log_interval_steps=1
              --set checkpoint.dir= --set checkpoint.local_dir="$WORK/local" --set checkpoint.local_interval_steps=4
              --set optim.warmup_steps=2 --set metrics.nvml=false)
  if [ "$DRY" = 1 ]; then
    args+=(--set fp8.backend=torchao --set fp8.emulate=true)  # the default config: tiny, CPU
  else  # the 1b config as the nodes run it (torchao tensorwise), eager: the tier does not depend on compile
    args+=(--config 1b --set run.micro_batch_size=2 --set parallel.compile=false)
  fi
  local run
  for run in straight resumed; do
    $PY -m training "${args[@]}" --resume "$([ $run = straight ] && echo none || echo auto)" \
      > "$RAW/local-$run.jsonl" 2> "$RAW/local-$run.err" \
      || { echo "$run run: exit $?"; tail -n 15 "$RAW/local-$run.err"; }
  done
  rm -rf "$WORK/local"  # 17 GiB at 1b
  $PY benchmarks/scripts/resume_check.py "$RAW/local-straight.jsonl" "$RAW/local-resumed.jsonl" local-tier \
    --json "$RAW/local-resume-check.json"
}
part_layout_tp1() {  # the layout path at tp 1 with FP8; its peak memory against the plan's (the report)
  local args=(--set parallel.dp_replicate=1 --set parallel.dp_shard=1 --set parallel.tp=1 --set run.steps=6
              --set run.log_interval_steps=1 --set checkpoint.dir= --set checkpoint.local_interval_steps=0
              --set data.source=synthetic --set optim.warmup_steps=2 --set metrics.nvml=false)
  if [ "$DRY" = 1 ]; then
    args+=(--set fp8.backend=torchao --set fp8.emulate=true)  # the default config: tiny, CPU
  else  # the 1b config's model and FP8 (torchao tensorwise), eager, mb 2 (the plan: 42.7 GiB of 73)
    args+=(--config 1b --set run.micro_batch_size=2 --set parallel.compile=false)
  fi
  $PY -m training "${args[@]}" --resume none > "$RAW/layout-tp1.jsonl" 2> "$RAW/layout-tp1.err" \
    || { echo "exit $?"; tail -n 15 "$RAW/layout-tp1.err"; }
  printf '%s\n' "${args[@]}" > "$RAW/layout-tp1.args"  # the report predicts the memory of this run's config
}
part_hf_parity() {
  $PY benchmarks/scripts/hf_parity_check.py --work "$WORK/hf" --json "$RAW/hf-parity.json" --timeout-s 100
}
part_titan_8b() {  # torchtitan and its dependencies from the carried wheels, beside the lock's torchao
  local site=$WORK/titan-site
  find .whl -name '*.whl' 2>/dev/null | grep -q . && \
    $PY -m pip install -q --no-index --no-deps --no-compile --target "$site" $(find .whl -name '*.whl')
  export PYTHONPATH=$PYTHONPATH:$site
  if [ "$DRY" = 1 ]; then
    bench titan-8b --torchtitan-only --preset tiny --seq-len 32 --micro-batch-size 2 --steps 2 --warmup-steps 1 \
      --backends none,torchao --torchao-recipes tensorwise,rowwise
  else
    inductor_cache "$WORK/inductor-titan"
    export PYTORCH_CUDA_ALLOC_CONF=expandable_segments:True  # as part 2
    bench titan-8b --torchtitan-only --compile --preset llama3-8b --layers "$L8B" --seq-len 8192 \
      --micro-batch-size 1 --steps 8 --warmup-steps 3 --backends none,torchao --torchao-recipes tensorwise,rowwise
  fi
}
export -f bench inductor_cache mfu_1b_bench part_node_fp8 part_fp8_8b part_mfu_1b part_compile_cache \
  part_local_tier part_hf_parity part_layout_tp1 part_titan_8b

run_part() {  # run_part FILE NAME BUDGET_S MIN_S: its function under timeout, then its JSON, whatever happened
  local file=$OUT/$1-$2.json name=$2 budget=$3 min=$4
  if [ -n "$ONLY" ] && [[ ",$ONLY," != *",$name,"* ]]; then return; fi
  local left=$(( DEADLINE_S - ($(date +%s) - STARTED) ))
  if [ "$left" -lt "$min" ]; then
    $REPORT skip "$name" --out "$file" \
      --reason "out of time: ${left} s left of the script's ${DEADLINE_S} s, the part needs ${min} s"
    return
  fi
  # the budgets are the H100's; the dry run's toy parts get 3x, since a loaded 2-core CI machine can take a
  # cold CPU compile past 75 s (the minimums and the deadline still apply)
  [ "$DRY" = 1 ] && budget=$(( budget * 3 ))
  local limit=$(( budget < left ? budget : left )) began
  began=$(date +%s.%N)
  echo "== $name (at most $limit s)"
  timeout -k 10 "$limit" bash -c "part_${name//-/_}" > "$RAW/$name.log" 2>&1
  local rc=$?
  $REPORT part "$name" --raw "$RAW" --out "$file" --exit-code $rc --budget-s "$limit" \
    --wall-s "$(awk "BEGIN { print $(date +%s.%N) - $began }")" $([ "$DRY" = 1 ] && echo --dry-run)
}

[ "$DRY" = 1 ] || nvidia-smi --query-gpu=name,driver_version,power.limit,memory.total --format=csv,noheader
run_part 1 node-fp8 60 30
# the later parts import the lock's torchao from where the packages step put it; if the step failed, the
# wheels go to a plain directory instead, so that its failure does not also cost the measurements
LOCK_SITE=$($PY -c "import json,sys; print(json.load(open(sys.argv[1])).get('lock_site') or '')" \
  "$RAW/node-fp8.json" 2>/dev/null)
if [ -z "$LOCK_SITE" ]; then
  LOCK_SITE=$WORK/site
  timeout 120 $PY -m pip install -q --no-index --no-deps --no-compile --target "$LOCK_SITE" build/wheelhouse/*.whl \
    || echo "the lock's wheels did not install from build/wheelhouse: torchao rows will be skipped"
fi
export PYTHONPATH=$LOCK_SITE:$REPO
run_part 2 fp8-8b 200 90
run_part 3 mfu-1b 75 45
run_part 4 local-tier 150 90
run_part 5a hf-parity 45 25
run_part 5b compile-cache 45 30
run_part 6 layout-tp1 60 40
if [[ ",$ONLY," == *",titan-8b,"* ]]; then  # its own call: a ninth file would not come back
  if find .whl -name 'torchtitan-*.whl' 2>/dev/null | grep -q . || $PY -c "import torchtitan" 2>/dev/null; then
    run_part 2b titan-8b 300 150
  else
    $REPORT skip titan-8b --out "$OUT/2b-titan-8b.json" \
      --reason "torchtitan not importable: carry its wheels in .whl/ (docs/benchmarks.md, 'The next H100 check')"
  fi
fi
$REPORT summary --out-dir "$OUT"
