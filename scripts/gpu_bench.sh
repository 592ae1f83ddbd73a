#!/usr/bin/env bash
# One short GPU benchmark of the residual schemes at a paper size (a few minutes on one H100/H200):
#   paper_194m (Table 2's smallest row: L_b 12, d 896, 12 heads x 128) at context 8192, bf16 autocast,
#   flash SDPA; baseline vs Full vs Block AttnRes (N = 8), interleaved rounds.
# Reports step time, tokens/s, achieved FLOP/s and MFU against the GPU's dense bf16 peak (H200/H100: 989
# TFLOP/s), prefill time, bytes saved for backward and peak memory (torch.cuda.max_memory_allocated), each as
# a ratio to the baseline, and writes JSON to $OUT/gpu_bench.json ($OUT defaults to reports/bench).
#
#   bash scripts/gpu_bench.sh                      # on the GPU machine
#   BATCH=8 SIZE=paper_436m bash scripts/gpu_bench.sh
#   bash scripts/gpu_bench.sh --dry-run            # same flags on the CPU at the tiny size (tests/test_bench.py)
# Extra arguments go to `python -m experiments.bench` (e.g. --compile, --checkpointing, --repeats 9).
set -euo pipefail
cd "$(dirname "$0")/.."

OUT="${OUT:-reports/bench}"
SIZE="${SIZE:-paper_194m}"
SEQ="${SEQ:-8192}"
BATCH="${BATCH:-4}"          # 4 x 8192 = 32k tokens per step
REPEATS="${REPEATS:-5}"
PYTHON="${PYTHON:-python}"

args=()
device=cuda
for a in "$@"; do
  if [[ "$a" == "--dry-run" ]]; then
    device=cpu; SIZE=tiny; SEQ=64; BATCH=2; REPEATS=1
  else
    args+=("$a")
  fi
done

mkdir -p "$OUT"
if [[ "$device" == "cuda" ]]; then
  "$PYTHON" - <<'PY'
import torch
assert torch.cuda.is_available(), "scripts/gpu_bench.sh: torch sees no CUDA device (use --dry-run on a CPU)"
print(f"[gpu_bench] {torch.cuda.get_device_name(0)}, torch {torch.__version__}, CUDA {torch.version.cuda}")
PY
  extra=(--sdpa flash)
else
  extra=(--threads 1 --sdpa flash --warmup 1)
fi

set -x
"$PYTHON" -m experiments.bench --device "$device" --sizes "$SIZE" --seq-len "$SEQ" --batch-size "$BATCH" \
  --bf16 --repeats "$REPEATS" --harness off "${extra[@]}" --out "$OUT/gpu_bench.json" ${args[@]+"${args[@]}"}
