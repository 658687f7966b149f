#!/usr/bin/env bash
# The transformers integration on a machine with torch + transformers (the GPU machine): builds the
# Python module with the CUDA backend for that python3, runs the demo (BF16 and FP8 caches) and the
# integration tests, and writes logs, JSON figures and a summary to $OUT.
#
#   OUT=/some/dir scripts/hf-check.sh [all|build|run]      (from anywhere; OUT defaults to ./hf-check-out)
#
# `build` only configures and builds (build dir: DSA_HF_BUILD_DIR, default build-py, the one
# scripts/gpu-check.sh uses, so a kept one is reused); `run` only runs the demo and the tests
# against it; `all` (default) does both. Each step has a time limit; the exit status is 0 only if
# every step passed.
set -u
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
MODE=${1:-all}
OUT=${OUT:-$ROOT/hf-check-out}
mkdir -p "$OUT"
BUILD=${DSA_HF_BUILD_DIR:-$ROOT/build-py}
JOBS=$(nproc 2>/dev/null || echo 16)
[ "$JOBS" -gt 16 ] && JOBS=16
PY=$(command -v python3)
FAILED=0
: > "$OUT/steps.tsv"

step() {  # step NAME LIMIT_S COMMAND...: output to $OUT/NAME.log, PASS/FAIL/TIMEOUT in steps.tsv
  local name=$1 limit=$2 t0 rc status
  shift 2
  echo "== $name (limit ${limit}s): $*"
  t0=$(date +%s)
  { echo "\$ $*"; echo; } > "$OUT/$name.log"
  timeout --signal=TERM --kill-after=10 "$limit" "$@" >> "$OUT/$name.log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then status=PASS; elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status=TIMEOUT; else status=FAIL; fi
  [ "$status" = PASS ] || FAILED=1
  printf '%s\t%s\t%s\texit %s\n' "$name" "$status" "$(( $(date +%s) - t0 ))" "$rc" >> "$OUT/steps.tsv"
  echo "   -> $status ($(( $(date +%s) - t0 ))s)"
  [ "$status" = PASS ] || tail -n 30 "$OUT/$name.log" | sed 's/^/   | /'
}

{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown)"
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total --format=csv,noheader
  "$PY" -c 'import sys, torch; print("python", sys.version.split()[0], "torch", torch.__version__, "cuda", torch.version.cuda, "gpu", torch.cuda.is_available())' 2>&1
  "$PY" -c 'import transformers; print("transformers", transformers.__version__)' 2>&1
} > "$OUT/environment.txt"
cat "$OUT/environment.txt"

if [ "$MODE" = all ] || [ "$MODE" = build ]; then
  GEN=()
  command -v ninja > /dev/null && [ ! -f "$BUILD/CMakeCache.txt" ] && GEN=(-G Ninja)
  step hf_configure 120 cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DDSA_CUDA=ON \
    -DDSA_BUILD_PYTHON=ON -DDSA_BUILD_TESTS=OFF -DDSA_BUILD_TOOLS=OFF -DDSA_BUILD_BENCH=OFF -DPython_EXECUTABLE="$PY"
  step hf_build 420 cmake --build "$BUILD" -j "$JOBS" --target _dsa
fi

if [ "$MODE" = all ] || [ "$MODE" = run ]; then
  export PYTHONPATH="$BUILD/python${PYTHONPATH:+:$PYTHONPATH}"
  export PYTHONDONTWRITEBYTECODE=1
  step hf_demo 120 "$PY" -m dsa.integrations.transformers --demo --json "$OUT/demo.json"
  step hf_demo_fp8 90 "$PY" -m dsa.integrations.transformers --demo --cache-dtype fp8 --json "$OUT/demo_fp8.json"
  rm -f "$OUT/figures.jsonl"
  step hf_tests 330 env DSA_HF_REPORT="$OUT/figures.jsonl" "$PY" -m pytest -q -s -rs -p no:cacheprovider \
    python/tests/test_transformers_integration.py python/tests/test_hf_glue_torch.py python/tests/test_hf_pieces.py
  {
    echo "# steps"; cat "$OUT/steps.tsv"
    echo "# demo"; grep -v '^\$' "$OUT/hf_demo.log" | grep -v '^$'
    echo "# demo fp8"; grep -v '^\$' "$OUT/hf_demo_fp8.log" | grep -v '^$'
    echo "# tests"; tail -n 3 "$OUT/hf_tests.log"
    echo "# figures ($OUT/figures.jsonl)"; [ -f "$OUT/figures.jsonl" ] && cat "$OUT/figures.jsonl"
  } > "$OUT/summary.txt" 2>&1
  cat "$OUT/summary.txt"
fi
exit $FAILED
