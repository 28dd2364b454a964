#!/usr/bin/env bash
# The GPU layers, checked and timed on the GPU machine.
#
#   bench/device-check.sh prepare   on the build machine: compiles every
#                                   example layer for sm_90a (and the small
#                                   ones for the CPU too) into build/device/
#   bench/device-check.sh run       on the GPU machine (needs PyTorch): checks
#                                   each layer at 1, 128 and 4096 tokens (the
#                                   small ones at 0 too), replays the big ones
#                                   from a CUDA graph, times them beside the
#                                   PyTorch peer, runs moe-exec --device=cuda
#                                   and one layer under compute-sanitizer;
#                                   results go to $OUT (default
#                                   build/device/results)
#   bench/device-check.sh compare DIR  on the GPU machine: times the
#                                   full-size layers prepared in DIR (another
#                                   commit's build/device) and in build/device
#                                   alternately, twice, in one run
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${DEVICE_DIR:-$root/build/device}
mode=${1:-}
# python3 -m bench.NAME, and this checkout's Python package.
export PYTHONPATH="$root:$root/python${PYTHONPATH:+:$PYTHONPATH}"

if [[ $mode == prepare ]]; then
  bash "$root/scripts/build.sh" moe-compile moe-exec moert >&2
  compile="$root/build/bin/moe-compile"
  rm -rf "$dir" && mkdir -p "$dir"
  git -C "$root" rev-parse --short HEAD > "$dir/COMMIT" 2>/dev/null || echo unknown > "$dir/COMMIT"
  # Small layers of every model type, and the quantization schemes: the CPU
  # backend is their reference.
  # Each also as the fused layer (--fuse-layer=64), checked against the same
  # CPU library.
  small() {  # name config [moe-compile options]
    local name=$1 config=$2; shift 2
    "$compile" --from-hf-config "$config" --name "$name" "$@" --target=sm_90a -o "$dir/gpu_$name.so" &&
      "$compile" --from-hf-config "$config" --name "$name" "$@" -o "$dir/cpu_$name.so" &&
      "$compile" --from-hf-config "$config" --name "$name" "$@" --target=sm_90a --fuse-layer=64 \
        -o "$dir/gpu_${name}_fused.so" &&
      ln -sf "cpu_$name.so" "$dir/cpu_${name}_fused.so"
  }
  for c in "$root"/test/tools/Inputs/tiny/*.json; do
    small "$(basename "$c" .json)" "$c"
  done
  small deepseek_v3_small "$root/examples/configs/deepseek-v3-small.json"
  small qwen3_mxfp8 "$root/test/tools/Inputs/tiny/qwen3_moe.json" --quant=mxfp8
  small qwen3_mxfp8_ceil "$root/test/tools/Inputs/tiny/qwen3_moe.json" --quant=mxfp8-ceil
  small qwen3_fp8_block128 "$root/test/tools/Inputs/tiny/qwen3_moe.json" --quant=fp8-block128
  small llama4_mxfp8 "$root/test/tools/Inputs/tiny/llama4.json" --quant=mxfp8
  # Several K stages, a partial 128-block in K and in the intermediate.
  small h384_i320_fp8_block128 "$root/test/tools/Inputs/odd/h384_i320.json" --quant=fp8-block128
  small h384_i320_mxfp8 "$root/test/tools/Inputs/odd/h384_i320.json" --quant=mxfp8
  # An intermediate size TMA cannot read in FP8 (moe-legalize pads it).
  small odd_i40_fp8_block128 "$root/test/tools/Inputs/odd/i40.json" --quant=fp8-block128
  small odd_i40_mxfp8 "$root/test/tools/Inputs/odd/i40.json" --quant=mxfp8
  # Odd shapes: each either compiles (and must then run right, under
  # compute-sanitizer too) or is refused with a message, kept beside it.
  for c in "$root"/test/tools/Inputs/odd/*.json; do
    name=odd_$(basename "$c" .json)
    if ! small "$name" "$c" 2> "$dir/refused_$name.txt"; then
      rm -f "$dir/gpu_$name.so" "$dir/cpu_$name.so" "$dir/gpu_${name}_fused.so" "$dir/cpu_${name}_fused.so"
      echo "refused $name: $(grep -m1 error "$dir/refused_$name.txt")" >&2
    else
      rm "$dir/refused_$name.txt"
    fi
  done
  # A fixed token count (no dynamic dimension at all).
  "$compile" "$root/test/tools/Inputs/static-tokens.mlir" --target=sm_90a -o "$dir/fixed_static_tokens.so"
  "$compile" "$root/test/tools/Inputs/static-tokens.mlir" -o "$dir/cpu_static_tokens.so"
  # The full-size layers: PyTorch float32 is their reference.
  "$compile" --from-hf-config "$root/examples/configs/deepseek-v3-ep8-shard.json" \
    --name dsv3_ep8_shard --target=sm_90a -o "$dir/big_dsv3_ep8_shard.so"
  "$compile" "$root/examples/mixtral-8x7b.mlir" --target=sm_90a -o "$dir/big_mixtral_8x7b.so"
  "$compile" "$root/examples/qwen3-30b-a3b.mlir" --target=sm_90a -o "$dir/big_qwen3_30b_a3b.so"
  # Quantized full-size layers: the CPU backend is their reference at a few
  # tokens; FP8 weights as DeepSeek-V3 ships them, MXFP8 from moe-quantize.
  big_quant() {  # name config [moe-compile options]
    local name=$1 config=$2; shift 2
    "$compile" --from-hf-config "$config" --name "$name" "$@" --target=sm_90a -o "$dir/big_$name.so" &&
      "$compile" --from-hf-config "$config" --name "$name" "$@" -o "$dir/cpu_big_$name.so"
  }
  big_quant dsv3_ep8_shard_fp8 "$root/examples/configs/deepseek-v3-ep8-shard-fp8.json"
  big_quant qwen3_30b_a3b_mxfp8 "$root/examples/configs/qwen3-30b-a3b.json" --quant=mxfp8
  # The layers bench/hf_check.py compares with transformers' own MoE blocks.
  mkdir -p "$dir/hf"
  python3 - "$root/bench/hf_configs.json" "$dir/hf" <<'PY'
import json, sys
configs = json.load(open(sys.argv[1]))
for name, config in configs.items():
    json.dump(config, open(f"{sys.argv[2]}/{name}.json", "w"))
PY
  for c in "$dir"/hf/*.json; do
    name=$(basename "$c" .json)
    "$compile" --from-hf-config "$c" --name "$name" --target=sm_90a -o "$dir/hf/lib$name.so"
  done
  cp "$root/build/bin/moe-exec" "$dir/"
  # moe-exec's inputs for the same layers on both devices.
  python3 "$root/test/tools/check_layer.py" "$dir/gpu_deepseek_v3.so" --exec "$dir/moe-exec" \
    --reference /dev/null --tokens 200 --bound 0 --workdir "$dir/exec/deepseek_v3" --inputs-only
  python3 "$root/test/tools/check_layer.py" "$dir/fixed_static_tokens.so" --exec "$dir/moe-exec" \
    --reference /dev/null --tokens 3 --bound 0 --workdir "$dir/exec/static_tokens" --inputs-only
  echo "prepared $(ls "$dir"/*.so | wc -l) libraries in $dir" >&2
  exit 0
fi

if [[ $mode == compare ]]; then
  other=${2:?usage: $0 compare DIR}
  results=${OUT:-$dir/results}
  mkdir -p "$results"
  log="$results/compare.jsonl"
  : > "$log"
  nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/# /' | tee -a "$log"
  for round in 1 2; do
    for lib in "$dir"/big_*.so; do
      name=$(basename "$lib" .so); name=${name#big_}
      for side in "$other" "$dir"; do
        echo "{\"what\": \"side\", \"commit\": \"$(cat "$side/COMMIT")\", \"round\": $round}" | tee -a "$log"
        python3 -m bench.device_check "$side/big_$name.so" --tokens 1 128 4096 --time \
          --label "$name" | tee -a "$log"
      done
    done
  done
  exit 0
fi
if [[ $mode != run ]]; then
  echo "usage: $0 prepare|run|compare DIR" >&2
  exit 2
fi
results=${OUT:-$dir/results}
mkdir -p "$results"
log="$results/device-check.jsonl"
: > "$log"
status=0
check() { python3 -m bench.device_check "$@" | tee -a "$log" || status=1; }
nvidia-smi --query-gpu=name,driver_version --format=csv,noheader | sed 's/^/# /' | tee -a "$log"
echo "{\"what\": \"commit\", \"commit\": \"$(cat "$dir/COMMIT")\"}" | tee -a "$log"
for lib in "$dir"/gpu_*.so; do
  name=$(basename "$lib" .so); name=${name#gpu_}
  bound=1e-2
  # docs/numerics.md: a last-bit difference in a bf16 intermediate can move
  # its E4M3 code by a step (1/16), which is what quantized layers show.
  [[ $name == *fp8* || $name == *mxfp8* ]] && bound=2e-2
  # Bucket edges, counts inside buckets, and one above the largest bucket.
  check "$lib" --cpu "$dir/cpu_$name.so" --tokens 0 1 3 33 64 128 200 4096 5000 --bound "$bound" --label "$name"
done
check "$dir/fixed_static_tokens.so" --cpu "$dir/cpu_static_tokens.so" --tokens 3 --label static_tokens
for lib in "$dir"/big_*.so; do
  name=$(basename "$lib" .so); name=${name#big_}
  if [[ -f $dir/cpu_big_$name.so ]]; then
    check "$lib" --cpu "$dir/cpu_big_$name.so" --cpu-tokens 4 --bound 2e-2 \
      --tokens 1 4 128 4096 --time --graph --label "$name"
  else
    check "$lib" --tokens 1 128 4096 --time --graph --label "$name"
  fi
done
# moe-exec --device=cuda against the CPU library, on the same safetensors.
for name in deepseek_v3 static_tokens; do
  gpu_lib="$dir/gpu_$name.so"
  [[ -f $gpu_lib ]] || gpu_lib="$dir/fixed_$name.so"
  "$dir/moe-exec" "$gpu_lib" --device=cuda --inputs "$dir/exec/$name/in.safetensors" \
    --outputs "$results/exec-gpu-$name.safetensors" --repeat 3
  "$dir/moe-exec" "$dir/cpu_$name.so" --inputs "$dir/exec/$name/in.safetensors" \
    --outputs "$results/exec-cpu-$name.safetensors"
  python3 - "$results" "$name" <<'PY' | tee -a "$log" || status=1
import json, sys
from safetensors.torch import load_file
d, name = sys.argv[1], sys.argv[2]
gpu = load_file(f"{d}/exec-gpu-{name}.safetensors")["out"].double()
cpu = load_file(f"{d}/exec-cpu-{name}.safetensors")["out"].double()
err = ((gpu - cpu).norm() / cpu.norm()).item()
print(json.dumps({"what": "moe-exec", "layer": name, "tokens": gpu.shape[0],
                  "rel_error_vs_cpu": err, "ok": err <= 1e-2}))
sys.exit(0 if err <= 1e-2 else 1)
PY
done
# Our layers against transformers' MoE blocks, from checkpoints it saved.
python3 -m bench.hf_check "$dir/hf" 2>/dev/null | tee -a "$log"
grep -q '"ok": false' "$log" && status=1
# Bad calls fail with a message and leave the context usable.
python3 -m bench.call_checks "$dir/gpu_qwen3_moe.so" | tee -a "$log" || status=1
for refused in "$dir"/refused_*.txt; do
  [[ -f $refused ]] || continue
  name=$(basename "$refused" .txt); name=${name#refused_}
  python3 -c 'import json,sys; print(json.dumps({"what": "refused", "layer": sys.argv[1], "message": sys.argv[2]}))' \
    "$name" "$(grep -m1 error "$refused")" | tee -a "$log"
done
if command -v compute-sanitizer > /dev/null; then
  for name in deepseek_v3 $(cd "$dir" && ls gpu_odd_*.so 2>/dev/null | sed 's/^gpu_//; s/\.so$//'); do
    compute-sanitizer --tool memcheck --print-limit 20 python3 -m bench.device_check \
      "$dir/gpu_$name.so" --cpu "$dir/cpu_$name.so" --tokens 1 33 200 --label "sanitized_$name" \
      > "$results/memcheck_$name.txt" 2>&1 && echo "{\"what\": \"memcheck\", \"layer\": \"$name\", \"ok\": true}" | tee -a "$log" \
      || { echo "{\"what\": \"memcheck\", \"layer\": \"$name\", \"ok\": false}" | tee -a "$log"; status=1; }
    tail -3 "$results/memcheck_$name.txt"
  done
fi
exit $status
