#!/usr/bin/env bash
# GPU check: build with the CUDA backend, run the CPU and GPU tests, compute-sanitizer
# (memcheck, racecheck, initcheck) on a subset, the short benchmarks, and write logs plus a summary.
#
#   OUT=/some/dir scripts/gpu-check.sh        (from the repo root; OUT defaults to ./gpu-check-out)
#
# Every step runs under a time limit carved from one overall budget (DSA_CHECK_BUDGET_S,
# default 530 s, so the whole run stays under 9 minutes); a failing step is recorded and the
# next one still runs. The exit status is 0 only if every step passed.
# Optional: with .anchors/ in the repo root (a copy of /work/shared/anchors/*, see docs/gpu-check.md)
# it also times the public anchors (DSA_ANCHOR_SETS, default "dg fm torch layer"; "none" skips),
# runs dsa bench at the full shapes (DSA_BENCH_ARGS still overrides), joins both into
# $OUT/joined.md, draws $OUT/layer_prefill.png and prints the joined table at the end.
# DSA_CHECK_SKIP="memcheck racecheck py_tests ..." skips the named steps (device time).
# Needs: CMake >= 3.24, a CUDA toolkit (nvcc), a C++17 compiler; GoogleTest from the system or
# from sources in .deps/googletest. Sanitizer subsets: scripts/sanitizer-memcheck.txt,
# scripts/sanitizer-racecheck.txt and scripts/sanitizer-initcheck.txt (one gtest filter
# pattern per line).
set -u
cd "$(dirname "$0")/.." || exit 2
ROOT=$(pwd)
OUT=${OUT:-$ROOT/gpu-check-out}
mkdir -p "$OUT"
BUILD=${DSA_CHECK_BUILD_DIR:-$ROOT/build}
BUDGET=${DSA_CHECK_BUDGET_S:-530}
START=$(date +%s)
SUMMARY=$OUT/summary.txt
: > "$OUT/steps.tsv"
JOBS=$(nproc 2>/dev/null || echo 16)
[ "$JOBS" -gt 16 ] && JOBS=16

left() { echo $(( BUDGET - ($(date +%s) - START) )); }

SKIP_STEPS=" ${DSA_CHECK_SKIP:-} "
ANCHORS=0
if [ -f .anchors/run.sh ] && [ "${DSA_ANCHOR_SETS:-}" != none ]; then ANCHORS=1; fi

# step NAME CAP_SECONDS COMMAND... : runs COMMAND with output to $OUT/NAME.log, under
# min(CAP, time left); records PASS/FAIL/TIMEOUT/SKIP with seconds and a note.
step() {
  local name=$1 cap=$2; shift 2
  local log=$OUT/$name.log remaining limit t0 rc status note=""
  case "$SKIP_STEPS" in *" $name "*)
    printf '%s\tSKIP\t0\tDSA_CHECK_SKIP\n' "$name" >> "$OUT/steps.tsv"
    echo "== $name: SKIP (DSA_CHECK_SKIP)"
    return 0 ;;
  esac
  remaining=$(left)
  limit=$(( cap < remaining - 5 ? cap : remaining - 5 ))
  if [ "$limit" -le 5 ]; then
    printf '%s\tSKIP\t0\tout of time budget\n' "$name" >> "$OUT/steps.tsv"
    echo "== $name: SKIP (out of time budget)"
    return 0
  fi
  echo "== $name (limit ${limit}s): $*"
  t0=$(date +%s)
  { echo "\$ $*"; echo; } > "$log"
  timeout --signal=TERM --kill-after=10 "$limit" "$@" >> "$log" 2>&1
  rc=$?
  if [ $rc -eq 0 ]; then status=PASS
  elif [ $rc -eq 124 ] || [ $rc -eq 137 ]; then status=TIMEOUT; note="killed after ${limit}s"
  else status=FAIL; note="exit $rc"
  fi
  # gtest totals where the log has them.
  local passed failed skipped
  passed=$(grep -Eo '^\[  PASSED  \] [0-9]+' "$log" | tail -1 | grep -Eo '[0-9]+$')
  failed=$(grep -Eo '^\[  FAILED  \] [0-9]+ tests?' "$log" | tail -1 | grep -Eo '^\[  FAILED  \] [0-9]+' | grep -Eo '[0-9]+$')
  skipped=$(grep -Eo '^\[  SKIPPED \] [0-9]+' "$log" | tail -1 | grep -Eo '[0-9]+$')
  if [ -n "$passed$failed$skipped" ]; then
    note="${note:+$note; }passed ${passed:-0}, failed ${failed:-0}, skipped ${skipped:-0}"
  fi
  # Sanitizer verdicts.
  if grep -q "ERROR SUMMARY:" "$log"; then
    note="${note:+$note; }$(grep -Eo 'ERROR SUMMARY: [0-9]+ errors?' "$log" | tail -1)"
    if grep -Eq 'ERROR SUMMARY: [1-9]' "$log" && [ "$status" = PASS ]; then status=FAIL; fi
  fi
  printf '%s\t%s\t%s\t%s\n' "$name" "$status" "$(( $(date +%s) - t0 ))" "$note" >> "$OUT/steps.tsv"
  echo "   -> $status ($(( $(date +%s) - t0 ))s) $note"
  if [ "$status" != PASS ]; then tail -n 25 "$log" | sed 's/^/   | /'; fi
  return 0
}

skip() {  # skip NAME REASON
  printf '%s\tSKIP\t0\t%s\n' "$1" "$2" >> "$OUT/steps.tsv"
  echo "== $1: SKIP ($2)"
}

# gtest filter from a pattern file (comments and blank lines ignored), joined by ':'.
filter_from() {
  [ -f "$1" ] && grep -Ev '^\s*(#|$)' "$1" | tr -d ' ' | paste -sd: -
}

# ---- environment ------------------------------------------------------------------------
{
  echo "date: $(date -u '+%Y-%m-%d %H:%M:%S UTC')"
  echo "host: $(hostname)"
  echo "commit: $(git rev-parse --short HEAD 2>/dev/null || echo unknown) $(git status --porcelain 2>/dev/null | grep -q . && echo '(dirty)')"
  command -v nvidia-smi > /dev/null && nvidia-smi --query-gpu=name,driver_version,memory.total,clocks.max.sm --format=csv
  command -v nvcc > /dev/null && nvcc --version | tail -2
  [ -x /usr/local/cuda/bin/nvcc ] && /usr/local/cuda/bin/nvcc --version | tail -2
  cmake --version | head -1
  python3 -c 'import torch; print("torch", torch.__version__, "cuda", torch.version.cuda)' 2>/dev/null
} > "$OUT/environment.txt" 2>&1
cat "$OUT/environment.txt"

# ---- configure and build ----------------------------------------------------------------
GEN=()
command -v ninja > /dev/null && GEN=(-G Ninja)
if [ -f "$BUILD/CMakeCache.txt" ] && ! grep -q "CMAKE_GENERATOR:INTERNAL=${GEN[1]:-Unix Makefiles}" "$BUILD/CMakeCache.txt"; then
  GEN=()  # keep the generator of an existing build dir
fi
if [ ! -f .deps/googletest/CMakeLists.txt ]; then
  echo "note: .deps/googletest not found; relying on a system GoogleTest" | tee -a "$OUT/environment.txt"
fi
step configure 120 cmake -S "$ROOT" -B "$BUILD" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DDSA_CUDA=ON \
  -DDSA_BUILD_BENCH=OFF -DDSA_BUILD_TESTS=ON -DDSA_BUILD_TOOLS=ON
KEEP_GOING=(-k)  # build every target that can be built, so one broken target hides nothing else
grep -q "CMAKE_GENERATOR:INTERNAL=Ninja" "$BUILD/CMakeCache.txt" 2>/dev/null && KEEP_GOING=(-k 0)
step build 300 cmake --build "$BUILD" -j "$JOBS" -- "${KEEP_GOING[@]}"

CPU_TESTS=$BUILD/tests/dsa_tests
GPU_TESTS=$BUILD/tests/dsa_gpu_tests

# ---- tests ------------------------------------------------------------------------------
# GPU first: they are what this machine is for; the CPU suite also runs in CI.
if [ -x "$GPU_TESTS" ]; then
  # One process per test under CTest, so a hung kernel costs its own timeout, not the suite.
  step gpu_tests "${DSA_GPU_TESTS_CAP:-240}" ctest --test-dir "$BUILD" -L gpu -j "${DSA_GPU_TEST_JOBS:-4}" \
    --timeout "${DSA_GPU_TEST_TIMEOUT:-120}" --output-on-failure --output-junit "$OUT/gpu_tests.xml"
else
  skip gpu_tests "dsa_gpu_tests not built"
fi
KERNEL_TESTS=$BUILD/tests/dsa_gpu_kernel_tests
if [ -x "$KERNEL_TESTS" ]; then
  step kernel_tests 60 "$KERNEL_TESTS" --gtest_output="xml:$OUT/kernel_tests.xml"
else
  skip kernel_tests "dsa_gpu_kernel_tests not built"
fi
# Several GPUs (NCCL): skips below 2 GPUs. NVLink multicast always off.
MULTI_TESTS=$BUILD/tests/dsa_multigpu_tests
if [ -x "$MULTI_TESTS" ]; then
  step multigpu_tests 120 env NCCL_NVLS_ENABLE=0 "$MULTI_TESTS" --gtest_output="xml:$OUT/multigpu_tests.xml"
else
  skip multigpu_tests "dsa_multigpu_tests not built (no NCCL)"
fi
if [ -x "$CPU_TESTS" ]; then
  step cpu_tests 120 "$CPU_TESTS" --gtest_output="xml:$OUT/cpu_tests.xml"
else
  skip cpu_tests "dsa_tests not built"
fi

# ---- compute-sanitizer ------------------------------------------------------------------
SAN=$(command -v compute-sanitizer || true)
for c in /usr/local/cuda/bin/compute-sanitizer /usr/local/cuda/compute-sanitizer/compute-sanitizer; do
  [ -z "$SAN" ] && [ -x "$c" ] && SAN=$c
done
MEMCHECK_FILTER=$(filter_from scripts/sanitizer-memcheck.txt)
RACECHECK_FILTER=$(filter_from scripts/sanitizer-racecheck.txt)
INITCHECK_FILTER=$(filter_from scripts/sanitizer-initcheck.txt)
if [ -z "$SAN" ]; then
  skip memcheck "compute-sanitizer not found"
  skip racecheck "compute-sanitizer not found"
  skip initcheck "compute-sanitizer not found"
elif [ ! -x "$GPU_TESTS" ]; then
  skip memcheck "dsa_gpu_tests not built"
  skip racecheck "dsa_gpu_tests not built"
  skip initcheck "dsa_gpu_tests not built"
else
  step memcheck 110 "$SAN" --tool memcheck --error-exitcode 86 --leak-check no \
    "$GPU_TESTS" --gtest_filter="${MEMCHECK_FILTER:-Gpu*}"
  step racecheck 80 "$SAN" --tool racecheck --racecheck-report hazard --error-exitcode 86 \
    "$GPU_TESTS" --gtest_filter="${RACECHECK_FILTER:-Gpu*}"
  # initcheck: device memory read before anything wrote it (uninitialised workspace/scratch).
  step initcheck 80 "$SAN" --tool initcheck --error-exitcode 86 \
    "$GPU_TESTS" --gtest_filter="${INITCHECK_FILTER:-Gpu*}"
fi

# ---- the Python module with the machine's torch (CUDA tensors, streams, compile, graphs) --
if command -v python3 > /dev/null && python3 -c 'import torch, pytest, numpy' 2> /dev/null; then
  step py_configure 60 cmake -S "$ROOT" -B "$BUILD-py" "${GEN[@]}" -DCMAKE_BUILD_TYPE=Release -DDSA_CUDA=ON \
    -DDSA_BUILD_PYTHON=ON -DDSA_BUILD_TESTS=OFF -DDSA_BUILD_TOOLS=OFF -DDSA_BUILD_BENCH=OFF \
    -DPython_EXECUTABLE="$(command -v python3)"
  step py_build 150 cmake --build "$BUILD-py" -j "$JOBS" --target _dsa
  step py_tests 150 env PYTHONPATH="$BUILD-py/python" python3 -m pytest -q -p no:cacheprovider -rs python/tests
else
  skip py_tests "python3 with torch, pytest and numpy not found"
fi

# ---- the main job on the GPU --------------------------------------------------------------
if [ -x "$BUILD/tools/dsa" ]; then
  step dsa_run 120 "$BUILD/tools/dsa" run --backend cuda
  step dsa_run_fp8 120 "$BUILD/tools/dsa" run --backend cuda --mla-cache fp8 --hadamard
else
  skip dsa_run "tools/dsa not built"
fi

# ---- short benchmarks -------------------------------------------------------------------
if [ -x "$BUILD/tools/dsa" ]; then
  # With the anchors: the full shapes (what they time), unless DSA_BENCH_ARGS says otherwise.
  BENCH_DEFAULT=--quick BENCH_CAP=150
  [ "$ANCHORS" = 1 ] && BENCH_DEFAULT=" " && BENCH_CAP=240
  # shellcheck disable=SC2086
  step dsa_bench "$BENCH_CAP" "$BUILD/tools/dsa" bench ${DSA_BENCH_ARGS:-$BENCH_DEFAULT} --json "$OUT/dsa_bench.json"
else
  skip dsa_bench "tools/dsa not built"
fi
# The same shapes through the mma.sync / first-generation kernels (what v0.1.0 ran), for the
# before/after columns of docs/perf.md: DSA_BENCH_BASELINE="--op layer_prefill,..." (off by default).
if [ -n "${DSA_BENCH_BASELINE:-}" ] && [ -x "$BUILD/tools/dsa" ]; then
  # shellcheck disable=SC2086
  step dsa_bench_baseline 200 env DSA_FORCE_KERNEL=mma_sync DSA_CUDA_LOGITS=mma DSA_CUDA_TOPK=legacy \
    DSA_MHA_KERNEL=portable "$BUILD/tools/dsa" bench $DSA_BENCH_BASELINE --json "$OUT/dsa_bench_baseline.json"
fi
if [ -f "$OUT/dsa_bench.json" ]; then
  python3 bench/perf_table.py "$OUT/dsa_bench.json" > "$OUT/perf_table.md" 2>/dev/null || true
fi
if [ -f bench/torch_baseline.py ]; then
  # shellcheck disable=SC2086
  step torch_baseline 200 env PYTHONPATH="$BUILD-py/python:${PYTHONPATH:-}" python3 bench/torch_baseline.py ${DSA_TORCH_ARGS:---quick} --json "$OUT/torch_baseline.json"
else
  skip torch_baseline "bench/torch_baseline.py not present"
fi
if [ -f "$OUT/dsa_bench.json" ] && [ -f "$OUT/torch_baseline.json" ]; then
  step compare 20 python3 bench/compare.py "$OUT/dsa_bench.json" "$OUT/torch_baseline.json"
  python3 bench/compare.py --markdown "$OUT/dsa_bench.json" "$OUT/torch_baseline.json" > "$OUT/compare.md" 2>/dev/null
fi

# ---- the public anchors beside DSA (optional: .anchors/, never part of the project) ------
if [ "$ANCHORS" = 1 ]; then
  # shellcheck disable=SC2086
  step anchors 330 env OUT="$OUT" bash .anchors/run.sh ${DSA_ANCHOR_SETS:-dg fm torch layer}
  if [ -f "$OUT/dsa_bench.json" ] && [ -f "$OUT/anchors.json" ]; then
    step join 30 bash -c "python3 .anchors/join.py '$OUT/dsa_bench.json' '$OUT/anchors.json' > '$OUT/joined.md'"
  else
    skip join "dsa_bench.json or anchors.json missing"
  fi
else
  skip anchors ".anchors/ not present (or DSA_ANCHOR_SETS=none)"
fi
if [ -f "$OUT/dsa_bench.json" ] && grep -q '"op": "layer_prefill"' "$OUT/dsa_bench.json" && python3 -c 'import matplotlib' 2> /dev/null; then
  ANCHOR_ARG=()
  [ -f "$OUT/anchors.json" ] && ANCHOR_ARG=(--anchors "$OUT/anchors.json")
  step plot 60 python3 bench/plot.py prefill "$OUT/dsa_bench.json" "${ANCHOR_ARG[@]}" --out "$OUT/layer_prefill.png"
fi

# ---- summary ----------------------------------------------------------------------------
TOTAL=$(( $(date +%s) - START ))
FAILS=$(awk -F'\t' '$2 == "FAIL" || $2 == "TIMEOUT"' "$OUT/steps.tsv" | wc -l)
{
  echo "DSA gpu-check  $(date -u '+%Y-%m-%d %H:%M UTC')  total ${TOTAL}s"
  sed -n '/^name,/{n;p}' "$OUT/environment.txt"
  echo
  printf '%-15s %-8s %6s  %s\n' step status sec note
  printf '%-15s %-8s %6s  %s\n' ---- ------ --- ----
  awk -F'\t' '{ printf "%-15s %-8s %6s  %s\n", $1, $2, $3, $4 }' "$OUT/steps.tsv"
  echo
  if [ -f "$OUT/gpu_tests.log" ]; then
    echo "failed GPU tests:"
    { grep -E '^\[  FAILED  \] [A-Za-z]' "$OUT/gpu_tests.log"; grep -E '^\s+[0-9]+ - .*\((Failed|Timeout|SEGFAULT|Subprocess aborted|Exception)' "$OUT/gpu_tests.log"; } | sort -u | sed 's/^/  /' || true
  fi
  echo "logs: $OUT"
  [ "$FAILS" -eq 0 ] && echo "RESULT: PASS" || echo "RESULT: FAIL ($FAILS step(s))"
} > "$SUMMARY"
echo
cat "$SUMMARY"
[ -f "$OUT/compare.log" ] && tail -n +3 "$OUT/compare.log"
if [ -f "$OUT/dsa_bench.log" ] && grep -q '^layer_' "$OUT/dsa_bench.log"; then
  echo; echo "layer benchmarks (dsa bench):"
  awk '/^layer_/{p=1} /^[a-z_]+ / && !/^layer_/{p=0} p' "$OUT/dsa_bench.log"
fi
if [ -f "$OUT/joined.md" ]; then echo; echo "DSA vs the anchors ($OUT/joined.md):"; cat "$OUT/joined.md"; fi
# The device tool returns at most 8 files: pack the logs, keep the summary and results loose.
( cd "$OUT" && tar czf logs.tgz --exclude=logs.tgz --exclude=summary.txt --exclude='*.json' --exclude=compare.md \
      --exclude=joined.md --exclude='*.png' ./* \
    && find . -maxdepth 1 -type f ! -name logs.tgz ! -name summary.txt ! -name '*.json' ! -name compare.md \
      ! -name joined.md ! -name '*.png' -delete )
[ "$FAILS" -eq 0 ]
