#!/usr/bin/env bash
# One-GPU check of poslab's CUDA paths, in under 10 minutes (plus at most 8 for step 4), nothing downloaded
# (see benchmarks/README.md).
#
#   benchmarks/gpu_check.sh                 # on a machine with one CUDA GPU
#   benchmarks/gpu_check.sh --dry-run       # CPU-safe parts at tiny sizes (the default test suite runs this)
#   benchmarks/gpu_check.sh --out FILE.json # where the figures go (default runs/gpu_check/gpu_check.json)
#   benchmarks/gpu_check.sh --skip-time-to-loss  # steps 1-3 only (under 10 minutes)
#
# 1. the CUDA-marked tests (tests/test_cuda.py: flex = sdpa = eager for every scheme in fp32/bf16,
#    forward + backward; KV-cache decoding; a training step per scheme), JUnit XML kept;
# 2. benchmarks/gpu_check.py: the bf16 matmul peak, a 124M RoPE GPT's bf16 tokens/s and MFU,
#    ALiBi/T5 through flex vs no bias; it folds the test counts in and writes one JSON;
# 3. benchmarks/gpu_check.py --lab-size: the lab's `gpu` size of the extrapolation experiment (RoPE,
#    3 seeds, 200 steps, device cuda) through the lab's code, into lab_gpu_size.json beside the JSON;
# 4. benchmarks/time_to_loss.py --recipe gpu: the preset shakespeare-char-gpu against nanoGPT's own
#    model and GPU recipe (bf16 autocast), side by side, one seed, to whole-split val 1.47, into
#    time_to_loss_gpu.json beside the JSON (its own cap, about 8 more minutes; --skip-time-to-loss
#    leaves it out).
# Python: $PYTHON, else .venv/bin/python, else python3. Exit status: non-zero when a test failed
# or the figures could not be written.
set -uo pipefail
cd "$(dirname "$0")/.." || exit 2
ROOT=$PWD

DRY=0
TTL=1
OUT=runs/gpu_check/gpu_check.json
while [ $# -gt 0 ]; do
    case "$1" in
        --dry-run) DRY=1 ;;
        --skip-time-to-loss) TTL=0 ;;
        --out) shift; OUT=${1:?--out needs a file name} ;;
        -h|--help) sed -n '2,21p' "$0"; exit 0 ;;
        *) echo "gpu_check.sh: unknown option '$1'; allowed: --dry-run, --out FILE, --skip-time-to-loss" >&2; exit 2 ;;
    esac
    shift
done

if [ -n "${PYTHON:-}" ]; then PY=$PYTHON
elif [ -x "$ROOT/.venv/bin/python" ]; then PY=$ROOT/.venv/bin/python
else PY=python3
fi
export PYTHONPATH="$ROOT${PYTHONPATH:+:$PYTHONPATH}"
DIR=$(dirname "$OUT")
mkdir -p "$DIR" || exit 2
JUNIT="$DIR/cuda_tests.xml"
START=$(date +%s)

if [ "$DRY" = 0 ] && ! "$PY" -c 'import sys, torch; sys.exit(0 if torch.cuda.is_available() else 1)'; then
    echo "gpu_check.sh: no CUDA device visible to torch ($PY); run with --dry-run on a CPU machine" >&2
    exit 2
fi
if [ "$DRY" = 0 ] && command -v nvidia-smi >/dev/null; then
    nvidia-smi --query-gpu=name,memory.total,driver_version --format=csv,noheader || true
fi

# 1. CUDA tests (without CUDA, as in --dry-run, they are collected and skipped: a syntax or import check)
TEST_LIMIT=300
[ "$DRY" = 1 ] && TEST_LIMIT=60
echo "== CUDA tests (limit ${TEST_LIMIT}s)"
timeout "$TEST_LIMIT" "$PY" -m pytest -q -m cuda tests/test_cuda.py -p no:cacheprovider --junitxml="$JUNIT" -rfE
TESTS_RC=$?
[ "$TESTS_RC" = 124 ] && echo "gpu_check.sh: the CUDA tests ran past ${TEST_LIMIT}s and were stopped" >&2

# 2. figures; the budget keeps the whole script under 8 minutes
ELAPSED=$(( $(date +%s) - START ))
BUDGET=$(( 390 - ELAPSED ))
[ "$BUDGET" -lt 30 ] && BUDGET=30
echo "== figures (start no section after ${BUDGET}s)"
ARGS=(--out "$OUT" --junit "$JUNIT" --tests-rc "$TESTS_RC" --budget-s "$BUDGET")
[ "$DRY" = 1 ] && ARGS+=(--dry-run)
"$PY" benchmarks/gpu_check.py "${ARGS[@]}"
FIG_RC=$?

# 3. one GPU size of one training experiment, capped (the dry run: the smoke size on the CPU)
LAB_LIMIT=150
echo "== the lab's gpu size, capped (limit ${LAB_LIMIT}s)"
LAB_ARGS=(--lab-size --out "$DIR/lab_gpu_size.json")
[ "$DRY" = 1 ] && LAB_ARGS+=(--dry-run)
timeout "$LAB_LIMIT" "$PY" benchmarks/gpu_check.py "${LAB_ARGS[@]}"
LAB_RC=$?
[ "$LAB_RC" = 124 ] && echo "gpu_check.sh: the lab size ran past ${LAB_LIMIT}s and was stopped" >&2

# 4. time to val 1.47: shakespeare-char-gpu vs nanoGPT's GPU recipe (the dry run: 2 steps each on the CPU)
TTL_RC=0
if [ "$TTL" = 1 ]; then
    TTL_LIMIT=480
    echo "== time to quality, shakespeare-char-gpu vs nanoGPT's GPU recipe (limit ${TTL_LIMIT}s)"
    TTL_ARGS=(--recipe gpu --seeds 1337 --threads 4 --runs "$DIR/time_to_loss_runs" --out "$DIR/time_to_loss_gpu.json")
    if [ "$DRY" = 1 ]; then TTL_ARGS+=(--dry-run --device cpu); else TTL_ARGS+=(--device cuda --nano-dtype bf16); fi
    timeout "$TTL_LIMIT" "$PY" benchmarks/time_to_loss.py "${TTL_ARGS[@]}"
    TTL_RC=$?
    [ "$TTL_RC" = 124 ] && echo "gpu_check.sh: time to quality ran past ${TTL_LIMIT}s and was stopped" >&2
fi

echo "gpu_check.sh: tests rc=$TESTS_RC, figures rc=$FIG_RC, lab size rc=$LAB_RC, time to quality rc=$TTL_RC, $(( $(date +%s) - START ))s, JSON: $OUT"
# pytest exits 5 when no test ran (all deselected); a dry run on CPU skips them all, which is fine
if [ "$FIG_RC" != 0 ]; then exit "$FIG_RC"; fi
if [ "$LAB_RC" != 0 ]; then exit "$LAB_RC"; fi
if [ "$TTL_RC" != 0 ]; then exit "$TTL_RC"; fi
if [ "$TESTS_RC" != 0 ] && [ "$TESTS_RC" != 5 ]; then exit "$TESTS_RC"; fi
exit 0
