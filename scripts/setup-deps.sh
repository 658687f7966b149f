#!/usr/bin/env bash
# Installs what DSA needs to build, test and benchmark, from Debian/Ubuntu packages.
# Skips apt entirely when everything is already installed; works as root or through sudo.
#   cmake (>= 3.24), g++, make: the build;  libgtest-dev: the tests;  libbenchmark-dev: the
#   CPU benchmarks;  libopenblas-dev: the CPU decompression GEMM of dense_mha_prefill (optional).
#   The CUDA backend additionally needs the CUDA toolkit (not from apt here):
#   scripts/test.sh builds it when /usr/local/cuda/bin/nvcc exists.
set -euo pipefail

# The Python module builds for Debian's /usr/bin/python3 against Debian's pybind11 and numpy.
packages=(cmake g++ make libgtest-dev libbenchmark-dev libopenblas-dev pybind11-dev python3-dev python3-numpy python3-pytest python3-hypothesis)

if ! command -v dpkg-query >/dev/null 2>&1 || ! command -v apt-get >/dev/null 2>&1; then
  echo "setup-deps: no apt on this machine; install these yourself: ${packages[*]}" >&2
  exit 1
fi

missing=()
for p in "${packages[@]}"; do
  if ! dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed"; then
    missing+=("$p")
  fi
done

if ((${#missing[@]})); then
  sudo=()
  if [ "$(id -u)" -ne 0 ]; then
    command -v sudo >/dev/null 2>&1 || { echo "setup-deps: need root or sudo to install: ${missing[*]}" >&2; exit 1; }
    sudo=(sudo)
  fi
  echo "setup-deps: installing ${missing[*]}"
  export DEBIAN_FRONTEND=noninteractive
  "${sudo[@]}" apt-get update
  "${sudo[@]}" apt-get install -y --no-install-recommends "${missing[@]}"
else
  echo "setup-deps: ${packages[*]}: already installed"
fi

# CMakeLists.txt needs 3.24; say so plainly instead of failing inside cmake.
version=$(cmake --version | head -n1 | sed 's/[^0-9.]*\([0-9.]*\).*/\1/')
if [ "$(printf '%s\n3.24\n' "$version" | sort -V | head -n1)" != "3.24" ]; then
  echo "setup-deps: cmake $version is older than 3.24 (Debian 12 / Ubuntu 24.04 have a new enough one)" >&2
  exit 1
fi
