#!/usr/bin/env bash
# transformers models patched with moe_compiler.patch, on the GPU machine.
#
#   bench/hf-models.sh prepare   on the build machine (needs torch and
#                                transformers): compiles every layer
#                                bench.hf_models uses into build/hf-models
#   bench/hf-models.sh run       on the GPU machine: bench.hf_models run
#                                (tiny models of every type, generate modes,
#                                real-size decode beside HF's experts), then
#                                expert parallelism from torchrun: two ranks
#                                on one GPU under MPS, bit for bit one rank;
#                                four ranks, one killed, the others name it.
#                                Lines to $OUT/hf-models.log
# Carry build/bin, build/lib and build/hf-models to the GPU machine: the
# compile cache is keyed by the compiler and runtime that built it.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=$root/build/hf-models
export PYTHONPATH="$root:$root/python${PYTHONPATH:+:$PYTHONPATH}"
export MOE_COMPILE=$root/build/bin/moe-compile
case ${1:-} in
prepare)
  bash "$root/scripts/build.sh" moe-compile moert >&2
  mkdir -p "$dir"
  git -C "$root" rev-parse --short HEAD > "$dir/COMMIT"
  python3 -m bench.hf_models prepare "$dir/cache"
  ;;
run)
  shift
  out=${OUT:-$dir/results}
  mkdir -p "$out"
  log=$out/hf-models.log
  echo "# commit $(cat "$dir/COMMIT")" | tee "$log"
  python3 -m bench.hf_models run "$dir/cache" "$@" 2>&1 | grep -v '^moe_compiler:' | tee -a "$log"
  if [[ " $* " == *" ep "* || $# -eq 0 ]]; then
    nvidia-cuda-mps-control -d || true
    python3 -m torch.distributed.run --standalone --nproc-per-node 2 \
      "$root/test/tools/check_patch.py" ep qwen3_moe --target sm_90a --cache "$dir/cache" \
      --port 29631 2>&1 | grep -E 'bit-identical|DIFFERENT|finalize|Error' | tee -a "$log"
    python3 -m torch.distributed.run --standalone --nproc-per-node 4 \
      "$root/test/tools/check_patch.py" ep-killed mixtral --target sm_90a --cache "$dir/cache" \
      2>&1 | grep -E 'raised|NOT|Error' | tee -a "$log"
    echo quit | nvidia-cuda-mps-control || true
  fi
  ;;
*)
  echo "usage: $0 prepare|run [tiny generate real ep]" >&2
  exit 2
  ;;
esac
