#!/usr/bin/env bash
# Configures and builds DSA into ${BUILD_DIR:-build} (Release). Extra arguments go to cmake --build
# (e.g. --target dsa_cli). The CUDA backend is built when nvcc is at /usr/local/cuda/bin/nvcc
# (DSA_CUDA=auto, the default); DSA_CUDA=ON forces it, DSA_CUDA=OFF skips it.
set -euo pipefail
cd "$(dirname "$0")/.."

build_dir=${BUILD_DIR:-build}
jobs=${JOBS:-$(nproc)}
nvcc=/usr/local/cuda/bin/nvcc
cuda_args=(-DDSA_CUDA=OFF)
case "${DSA_CUDA:-auto}" in
  ON|on|1) cuda_args=(-DDSA_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc") ;;
  auto) if [ -x "$nvcc" ]; then cuda_args=(-DDSA_CUDA=ON -DCMAKE_CUDA_COMPILER="$nvcc"); fi ;;
esac

echo "build: ${build_dir} (${cuda_args[0]}), ${jobs} jobs"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "${cuda_args[@]}"
cmake --build "$build_dir" -j "$jobs" "$@"
