#!/usr/bin/env bash
# The decode latency curve of the full-size layers, the fused layer beside
# the chain of kernels it replaces, in one run.
#
#   bench/latency.sh prepare   on the build machine: compiles each layer for
#                              sm_90a twice into build/latency/, with
#                              --fuse-layer=64 (fused_*) and with
#                              --fuse-layer=0 (chain_*)
#   bench/latency.sh run [TOKENS...]
#                              on the GPU machine (needs PyTorch): times both
#                              builds of each layer alternately with
#                              bench.latency (the PyTorch peer beside them);
#                              JSON lines to $OUT/latency.jsonl
#                              (default build/latency/results)
# LAYERS (names below, space separated) picks a subset.
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${LATENCY_DIR:-$root/build/latency}
mode=${1:-}
export PYTHONPATH="$root:$root/python${PYTHONPATH:+:$PYTHONPATH}"
configs="$root/examples/configs"
# name: moe-compile's input and options.
declare -A layers=(
  [qwen3_bf16]="$root/examples/qwen3-30b-a3b.mlir"
  [qwen3_fp8b128]="--from-hf-config $configs/qwen3-30b-a3b.json --quant=fp8-block128"
  [qwen3_mxfp8]="--from-hf-config $configs/qwen3-30b-a3b.json --quant=mxfp8"
  [mixtral_bf16]="$root/examples/mixtral-8x7b.mlir"
  [dsv3_shard_fp8]="--from-hf-config $configs/deepseek-v3-ep8-shard-fp8.json"
  [dsv3_shard_bf16]="--from-hf-config $configs/deepseek-v3-ep8-shard.json"
)
names=${LAYERS:-${!layers[*]}}

if [[ $mode == prepare ]]; then
  bash "$root/scripts/build.sh" moe-compile moert >&2
  mkdir -p "$dir"
  git -C "$root" rev-parse --short HEAD > "$dir/COMMIT" 2>/dev/null || echo unknown > "$dir/COMMIT"
  for name in $names; do
    # shellcheck disable=SC2086
    "$root/build/bin/moe-compile" ${layers[$name]} --name "$name" --target=sm_90a --fuse-layer=64 \
      -o "$dir/fused_$name.so"
    # shellcheck disable=SC2086
    "$root/build/bin/moe-compile" ${layers[$name]} --name "$name" --target=sm_90a --fuse-layer=0 \
      -o "$dir/chain_$name.so"
  done
  exit 0
fi
if [[ $mode != run ]]; then
  echo "usage: $0 prepare|run [TOKENS...]" >&2
  exit 2
fi
shift
tokens=${*:-1 2 4 8 16 32 64 128}
results=${OUT:-$dir/results}
mkdir -p "$results"
log="$results/latency.jsonl"
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/# /' | tee -a "$log"
echo "{\"what\": \"commit\", \"commit\": \"$(cat "$dir/COMMIT")\"}" | tee -a "$log"
for name in $names; do
  for side in chain fused; do
    [[ -f $dir/${side}_$name.so ]] || continue
    peer=()
    [[ $side == chain ]] && peer=(--peer)
    # shellcheck disable=SC2086
    python3 -m bench.latency "$dir/${side}_$name.so" --tokens $tokens --hbm 3.35 \
      --label "$side" "${peer[@]}" | tee -a "$log"
  done
done
