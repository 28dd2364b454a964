#!/usr/bin/env bash
# Builds the wheel (pyproject.toml) from the build directory scripts/build.sh
# made, so nothing is compiled twice, into ${BUILD_DIR:-build}/dist, and
# installs it into a fresh virtual environment, ${BUILD_DIR:-build}/venv,
# which sees the system's packages (numpy, torch) but not this checkout.
# Prints the environment's python; MOE_TEST_PYTHON=that makes the lit suite's
# Python tests run on the installed wheel.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
py=${PYTHON:-python3}
rm -rf "$build/dist" "$build/venv"
# No build isolation: scripts/setup.sh installed the pinned backend, and the
# wheel's own dependencies are the system's already.
"$py" -m pip wheel -q --no-build-isolation --no-deps \
  --config-settings=build-dir="$build" -w "$build/dist" "$root" >&2
"$py" -m venv --system-site-packages "$build/venv"
"$build/venv/bin/python" -m pip install -q --no-deps --no-index \
  "$build"/dist/moe_compiler-*.whl >&2
echo "$build/venv/bin/python"
