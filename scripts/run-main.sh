#!/usr/bin/env bash
# Fresh machine -> the main job: installs the dependencies (apt), builds the library and the
# `dsa` tool, runs `dsa run` (one DSA layer step, GLM-5 geometry, checked against a float64
# reference; prints PASS or FAIL). Arguments go to `dsa run` (see docs/cli.md).
set -euo pipefail
cd "$(dirname "$0")/.."

./scripts/setup-deps.sh
./scripts/build.sh --target dsa_cli
exec "${BUILD_DIR:-build}"/tools/dsa run "$@"
