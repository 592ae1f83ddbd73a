#!/usr/bin/env bash
# Every GPU check of the project in one prepared script, in order of priority, at most 8.5 minutes on one H200:
# each step has its own time limit (the limits add up to 510 s), so one that fails or overruns does not take the
# others with it and the whole script stays inside its budget.
#   1. tests              tests/test_gpu.py: the Triton depth kernels == the torch path (ops at the paper
#                         widths, fp32 and bf16; Block and Full models), cached decoding == full forward,
#                         regional and whole compile == eager, CUDA == CPU, bf16 two-phase == plain, zero-init,
#                         flash == math, trainer=gpu (bf16-mixed) trains
#   2. eager_194m         paper_194m at context 8192, bf16 + flash, eager: step, tokens/s, MFU, prefill, decode
#                         (ms/token, batch 1, 32 tokens after an 8160-token prefill), saved and peak memory, each
#                         as a ratio to the baseline of the same run -> gpu_eager_194m.json
#   3. eager_528m         the same at paper_528m (2 x 8192 tokens per step) -> gpu_eager_528m.json
#   4. regional_194m      paper_194m, compile regional (attention and MLP compiled once, the depth mixing's Triton
#                         kernels eager): first step (compile time), step, MFU, prefill, peak memory
#   5. regional_528m      the same at paper_528m
#   6. whole_194m         paper_194m, the whole model compiled (each model's first step = its compile time, logged
#                         as each finishes; before the Triton kernels three did not compile in 250 s): faster?
#   7. depth_roofline     the depth kernels alone at paper_194m and paper_528m (8 x 8192 tokens): every call of a
#                         Block and a Full step timed, its minimum bytes, achieved GB/s and % of the HBM peak
#                         (experiments/depth_roofline.py; eager_* print the same beside their step times)
# Optional steps (not in the default STEPS): bench_fp32 (fp32, TF32 off), harness (Lightning vs a plain loop), moe
# (paper_194m_moe against the dense paper_194m at equal activated N, bf16: MoE / dense step and the grouped GEMM
# against the loop over experts, experiments/bench/moe_section.py -> gpu_moe_194m.json).
# Results go to $OUT (default reports/gpu); logs to $OUT/gpu_suite.log.
#
#   bash scripts/gpu_suite.sh              # on the GPU machine
#   bash scripts/gpu_suite.sh --dry-run    # the same commands on the CPU at the tiny size (a few minutes)
#   STEPS="tests eager_194m" bash scripts/gpu_suite.sh     # only some steps
# None of these step times is measured yet (the limits are estimates from the last H200 session, torch 2.11:
# tests ~55 s, one eager paper_194m bench ~35 s, paper_528m ~45 s, before decoding and the Triton kernels).
set -uo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-reports/gpu}"
PYTHON="${PYTHON:-python}"
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
LOG="$OUT/gpu_suite.log"
: >"$LOG"

if [[ "${1:-}" == "--dry-run" ]]; then
  DEV=(--device cpu --threads 1); S194=tiny; S528=tiny; MOE_PAIR=cpu_moe:cpu_xs; SEQ=64; B194=2; B528=2; R=1; R528=1; DEC=4; T=1; RB=2
  FLASH=(--sdpa math); HSTEPS=4
else
  DEV=(--device cuda); S194=paper_194m; S528=paper_528m; MOE_PAIR=paper_194m_moe:paper_194m; SEQ=8192; B194=4; B528=2; R=5; R528=3; DEC=32; T=0; RB=8
  FLASH=(--sdpa flash); HSTEPS=14
fi

STEPS="${STEPS:-tests eager_194m eager_528m regional_194m regional_528m whole_194m depth_roofline}"
failed=()
step() {  # step <name> <seconds> <command...>
  local name=$1 limit=$2; shift 2
  [[ " $STEPS " == *" $name "* ]] || return 0
  [[ $T -eq 1 ]] && limit=$((limit * 6))  # the CPU compiles even the tiny size slower than the GPU the paper's
  local t0=$SECONDS
  echo "=== [$name] $* (limit ${limit}s)" | tee -a "$LOG"
  timeout --signal=INT --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "=== [$name] rc=$rc in $((SECONDS - t0))s" | tee -a "$LOG"
  [[ $rc -eq 0 ]] || failed+=("$name(rc=$rc)")
}

if [[ "${DEV[1]}" == "cuda" ]]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG"
  "$PYTHON" -c "import torch, triton; print('torch', torch.__version__, 'CUDA', torch.version.cuda, 'triton', triton.__version__)" \
    2>&1 | tee -a "$LOG"
fi
step tests 140 "$PYTHON" -m pytest tests/test_gpu.py -q -p no:cacheprovider
bench=("$PYTHON" -m experiments.bench "${DEV[@]}" --seq-len "$SEQ" --harness off --bf16 "${FLASH[@]}")
step eager_194m 70 "${bench[@]}" --sizes "$S194" --batch-size "$B194" --repeats "$R" --decode-tokens "$DEC" \
  --out "$OUT/gpu_eager_194m.json"
step eager_528m 60 "${bench[@]}" --sizes "$S528" --batch-size "$B528" --repeats "$R528" --decode-tokens "$DEC" \
  --out "$OUT/gpu_eager_528m.json"
step regional_194m 90 "${bench[@]}" --sizes "$S194" --batch-size "$B194" --repeats "$R528" --compile regional \
  --out "$OUT/gpu_regional_194m.json"
step regional_528m 50 "${bench[@]}" --sizes "$S528" --batch-size "$B528" --repeats "$R528" --compile regional \
  --no-prefill --out "$OUT/gpu_regional_528m.json"
step whole_194m 60 "${bench[@]}" --sizes "$S194" --batch-size "$B194" --repeats 2 --compile whole --no-prefill \
  --out "$OUT/gpu_whole_194m.json"
step depth_roofline 40 "$PYTHON" -m experiments.depth_roofline "${DEV[@]:0:2}" --sizes "$S194,$S528" \
  --batch-size "$RB" --seq-len "$SEQ" --out "$OUT/gpu_depth_roofline.json"
# optional
step bench_fp32 50 "$PYTHON" -m experiments.bench "${DEV[@]}" --seq-len "$SEQ" --harness off --sizes "$S194" \
  --batch-size "$B194" --repeats 2 --no-memory --out "$OUT/gpu_bench_fp32.json"
step harness 90 "$PYTHON" -m experiments.bench "${DEV[@]}" --seq-len "$SEQ" --sizes "$S194" --batch-size "$B194" \
  --bf16 "${FLASH[@]}" --schemes baseline --repeats 1 --no-memory --no-prefill --harness on \
  --harness-steps "$HSTEPS" --harness-rounds 2 --harness-logger none --out "$OUT/gpu_harness.json"
step moe 90 "${bench[@]}" --moe-pairs "$MOE_PAIR" --schemes baseline,block --batch-size "$B194" --repeats "$R528" \
  --out "$OUT/gpu_moe_194m.json"

echo "gpu_suite: ${#failed[@]} step(s) failed: ${failed[*]:-none}; results in $OUT" | tee -a "$LOG"
[[ ${#failed[@]} -eq 0 ]]
