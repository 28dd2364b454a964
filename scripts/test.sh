#!/usr/bin/env bash
# Builds everything and runs every test: the lit suite (dialect, passes,
# codegen, examples, tools, corrupted inputs), the unit tests, the runtime
# tests and the transport tests; the Python tests on the installed wheel.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
bash "$root/scripts/build.sh"
# The wheel from the same build, installed into a fresh environment: the
# Python tests run on it, outside this checkout.
MOE_TEST_PYTHON=$(bash "$root/scripts/wheel.sh")
export MOE_TEST_PYTHON
ls -l "$build"/dist/*.whl
# GPU tests first, verbosely: without a GPU they skip and this shows why.
ctest --test-dir "$build" --output-on-failure -L gpu -V |
  grep -E "Skipped|no usable GPU|device:|Passed|Failed|tests passed"
ctest --test-dir "$build" --output-on-failure --timeout 1200 -LE gpu
