#!/usr/bin/env bash
# Every GPU check of the project in one prepared script (issue 37), in order of priority. Each step has its own time
# limit; the default steps' limits add up to 540 s (9 minutes on one H200), and no step may run past what is left of
# that budget (BUDGET, seconds), so one that fails or overruns does not take the others with it.
#   1. install         the wheels of scripts/gpu_prepare.sh ($WHEEL_DIR: .whl, --dry-run .whl-local) into a
#                      temporary target (pip --no-index --no-deps --target), put first on PYTHONPATH; each module
#                      they bring must import from there. Without the folder: a line, if everything imports already
#   2. tests           tests/test_gpu.py: the Triton depth kernels == the torch path (ops at the paper widths, fp32
#                      and bf16; Block and Full models), cached decoding == full forward, regional and whole compile
#                      == eager, CUDA == CPU, bf16 two-phase == plain, zero-init, flash == math, trainer=gpu trains
#   3. train           the path a user takes: `python -m experiments.train` at paper_194m, context 8192, Block
#                      AttnRes, trainer=gpu (bf16-mixed), train_path=compiled with ATTNRES_COMPILE=regional, 40 steps
#                      of 4 x 8192 tokens, logger=none; SIGUSR1 before step 21 (fault injection), then the same
#                      command resumes it. Checked: the loss fell, the records (interrupted, completed) are complete,
#                      metrics.csv has every step once, the last two checkpoints (scripts/gpu_suite_checks.py train)
#                      -> gpu_train.json (tokens/s, MFU)
#   4. eager_194m      paper_194m at context 8192, bf16 + flash, eager: step, tokens/s, MFU, prefill, decode latency
#                      (ms/token, batch 1, 32 tokens after an 8160-token prefill), saved and peak memory, each as a
#                      ratio to the baseline of the same run -> gpu_eager_194m.json
#   5. eager_528m      the same at paper_528m (2 x 8192 tokens per step) -> gpu_eager_528m.json
#   6. regional_194m   paper_194m, compile regional (attention and MLP compiled once, the depth mixing's Triton
#                      kernels eager): first step (compile time), step, MFU, prefill, peak memory
#   7. regional_528m   the same at paper_528m
#   8. depth_roofline  the depth kernels alone at paper_194m and paper_528m (8 x 8192 tokens): every call of a Block
#                      and a Full step timed, its minimum bytes, achieved GB/s and % of the HBM peak
#                      (experiments/depth_roofline.py)
#      (decode latency is measured inside eager_194m and eager_528m, --decode-tokens)
#   9. moe             paper_194m_moe against the dense paper_194m at equal activated N, bf16: MoE / dense step and
#                      the grouped GEMM against the loop over experts (experiments/bench/moe_section.py)
#  10. muon            Muon's step time against AdamW's at paper_194m, baseline and Block (issue 35): the same bench
#                      with --optimizer adamw, then --optimizer muon -> gpu_muon_adamw.json, gpu_muon_muon.json;
#                      skipped with a line where conf/optimizer/muon.yaml or that flag is missing
# Optional steps (not in the default STEPS, no share of the budget's plan): whole_194m (the whole model compiled),
# bench_fp32 (fp32, TF32 off), harness (Lightning vs a plain loop).
# Everything lands in $OUT (default reports/gpu): the log gpu_suite.log and, at the end, one gpu_results.json with
# every step's outcome and JSON (the parts are merged and removed: at most 8 files come back from the GPU machine).
#
#   bash scripts/gpu_prepare.sh && <device tool: carry [".whl"]> bash scripts/gpu_suite.sh   # on the GPU machine
#   bash scripts/gpu_prepare.sh --local && bash scripts/gpu_suite.sh --dry-run   # the same on the CPU, tiny sizes
#   STEPS="tests train" bash scripts/gpu_suite.sh              # only some steps (install always runs first)
#   bash scripts/gpu_suite.sh --list                           # the steps, their limits and the sum
set -uo pipefail
cd "$(dirname "$0")/.."

# name:limit in seconds, in priority order (the default STEPS); then the optional steps
PLAN=(install:15 tests:100 train:140 eager_194m:50 eager_528m:45 regional_194m:55 regional_528m:35
  depth_roofline:30 moe:40 muon:30)
OPTIONAL=(whole_194m:60 bench_fp32:50 harness:90)
BUDGET="${BUDGET:-540}"

if [[ "${1:-}" == "--list" ]]; then
  total=0
  for e in "${PLAN[@]}"; do printf '%-16s %4ss\n' "${e%%:*}" "${e##*:}"; total=$((total + ${e##*:})); done
  printf '%-16s %4ss (budget %ss)\n' total "$total" "$BUDGET"
  for e in "${OPTIONAL[@]}"; do printf '%-16s %4ss (optional)\n' "${e%%:*}" "${e##*:}"; done
  exit 0
fi

OUT="${OUT:-reports/gpu}"
PYTHON="${PYTHON:-python}"
export PYTHONUNBUFFERED=1
mkdir -p "$OUT"
LOG="$OUT/gpu_suite.log"
: >"$LOG"
WORK=$(mktemp -d "${TMPDIR:-/tmp}/gpu_suite.XXXXXX")
trap 'rm -rf "$WORK"' EXIT

TRAIN_STEPS=40
TRAIN_SIGNAL=20
if [[ "${1:-}" == "--dry-run" ]]; then
  DRY=1; WHEEL_DIR="${WHEEL_DIR:-.whl-local}"
  DEV=(--device cpu --threads 1); S194=tiny; S528=tiny; MOE_PAIR=cpu_moe:cpu_xs; SEQ=64; B194=2; B528=2; R=1; R528=1
  DEC=4; RB=2; FLASH=(--sdpa math); HSTEPS=4
  TRAIN=(size=cpu_xs trainer=cpu threads=1 data.max_bytes=2000000 size.batch_size=4
    "train.tokens=$((TRAIN_STEPS * 4 * 128))")
  PRECISION=32-true
  export OMP_NUM_THREADS=1
  SCALE=6  # the CPU compiles even the tiny size slower than the GPU the paper's
else
  DRY=0; WHEEL_DIR="${WHEEL_DIR:-.whl}"
  DEV=(--device cuda); S194=paper_194m; S528=paper_528m; MOE_PAIR=paper_194m_moe:paper_194m; SEQ=8192; B194=4; B528=2
  R=5; R528=3; DEC=32; RB=8; FLASH=(--sdpa flash); HSTEPS=14
  TRAIN=(size=paper_194m tuned_lr=paper trainer=gpu data.max_bytes=20000000 size.batch_size=4
    "train.tokens=$((TRAIN_STEPS * 4 * 8192))")
  PRECISION=bf16-mixed
  SCALE=1
fi
TRAIN+=(model=block_attnres train_path=compiled logger=none train.log_every=1 train.eval_count=2
  train.val_sequences=8 train.val_batch_size=4 callbacks.model_checkpoint.every_n_train_steps=15
  trainer.enable_progress_bar=false)

DEFAULT_STEPS=""
for e in "${PLAN[@]}"; do DEFAULT_STEPS+="${e%%:*} "; done
STEPS="${STEPS:-$DEFAULT_STEPS}"
[[ " $STEPS " == *" install "* ]] || STEPS="install $STEPS"  # every other step imports what it installs
BUDGET=$((BUDGET * SCALE))
failed=()
skipped=()
: >"$WORK/steps.tsv"

limit_of() {  # limit_of <name>: its planned limit in seconds
  local e
  for e in "${PLAN[@]}" "${OPTIONAL[@]}"; do [[ ${e%%:*} == "$1" ]] && { echo "${e##*:}"; return; }; done
  echo 60
}

skip() {  # skip <name> <why>: a planned step that does not run, one line
  [[ " $STEPS " == *" $1 "* ]] || return 0
  echo "=== [$1] skipped: $2" | tee -a "$LOG"
  skipped+=("$1")
  printf '%s\t0\t0\t0\tskipped\n' "$1" >>"$WORK/steps.tsv"
}

step() {  # step <name> <command...>: run it if in STEPS, within its limit and what is left of the budget
  local name=$1; shift
  [[ " $STEPS " == *" $name "* ]] || return 0
  local limit=$(($(limit_of "$name") * SCALE)) left=$((BUDGET - SECONDS))
  if ((left < 10 * SCALE)); then
    skip "$name" "${left}s left of the ${BUDGET}s budget"
    return 0
  fi
  ((limit > left)) && limit=$left
  local t0=$SECONDS
  echo "=== [$name] $* (limit ${limit}s)" | tee -a "$LOG"
  timeout --signal=INT --kill-after=10 "$limit" "$@" 2>&1 | tee -a "$LOG"
  local rc=${PIPESTATUS[0]}
  echo "=== [$name] rc=$rc in $((SECONDS - t0))s" | tee -a "$LOG"
  printf '%s\t%s\t%s\t%s\t%s\n' "$name" "$rc" "$((SECONDS - t0))" "$limit" "$([[ $rc -eq 0 ]] && echo ok || echo failed)" \
    >>"$WORK/steps.tsv"
  [[ $rc -eq 0 ]] || failed+=("$name(rc=$rc)")
}

if [[ $DRY -eq 0 ]]; then
  nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv 2>&1 | tee -a "$LOG"
fi
"$PYTHON" -c "import platform, torch; print('python', platform.python_version(), 'torch', torch.__version__, 'CUDA',
torch.version.cuda)" 2>&1 | tee -a "$LOG"

# 1. the wheels; the later steps import from the target first
step install "$PYTHON" scripts/gpu_suite_checks.py install --wheels "$WHEEL_DIR" --target "$WORK/site"
[[ -d "$WORK/site" ]] && export PYTHONPATH="$WORK/site${PYTHONPATH:+:$PYTHONPATH}"

# 2. the GPU tests (the image's own pytest plugins stay out: only ours are on the path first)
step tests env PYTEST_DISABLE_PLUGIN_AUTOLOAD=1 "$PYTHON" -m pytest tests/test_gpu.py -q -p no:cacheprovider \
  --durations=10

# 3. a real training run, interrupted once and resumed
step train env ATTNRES_COMPILE=regional "$PYTHON" scripts/gpu_suite_checks.py train --workdir "$WORK/train" \
  --out "$OUT/gpu_train.json" --steps "$TRAIN_STEPS" --signal-step "$TRAIN_SIGNAL" \
  --expect-train-path compiled:regional --expect-precision "$PRECISION" -- "${TRAIN[@]}"

# 4-7. step ratios, eager and regional compile
bench=("$PYTHON" -m experiments.bench "${DEV[@]}" --seq-len "$SEQ" --harness off --bf16 "${FLASH[@]}")
step eager_194m "${bench[@]}" --sizes "$S194" --batch-size "$B194" --repeats "$R" --decode-tokens "$DEC" \
  --out "$OUT/gpu_eager_194m.json"
step eager_528m "${bench[@]}" --sizes "$S528" --batch-size "$B528" --repeats "$R528" --decode-tokens "$DEC" \
  --out "$OUT/gpu_eager_528m.json"
step regional_194m "${bench[@]}" --sizes "$S194" --batch-size "$B194" --repeats "$R528" --compile regional \
  --out "$OUT/gpu_regional_194m.json"
step regional_528m "${bench[@]}" --sizes "$S528" --batch-size "$B528" --repeats "$R528" --compile regional \
  --no-prefill --out "$OUT/gpu_regional_528m.json"

# 8. the depth kernels' roofline
step depth_roofline "$PYTHON" -m experiments.depth_roofline "${DEV[@]:0:2}" --sizes "$S194,$S528" \
  --batch-size "$RB" --seq-len "$SEQ" --out "$OUT/gpu_depth_roofline.json"

# 9. MoE: grouped GEMM against the loop
step moe "${bench[@]}" --moe-pairs "$MOE_PAIR" --schemes baseline,block --batch-size "$B194" --repeats "$R528" \
  --out "$OUT/gpu_moe_194m.json"

# 10. Muon against AdamW (the recipe of issue 35)
if [[ " $STEPS " == *" muon "* ]]; then
  if [[ -f conf/optimizer/muon.yaml ]] && "$PYTHON" -m experiments.bench --help 2>/dev/null | grep -q -- '--optimizer'; then
    opt=("${bench[@]}" --sizes "$S194" --batch-size "$B194" --schemes baseline,block --repeats "$R528" --no-prefill
      --no-memory)
    # shellcheck disable=SC2016  # expanded by the inner bash
    step muon bash -c '"${@:2}" --optimizer adamw --out "$1/gpu_muon_adamw.json" &&
      "${@:2}" --optimizer muon --out "$1/gpu_muon_muon.json"' muon "$OUT" "${opt[@]}"
  else
    skip muon "conf/optimizer/muon.yaml or experiments.bench --optimizer is not there (issue 35)"
  fi
fi

# optional
step whole_194m "${bench[@]}" --sizes "$S194" --batch-size "$B194" --repeats 2 --compile whole --no-prefill \
  --out "$OUT/gpu_whole_194m.json"
step bench_fp32 "$PYTHON" -m experiments.bench "${DEV[@]}" --seq-len "$SEQ" --harness off --sizes "$S194" \
  --batch-size "$B194" --repeats 2 --no-memory --out "$OUT/gpu_bench_fp32.json"
step harness "$PYTHON" -m experiments.bench "${DEV[@]}" --seq-len "$SEQ" --sizes "$S194" --batch-size "$B194" \
  --bf16 "${FLASH[@]}" --schemes baseline --repeats 1 --no-memory --no-prefill --harness on \
  --harness-steps "$HSTEPS" --harness-rounds 2 --harness-logger none --out "$OUT/gpu_harness.json"

bundle_args=(--out "$OUT" --steps "$WORK/steps.tsv")
[[ $DRY -eq 1 ]] && bundle_args+=(--dry-run)
"$PYTHON" scripts/gpu_suite_checks.py bundle "${bundle_args[@]}" 2>&1 | tee -a "$LOG" || failed+=("bundle")
echo "gpu_suite: ${#failed[@]} step(s) failed: ${failed[*]:-none}; skipped: ${skipped[*]:-none}; $((SECONDS))s;" \
  "results in $OUT/gpu_results.json" | tee -a "$LOG"
[[ ${#failed[@]} -eq 0 ]]
