#!/usr/bin/env bash
# Expert-parallel GPU layers on the two-GPU machine.
#
#   bench/ep-check.sh prepare   on the build machine: compiles small layers of
#                               several model types and DeepSeek-V3's layer
#                               (bf16, 256 experts) for sm_90a with ep_size 1
#                               and 2, with their inputs, into build/ep/
#   bench/ep-check.sh run       on the GPU machine (needs PyTorch): each small
#                               layer through moe-exec --ep-ranks 2 against
#                               ep_size 1 (bit for bit), a rank killed before
#                               its forward, then bench/ep_bench.py on
#                               DeepSeek-V3 at 1, 128 and 4096 tokens per rank
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
dir=${EP_DIR:-$root/build/ep}
mode=${1:-}
# python3 -m bench.NAME, and the test helpers (which make the inputs) on
# this checkout's Python package.
export PYTHONPATH="$root:$root/python:$root/test/tools${PYTHONPATH:+:$PYTHONPATH}"

if [[ $mode == prepare ]]; then
  bash "$root/scripts/build.sh" moe-compile moe-exec moert moe_ep moe_transport >&2
  compile="$root/build/bin/moe-compile"
  rm -rf "$dir" && mkdir -p "$dir/lib"
  git -C "$root" rev-parse --short HEAD > "$dir/COMMIT" 2>/dev/null || echo unknown > "$dir/COMMIT"
  cp "$root/build/bin/moe-exec" "$dir/"
  # libfabric and what it needs, for a machine that lacks them.
  for l in $(ldd "$dir/moe-exec" | awk '/=>/ {print $3}' | grep -v -E 'libc\.so|libm\.so|libstdc|libgcc|ld-linux'); do
    cp -L "$l" "$dir/lib/"
  done
  small() {  # name config [moe-compile options]
    local m=$1 c=$2; shift 2
    "$compile" --from-hf-config "$c" --name layer --target=sm_90a --token-buckets=none "$@" -o "$dir/${m}_ep1.so"
    "$compile" --from-hf-config "$c" --name layer --target=sm_90a --ep-size 2 --ep-max-tokens 64 "$@" -o "$dir/${m}_ep2.so"
    python3 - "$dir/${m}_ep1.so" "$dir/in_$m.safetensors" <<'PY'
import sys
from check_ep import layer_info, make_inputs
from check_layer import write_inputs
write_inputs(sys.argv[2], make_inputs(layer_info(sys.argv[1]), 77, 3, None, 2))
PY
  }
  for m in mixtral qwen2_moe qwen3_moe deepseek_v3 gpt_oss deepseek_v3_fp8; do
    small $m "$root/test/tools/Inputs/tiny/$m.json"
  done
  # Odd shapes: H 200 (not a multiple of 16), I 72 and 40,
  # H 384 with I 320 in FP8 (partial 128-blocks).
  for m in h200_i72_e10 i40 h384_i320; do
    small odd_$m "$root/test/tools/Inputs/odd/$m.json"
  done
  small odd_h384_i320_fp8 "$root/test/tools/Inputs/odd/h384_i320.json" --quant=fp8-block128
  small qwen3_mxfp8 "$root/test/tools/Inputs/tiny/qwen3_moe.json" --quant=mxfp8
  # MXFP8's decode tile (FP8 tensor cores, a scale block's partials scaled)
  # rounds otherwise than its wide tile (codes widened to bf16), which the
  # one-rank reference takes with no buckets: the pair compared bit for bit
  # takes the plan for any count on both sides (the decode tile is checked
  # against the CPU backend by device_check).
  "$compile" --from-hf-config "$root/test/tools/Inputs/tiny/qwen3_moe.json" --name layer --target=sm_90a \
    --ep-size 2 --ep-max-tokens 64 --token-buckets=none --quant=mxfp8 -o "$dir/qwen3_mxfp8_ep2.so"
  # Router logits stored by both route forms (a 1-token call takes the
  # split form, 77 tokens the one-block form), on the odd shapes.
  for m in h200_i72_e10 i40 h384_i320; do
    "$compile" --from-hf-config "$root/test/tools/Inputs/odd/$m.json" --name layer --target=sm_90a \
      --router-logits -o "$dir/logits_odd_$m.so"
    python3 - "$dir/logits_odd_$m.so" "$dir/in1_odd_$m.safetensors" <<'PY'
import sys
from check_ep import layer_info, make_inputs
from check_layer import write_inputs
write_inputs(sys.argv[2], make_inputs(layer_info(sys.argv[1]), 1, 3, None, 2))
PY
  done
  small qwen3_fp8_block128 "$root/test/tools/Inputs/tiny/qwen3_moe.json" --quant=fp8-block128
  hf="$root/test/tools/Inputs/hf/deepseek_v3.json"
  # The one-rank reference takes the same buckets: on N x T tokens its
  # bucket's shared expert splits K as the ranks' bucket of T does at 1, 128
  # and 4096 tokens a rank (at 64 a rank the ranks' shared expert splits K
  # five ways and the reference's, at 128 tokens, does not: the values
  # differ there, and only there, as the no-split pair below shows).
  "$compile" --from-hf-config "$hf" --quant=none --name dsv3 --target=sm_90a -o "$dir/dsv3_ep1.so"
  "$compile" --from-hf-config "$hf" --quant=none --name dsv3 --target=sm_90a --ep-size 2 --ep-max-tokens 4096 -o "$dir/dsv3_ep2.so"
  # As DeepSeek-V3 ships: FP8 block-128 weights; tokens travel as E4M3.
  "$compile" --from-hf-config "$hf" --name dsv3 --target=sm_90a -o "$dir/dsv3_fp8_ep1.so"
  "$compile" --from-hf-config "$hf" --name dsv3 --target=sm_90a --ep-size 2 --ep-max-tokens 4096 -o "$dir/dsv3_fp8_ep2.so"
  # Both built with one K range a matmul (no split-K): split partials sum
  # in another order than one range, so a bucket whose shared expert splits
  # K (bf16, few tokens) rounds differently from the one-rank layer.
  "$compile" --from-hf-config "$hf" --quant=none --name dsv3 --target=sm_90a --token-buckets=none \
    --matmul-config=split-k=1 -o "$dir/dsv3_k1_ep1.so"
  "$compile" --from-hf-config "$hf" --quant=none --name dsv3 --target=sm_90a --ep-size 2 --ep-max-tokens 4096 \
    --matmul-config=split-k=1 -o "$dir/dsv3_k1_ep2.so"
  du -sh "$dir" >&2
  exit 0
fi

if [[ $mode == run ]]; then
  export LD_LIBRARY_PATH="$dir/lib:${LD_LIBRARY_PATH:-}"
  out=${OUT:-$dir/results}
  mkdir -p "$out"
  nvidia-smi topo -m | head -4 || true
  # EP_SMALL= skips the small layers; EP_SKIP_KILL=1 the killed rank;
  # EP_MPS=1 times the small layers two ranks to one GPU (below);
  # EP_SANITIZE=1 runs every small layer's two ranks under compute-sanitizer
  # (memcheck, both processes), over NVLink and through the proxy.
  small_layers="mixtral qwen2_moe qwen3_moe deepseek_v3 gpt_oss deepseek_v3_fp8 qwen3_mxfp8 qwen3_fp8_block128"
  small_layers="$small_layers odd_h200_i72_e10 odd_i40 odd_h384_i320 odd_h384_i320_fp8"
  if [[ -n ${EP_SANITIZE:-} ]]; then
    for m in h200_i72_e10 i40 h384_i320; do
      for in in in1_odd_$m in_odd_$m; do
        log="$out/sanitize_logits_$in.txt"
        rc=0
        timeout 300 compute-sanitizer --tool memcheck --error-exitcode 9 "$dir/moe-exec" "$dir/logits_odd_$m.so" \
          --inputs "$dir/$in.safetensors" --outputs "$out/logits_san.safetensors" > "$log" 2>&1 || rc=$?
        echo "router logits $in: compute-sanitizer exit $rc, $(grep -m1 'ERROR SUMMARY' "$log" || echo 'no summary')"
      done
    done
    for m in ${EP_SMALL-$small_layers}; do
      for path in "" --ep-proxy; do
        log="$out/sanitize_${m}${path}.txt"
        rc=0
        timeout 300 compute-sanitizer --tool memcheck --target-processes all --error-exitcode 9 \
          "$dir/moe-exec" "$dir/${m}_ep2.so" --ep-ranks 2 $path --ep-timeout-ms 60000 \
          --inputs "$dir/in_$m.safetensors" --outputs "$out/${m}_san.safetensors" > "$log" 2>&1 || rc=$?
        echo "$m ${path:-nvlink}: compute-sanitizer exit $rc, $(grep -m1 'ERROR SUMMARY' "$log" || echo 'no summary')"
      done
    done
    exit 0
  fi
  # EP_MPS=1: both ranks of each small layer on one GPU (the first),
  # sharing it under MPS, timed against the one-rank layer on the same 77
  # tokens (as root: it starts and stops the MPS daemon).
  if [[ -n ${EP_MPS:-} ]]; then
    export CUDA_VISIBLE_DEVICES=0
    export CUDA_MPS_PIPE_DIRECTORY=$out/mps-pipe CUDA_MPS_LOG_DIRECTORY=$out/mps-log
    mkdir -p "$CUDA_MPS_PIPE_DIRECTORY" "$CUDA_MPS_LOG_DIRECTORY"
    nvidia-cuda-mps-control -d
    trap 'echo quit | nvidia-cuda-mps-control' EXIT
    per_run() { sed -n 's/.* \([0-9.]*\) us per run.*/\1/p'; }
    for m in ${EP_SMALL-$small_layers}; do
      one=$(timeout 120 "$dir/moe-exec" "$dir/${m}_ep1.so" --inputs "$dir/in_$m.safetensors" \
        --outputs "$out/${m}_mps1.safetensors" --repeat 200 | per_run)
      two=$(timeout 120 "$dir/moe-exec" "$dir/${m}_ep2.so" --ep-ranks 2 --ep-timeout-ms 5000 \
        --inputs "$dir/in_$m.safetensors" --outputs "$out/${m}_mps2.safetensors" --repeat 200 | per_run)
      same=DIFFERS
      cmp -s "$out/${m}_mps1.safetensors" "$out/${m}_mps2.safetensors" && same=bit-identical
      python3 -c "import sys; o, t = map(float, sys.argv[2:4]); \
print(f'{sys.argv[1]}, 77 tokens: one rank {o:.1f} us, 2 ranks on one GPU (MPS) {t:.1f} us, {t / o:.2f}x, {sys.argv[4]}')" \
        "$m" "${one:-nan}" "${two:-nan}" "$same"
    done
    exit 0
  fi
  for m in ${EP_SMALL-$small_layers}; do
    timeout 120 "$dir/moe-exec" "$dir/${m}_ep1.so" --inputs "$dir/in_$m.safetensors" \
      --outputs "$out/${m}_ep1.safetensors" || echo "$m: the one-rank run failed"
    timeout 120 "$dir/moe-exec" "$dir/${m}_ep2.so" --ep-ranks 2 --ep-timeout-ms 5000 --inputs "$dir/in_$m.safetensors" \
      --outputs "$out/${m}_ep2.safetensors" || echo "$m: the two-rank run failed"
    if cmp -s "$out/${m}_ep1.safetensors" "$out/${m}_ep2.safetensors"; then
      echo "$m, 77 tokens, 2 ranks on 2 GPUs: bit-identical to one rank"
    else
      echo "$m, 77 tokens, 2 ranks on 2 GPUs: DIFFERS"
    fi
    rm -f "$out/${m}_ep2.safetensors"
    # The proxy path, forced: host memory and lib/transport between them.
    timeout 120 "$dir/moe-exec" "$dir/${m}_ep2.so" --ep-ranks 2 --ep-proxy --ep-timeout-ms 5000 \
      --inputs "$dir/in_$m.safetensors" --outputs "$out/${m}_ep2p.safetensors" || echo "$m: the proxy run failed"
    if cmp -s "$out/${m}_ep1.safetensors" "$out/${m}_ep2p.safetensors"; then
      echo "$m, 77 tokens, 2 ranks on 2 GPUs through the proxy: bit-identical to one rank"
    else
      echo "$m, 77 tokens, 2 ranks on 2 GPUs through the proxy: DIFFERS"
    fi
    rm -f "$out/${m}_ep1.safetensors" "$out/${m}_ep2p.safetensors"
  done
  echo "-- rank 1 killed before its forward (2 s limit):"
  if [[ -z ${EP_SKIP_KILL:-} ]] && MOE_EP_TEST_KILL_RANK=1 timeout 120 "$dir/moe-exec" "$dir/mixtral_ep2.so" --ep-ranks 2 --ep-timeout-ms 2000 \
      --inputs "$dir/in_mixtral.safetensors" --outputs "$out/killed.safetensors"; then
    echo "UNEXPECTED: the run succeeded"
  fi
  # Counts that disagree with records (rank 1 claims one choice more of
  # each peer's first expert than its records hold): both ranks fail, each
  # naming the other, over NVLink and through the proxy, and no output is
  # written. Then a return base past the combine area (64 tokens x top-2)
  # through the proxy.
  for how in "" --ep-proxy; do
    rm -f "$out/extra.safetensors"
    log=$(MOE_EP_TEST_EXTRA_CHOICE=1:1 timeout 120 "$dir/moe-exec" "$dir/mixtral_ep2.so" --ep-ranks 2 \
      --ep-timeout-ms 2000 $how --inputs "$dir/in_mixtral.safetensors" --outputs "$out/extra.safetensors" 2>&1) &&
      echo "UNEXPECTED: disagreeing counts ran ($how)"
    echo "$log"
    if [[ -e $out/extra.safetensors ]] || ! grep -q "rank 0 received counts and records from rank 1 that disagree" <<<"$log" ||
        ! grep -q "rank 0 refused the rows rank 1 sent it" <<<"$log"; then
      echo "UNEXPECTED: disagreeing counts were not refused by rank 0 and named on rank 1 ($how)"
    fi
  done
  log=$(MOE_EP_TEST_RETURN_BASE=1:128 timeout 120 "$dir/moe-exec" "$dir/mixtral_ep2.so" --ep-ranks 2 \
    --ep-timeout-ms 2000 --ep-proxy --inputs "$dir/in_mixtral.safetensors" --outputs "$out/base.safetensors" 2>&1) &&
    echo "UNEXPECTED: a bad return base ran"
  echo "$log"
  grep -q "rank 1 gave rank 0 return base 128" <<<"$log" || echo "UNEXPECTED: the bad return base was not named"
  # A collected Layer leaves without meeting a peer that is gone.
  python3 "$root/test/tools/check_ep_leave.py" "$dir/mixtral_ep2.so" --gpu ||
    echo "UNEXPECTED: the collected layer did not leave at once"
  # DeepSeek-V3 pairs through bench/ep_bench.py: each variant in the list
  # (empty: none), how it runs, then ep_bench's options.
  big() {
    local variants=$1 how=$2 v
    shift 2
    for v in $variants; do
      echo "-- DeepSeek-V3 ($v, 256 experts, EP2)$how:"
      local rc=0
      timeout 300 python3 -m bench.ep_bench "$dir/${v}_ep1.so" "$dir/${v}_ep2.so" "$@" || rc=$?
      case $rc in
      0) ;;
      3) echo "$v: values differ from the one-rank layer (the no-split pair, dsv3_k1, shows whether only split-K's order does it)" ;;
      *) echo "$v: the benchmark failed" ;;
      esac
    done
  }
  repeat=${EP_REPEAT:-20}
  big "${EP_BIG-dsv3 dsv3_fp8}" "" --tokens "${EP_TOKENS:-1,128,4096}" --repeat "$repeat"
  big "${EP_LOCKSTEP-dsv3_fp8 dsv3}" ", each forward started on both ranks together" --lockstep \
    --tokens "${EP_TOKENS:-1,128,4096}" --repeat "$repeat"
  big "${EP_PLAIN-dsv3_fp8 dsv3}" ", the forward alone (no kernel events, graphs)" --plain \
    --tokens "${EP_PLAIN_TOKENS:-1,128}" --repeat "$repeat"
  big "${EP_SKEW-dsv3_fp8}" ", rank 1 bringing 4096 tokens to rank 0's 1 or 64" \
    --last-rank-tokens 4096 --tokens 1,64 --repeat 3
  big "${EP_K1-dsv3_k1}" ", no split-K" --tokens "${EP_K1_TOKENS:-1,128}" --repeat "$repeat"
  big "${EP_PROXY-dsv3}" " through the proxy" --proxy \
    --tokens "${EP_PROXY_TOKENS:-1,128,4096}" --repeat "$repeat"
  exit 0
fi

echo "usage: bench/ep-check.sh prepare|run" >&2
exit 2
