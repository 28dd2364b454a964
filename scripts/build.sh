#!/usr/bin/env bash
# Configures and builds moe-compiler (Ninja, lld, Debian's LLVM/MLIR 22) into
# ${BUILD_DIR:-build}. Extra arguments name targets; none builds everything.
# MOE_WERROR=ON (as CI sets it) makes every warning an error.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
build=${BUILD_DIR:-$root/build}
bash "$root/scripts/setup.sh"
if [ ! -f "$build/build.ninja" ]; then
  cmake -S "$root" -B "$build" -G Ninja -DCMAKE_BUILD_TYPE=Release \
    -DLLVM_ENABLE_WERROR="${MOE_WERROR:-OFF}"
fi
cmake --build "$build" -j "$(nproc)" ${1:+--target "$@"}
