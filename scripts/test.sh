#!/usr/bin/env bash
# Builds everything and runs every test: the lit suite (dialect, passes,
# examples, corrupted inputs), the unit tests and the transport tests.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
bash "$root/scripts/build.sh"
ctest --test-dir "$build" --output-on-failure --timeout 1200
