#!/usr/bin/env bash
# Builds everything and runs every test: the lit suite (dialect, passes,
# codegen, examples, tools, corrupted inputs), the unit tests, the runtime
# tests and the transport tests.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
bash "$root/scripts/build.sh"
# GPU tests first, verbosely: without a GPU they skip and this shows why.
ctest --test-dir "$build" --output-on-failure -L gpu -V |
  grep -E "Skipped|no usable GPU|device:|Passed|Failed|tests passed"
ctest --test-dir "$build" --output-on-failure --timeout 1200 -LE gpu
