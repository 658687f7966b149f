#!/usr/bin/env bash
# Fresh machine -> tests passed. Installs the dependencies (apt), builds everything (the CUDA
# backend too when nvcc is present, so CI at least compiles it), runs CTest (CPU tests, the
# consumer package check, the CLI; GPU tests skip without a device) and the main job.
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup-deps.sh
./scripts/build.sh
build_dir=${BUILD_DIR:-build}
ctest --test-dir "$build_dir" --output-on-failure -j "${JOBS:-$(nproc)}"
"$build_dir"/tools/dsa info
"$build_dir"/tools/dsa run
