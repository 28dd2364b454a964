#!/usr/bin/env bash
# Checks that two compilers emit the same PTX for every layer this checkout
# compiles for sm_90a: that a refactor of the kernel builders leaves every
# kernel byte-identical. Each compiler runs scripts/emit-ptx.sh on the same
# inputs (every example, test config and flag set the sm_90a tests use; what
# fails to compile is compared too, through emit-ptx.sh's FAILED list), and
# the two output folders are compared with `diff -r`.
#
#   scripts/ptx-identical.sh BASE_COMMIT [HEAD_COMMIT]
#   scripts/ptx-identical.sh --binaries BASE_MOE_COMPILE HEAD_MOE_COMPILE
#
# With commits, each commit is checked out in a git worktree of its own
# under ${PTX_WORK:-/tmp/ptx-identical}/<commit> and moe-compile is built
# there (`BUILD_DIR=<worktree>/build scripts/build.sh moe-compile`, from
# that worktree); a worktree and its build are reused by later runs, so
# only what changed is rebuilt. Without HEAD_COMMIT the head is this
# working tree, uncommitted changes included: its moe-compile in
# ${BUILD_DIR:-build} is brought up to date the same way. With --binaries
# nothing is built: the two moe-compile binaries given are compared.
#
# Both sides run the head's scripts/emit-ptx.sh (this checkout's when the
# head commit has none), so both compile the same input files. The outputs
# stay in ${PTX_WORK:-/tmp/ptx-identical}/out/{base,head} for a closer look.
# Prints `PTX identical: N files` and exits 0, or lists the files that
# differ (or that only one side wrote) and exits 1.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
work=${PTX_WORK:-/tmp/ptx-identical}

usage() {
  sed -n '9,10s/^#  *//p' "$0" >&2
  exit 2
}

# worktree COMMIT: prints the folder of a worktree checked out at COMMIT,
# adding it the first time.
worktree() {
  local sha dir
  sha=$(git -C "$root" rev-parse --verify "$1^{commit}")
  dir=$work/${sha:0:12}
  if [ ! -e "$dir/.git" ]; then
    mkdir -p "$work"
    git -C "$root" worktree add --detach "$dir" "$sha" >&2
  elif [ "$(git -C "$dir" rev-parse HEAD)" != "$sha" ]; then
    git -C "$dir" checkout --detach "$sha" >&2
  fi
  echo "$dir"
}

# build SOURCE BUILD_DIR: builds moe-compile of checkout SOURCE in BUILD_DIR.
build() {
  echo "building moe-compile in $2" >&2
  (cd "$1" && BUILD_DIR=$2 bash scripts/build.sh moe-compile) >&2
}

emit=$root/scripts/emit-ptx.sh
if [ "${1:-}" = --binaries ]; then
  [ $# -eq 3 ] || usage
  base_bin=$2
  head_bin=$3
else
  [ $# -ge 1 ] && [ $# -le 2 ] && [ "${1#-}" = "$1" ] || usage
  base_src=$(worktree "$1")
  if [ $# -eq 2 ]; then
    head_src=$(worktree "$2")
    head_build=$head_src/build
    if [ -f "$head_src/scripts/emit-ptx.sh" ]; then
      emit=$head_src/scripts/emit-ptx.sh
    fi
  else
    head_src=$root
    head_build=${BUILD_DIR:-$root/build}
    case $head_build in /*) ;; *) head_build=$root/$head_build ;; esac
  fi
  build "$base_src" "$base_src/build"
  build "$head_src" "$head_build"
  base_bin=$base_src/build/bin/moe-compile
  head_bin=$head_build/bin/moe-compile
fi

for bin in "$base_bin" "$head_bin"; do
  if [ ! -x "$bin" ]; then
    echo "$0: no moe-compile at $bin" >&2
    exit 2
  fi
done

mkdir -p "$work/out"
for side in base head; do
  bin=${side}_bin
  echo "== $side: ${!bin}"
  # A layer that fails to compile is a result to compare, not a stop.
  bash "$emit" "${!bin}" "$work/out/$side" ||
    echo "(emit-ptx.sh exited $? for the $side: compared all the same)"
done

if diff -r "$work/out/base" "$work/out/head" >/dev/null; then
  echo "PTX identical: $(find "$work/out/head" -name '*.ptx' | wc -l) files"
  exit 0
fi
echo "PTX differs (diff -r $work/out/base $work/out/head):"
diff -rq "$work/out/base" "$work/out/head" || true
exit 1
