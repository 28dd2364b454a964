#!/usr/bin/env bash
# The main job on bundled examples:
#  1. parse and verify the DeepSeek-V3 MoE layer and print it decomposed into
#     routing, dispatch, expert matmuls and combine;
#  2. compile a scaled-down DeepSeek-V3 config.json into a CPU library, run it
#     with moe-exec on random inputs and compare it with the float64
#     reference;
#  3. compile it again expert parallel over 4 ranks and run it as 4
#     processes exchanging tokens over libfabric: bit for bit the same output.
# Usage: scripts/example.sh [EXAMPLE.mlir [CONFIG.json]]
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
# The check scripts import this checkout's Python package.
export PYTHONPATH="$root/python${PYTHONPATH:+:$PYTHONPATH}"
bash "$root/scripts/build.sh" moe-opt moe-compile moe-exec moe-reference moe_ep moe_transport >&2
"$build/bin/moe-opt" --moe-decompose "${1:-$root/examples/deepseek-v3.mlir}"

config=${2:-$root/examples/configs/deepseek-v3-small.json}
work="$build/example"
mkdir -p "$work"
"$build/bin/moe-compile" --from-hf-config "$config" -o "$work/liblayer.so"
echo "compiled $config into $work/liblayer.so ($work/liblayer.h)"
python3 "$root/test/tools/check_layer.py" "$work/liblayer.so" \
  --exec "$build/bin/moe-exec" --reference "$build/bin/moe-reference" \
  --tokens 64 --bound 0.01 --workdir "$work"
rm -rf "$work/ep"
python3 "$root/test/tools/check_ep.py" "$config" --compile "$build/bin/moe-compile" \
  --exec "$build/bin/moe-exec" --ranks 4 --tokens 64 --workdir "$work/ep"
