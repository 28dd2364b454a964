#!/usr/bin/env bash
# Checks that every C++ file of the project is formatted as .clang-format
# (LLVM style) says, with Debian's clang-format (scripts/setup.sh installs
# it): prints each file that is not, with clang-format's complaint, and
# exits 1. `CLANG_FORMAT` picks another binary. Fix with
# `clang-format -i FILE`.
set -euo pipefail
root=$(cd "${1:-$(dirname "$0")/..}" && pwd)
format=${CLANG_FORMAT:-clang-format}
if ! command -v "$format" >/dev/null; then
  echo "check-format: no $format on PATH (scripts/setup.sh installs it)" >&2
  exit 2
fi
cd "$root"
# The lint tests' inputs are deliberately odd C++.
mapfile -t files < <(find bench codegen dialects lib passes runtime tools test \
  -path test/lint/Inputs -prune -o \( -name '*.cpp' -o -name '*.h' \) -print |
  sort)
bad=0
for f in "${files[@]}"; do
  if ! out=$("$format" --dry-run --Werror "$f" 2>&1); then
    echo "$f: not formatted"
    echo "$out" | head -5
    bad=1
  fi
done
[ "$bad" = 0 ] && echo "formatted: ${#files[@]} files"
exit "$bad"
