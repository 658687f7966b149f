#!/usr/bin/env bash
# Configures and builds DSA into ${BUILD_DIR:-build} (Release). Extra arguments go to cmake --build
# (e.g. --target dsa_cli). The CUDA backend is built when nvcc is at /usr/local/cuda/bin/nvcc
# (DSA_CUDA=auto, the default); DSA_CUDA=ON forces it, DSA_CUDA=OFF skips it. The Python module
# (python/) is built for /usr/bin/python3 when it exists (DSA_PYTHON=auto|ON|OFF likewise).
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

python_args=(-DDSA_BUILD_PYTHON=OFF)
case "${DSA_PYTHON:-auto}" in
  ON|on|1) python_args=(-DDSA_BUILD_PYTHON=ON) ;;
  auto) if [ -x /usr/bin/python3 ]; then python_args=(-DDSA_BUILD_PYTHON=ON); fi ;;
esac

echo "build: ${build_dir} (${cuda_args[0]} ${python_args[0]}), ${jobs} jobs"
cmake -S . -B "$build_dir" -DCMAKE_BUILD_TYPE=Release "${cuda_args[@]}" "${python_args[@]}"
cmake --build "$build_dir" -j "$jobs" "$@"
