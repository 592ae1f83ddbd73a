#!/usr/bin/env bash
# Every GPU check of the project in one prepared script (~10 minutes on one H200, most of it compiling), in
# order of priority;
# each step has its own time limit, so one that fails or overruns does not take the others with it:
#   1. tests/test_gpu.py             CUDA == CPU, bf16 two-phase == plain, zero-init, flash == math, compile,
#                                    trainer=gpu (bf16-mixed) trains to a completed record
#   2. gpu_bench.json                paper_194m at context 8192, bf16 + flash, eager: step, tokens/s, MFU, prefill,
#                                    memory, each as a ratio to the baseline (scripts/gpu_bench.sh)
#   3. gpu_bench_fp32.json           the same in fp32 (TF32 off, SDPA auto) - is bf16 the faster default?
#   4. gpu_bench_528m.json           paper_528m (L_b 17, 34 sublayers), bf16 + flash, eager
#   5. gpu_harness.json              Lightning harness vs a plain PyTorch loop at paper_194m, bf16
#   6. gpu_bench_compiled.json       paper_194m with torch.compile
# Results go to $OUT (default reports/gpu); logs to $OUT/gpu_suite.log.
#
#   bash scripts/gpu_suite.sh              # on the GPU machine
#   bash scripts/gpu_suite.sh --dry-run    # the same commands on the CPU at the tiny size (~2 min)
#   STEPS="tests harness" bash scripts/gpu_suite.sh     # only some steps
# Measured on an H200 (torch 2.11): tests ~55 s, bench_bf16 ~35 s, bench_fp32 ~40 s, bench_528m ~45 s, harness
# ~70 s; compiling the three paper_194m models did not finish in 250 s (COMPILE_LIMIT, default 300 s).
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-reports/gpu}"
PYTHON="${PYTHON:-python}"
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
LOG="$OUT/gpu_suite.log"
: >"$LOG"

if [[ "${1:-}" == "--dry-run" ]]; then
  DEV=(--device cpu --threads 1); S194=tiny; S528=tiny; SEQ=64; B194=2; B528=2; R=1; T=60
  FLASH=(--sdpa math); HSTEPS=4
else
  DEV=(--device cuda); S194=paper_194m; S528=paper_528m; SEQ=8192; B194=4; B528=2; R=5; T=1
  FLASH=(--sdpa flash); HSTEPS=14
fi

STEPS="${STEPS:-tests bench_bf16 bench_fp32 bench_528m harness bench_compiled}"
failed=()
step() {  # step <name> <seconds> <command...>
  local name=$1 limit=$2; shift 2
  [[ " $STEPS " == *" $name "* ]] || return 0
  local t0=$SECONDS
  echo "=== [$name] $* (limit ${limit}s)" | tee -a "$LOG"
  timeout --signal=INT --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "=== [$name] rc=$rc in $((SECONDS - t0))s" | tee -a "$LOG"
  [[ $rc -eq 0 ]] || failed+=("$name(rc=$rc)")
}

if [[ "${DEV[1]}" == "cuda" ]]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG"
  step tests 130 "$PYTHON" -m pytest tests/test_gpu.py -q -x -p no:cacheprovider
else
  step tests $T "$PYTHON" -m pytest tests/test_gpu.py -q -p no:cacheprovider
fi
bench=("$PYTHON" -m experiments.bench "${DEV[@]}" --seq-len "$SEQ" --harness off)
step bench_bf16 100 "${bench[@]}" --sizes "$S194" --batch-size "$B194" --bf16 "${FLASH[@]}" --repeats "$R" \
  --out "$OUT/gpu_bench.json"
step bench_fp32 50 "${bench[@]}" --sizes "$S194" --batch-size "$B194" --repeats 2 --no-memory \
  --out "$OUT/gpu_bench_fp32.json"
step bench_528m 70 "${bench[@]}" --sizes "$S528" --batch-size "$B528" --bf16 "${FLASH[@]}" --repeats 3 \
  --out "$OUT/gpu_bench_528m.json"
step harness 90 "$PYTHON" -m experiments.bench "${DEV[@]}" --seq-len "$SEQ" --sizes "$S194" --batch-size "$B194" \
  --bf16 "${FLASH[@]}" --schemes baseline --repeats 1 --no-memory --no-prefill --harness on \
  --harness-steps "$HSTEPS" --harness-rounds 2 --harness-logger none --out "$OUT/gpu_harness.json"
step bench_compiled "${COMPILE_LIMIT:-300}" "${bench[@]}" --sizes "$S194" --batch-size "$B194" --bf16 "${FLASH[@]}" --compile \
  --repeats 3 --no-memory --out "$OUT/gpu_bench_compiled.json"

echo "gpu_suite: ${#failed[@]} step(s) failed: ${failed[*]:-none}; results in $OUT" | tee -a "$LOG"
[[ ${#failed[@]} -eq 0 ]]
