#!/usr/bin/env bash
# The main job on a bundled example: parse and verify the DeepSeek-V3 MoE layer
# and print it decomposed into routing, dispatch, expert matmuls and combine.
# Usage: scripts/example.sh [EXAMPLE.mlir]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
bash "$root/scripts/build.sh" moe-opt >&2
"$build/bin/moe-opt" --moe-decompose "${1:-$root/examples/deepseek-v3.mlir}"
