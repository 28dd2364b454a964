#!/usr/bin/env bash
# Writes the PTX of every layer this checkout compiles for sm_90a, one file a
# (input, flags) pair, so that two compilers' kernels can be compared file by
# file (scripts/ptx-identical.sh).
#
#   scripts/emit-ptx.sh MOE_COMPILE OUTDIR
#
# MOE_COMPILE is the moe-compile binary to run; the inputs are this script's
# checkout's: examples/*.mlir, examples/configs/*.json, test/tools/Inputs/
# {tiny,odd,hf}/*.json (--from-hf-config), test/tools/Inputs/attention/*.mlir,
# ep2.mlir, static-tokens.mlir and the attention layer of
# test/codegen/nvidia/kernels/attention.mlir. Besides each input's default compile,
# the flag sets the sm_90a lit tests compile with (sm90a-every-layer.test,
# bucket-launches.test, moe-opt-reproduces-moe-compile.test,
# moe-compile-hf-config.test), each at least once: --quant=..., --router-logits
# (--fuse-layer=64), --ep-size=2 (--ep-max-tokens, --token-buckets=none),
# --token-buckets=none and =1,8, --matmul-config pins, --fuse-layer=64; and
# two that change the kernels the lit tests reach through moe-opt or on the
# CPU: --attention-ping-pong=false, --fuse-quantization=false.
#
# OUTDIR/<group>.<input>[+flag...].ptx, the flags without their dashes, as
# `tiny.qwen3_moe+quant=mxfp8+ep-size=2+ep-max-tokens=128.ptx`. An input that
# does not compile is skipped with a line saying so and named in
# OUTDIR/FAILED (one line each, sorted; empty when none), so that comparing
# two OUTDIRs compares what failed too. Some inputs are expected to fail
# (test/tools/Inputs/hf holds deliberately invalid configs, and some
# attention shapes have no sm_90a kernel): the exit status is 1 only when
# any other compile failed. Old *.ptx and FAILED in OUTDIR are removed first.
# JOBS (default 2) compiles run at once.
set -euo pipefail
if [ $# -ne 2 ]; then
  echo "usage: $0 MOE_COMPILE OUTDIR" >&2
  exit 2
fi
root=$(cd "$(dirname "$0")/.." && pwd)
case $1 in
*/*) moe_compile=$(cd "$(dirname "$1")" && pwd)/$(basename "$1") ;;
*) moe_compile=$(command -v "$1" || true) ;;
esac
if [ ! -x "$moe_compile" ]; then
  echo "$0: $1 is not an executable" >&2
  exit 2
fi
mkdir -p "$2"
out=$(cd "$2" && pwd)
rm -f "$out"/*.ptx "$out/FAILED"
logs=$(mktemp -d)
trap 'rm -rf "$logs"' EXIT

# One job a line: must|may, the output's name, then moe-compile's arguments
# (paths relative to the checkout; none holds a space). A `may` job is
# allowed to fail.
jobs=$logs/jobs
job() { echo "$*" >>"$jobs"; }
: >"$jobs"

hf=test/tools/Inputs
stem() { basename "${1%.*}"; }

# Every input, as it compiles by default.
for f in examples/*.mlir; do job must "examples.$(stem "$f")" "$f"; done
for f in examples/configs/*.json; do
  job must "configs.$(stem "$f")" --from-hf-config "$f"
done
for f in "$hf"/tiny/*.json; do job must "tiny.$(stem "$f")" --from-hf-config "$f"; done
for f in "$hf"/odd/*.json; do job must "odd.$(stem "$f")" --from-hf-config "$f"; done
for f in "$hf"/hf/*.json; do job may "hf.$(stem "$f")" --from-hf-config "$f"; done
for f in "$hf"/attention/*.mlir; do job may "attention.$(stem "$f")" "$f"; done
job must tools.ep2 "$hf/ep2.mlir"
job must tools.static-tokens "$hf/static-tokens.mlir"
job must codegen.attention test/codegen/nvidia/kernels/attention.mlir

# Flag variants: `variant GROUP INPUT FLAG...` compiles INPUT (a config for
# the tiny, odd and configs groups) with FLAGs.
variant() {
  local group=$1 input=$2 name
  shift 2
  name="$group.$(stem "$input")"
  for flag in "$@"; do name+="+${flag#--}"; done
  case $group in
  tiny | odd | configs) job must "$name" --from-hf-config "$input" "$@" ;;
  *) job must "$name" "$input" "$@" ;;
  esac
}
tiny=$hf/tiny
qwen=$tiny/qwen3_moe.json
# Quantization schemes, also unfused and expert parallel.
for q in mxfp8 mxfp8-ceil fp8-block128; do variant tiny "$qwen" --quant=$q; done
for q in mxfp8 fp8-block128; do
  variant tiny "$qwen" --quant=$q --fuse-quantization=false
  variant tiny "$qwen" --quant=$q --ep-size=2 --ep-max-tokens=128
done
variant odd "$hf/odd/i40.json" --quant=fp8-block128
# Router logits, in the chain and in the fused layer.
for f in "$tiny"/*.json; do variant tiny "$f" --router-logits; done
variant tiny "$qwen" --router-logits --fuse-layer=64
# Expert parallel over two ranks.
for c in deepseek_v3 deepseek_v3_fp8 mixtral; do variant tiny "$tiny/$c.json" --ep-size=2; done
for c in deepseek_v2 deepseek_v3 deepseek_v3_fp8 gpt_oss kimi_k2 mixtral qwen2_moe qwen3_moe; do
  variant tiny "$tiny/$c.json" --ep-size=2 --ep-max-tokens=128
done
variant tiny "$tiny/deepseek_v3.json" --ep-size=2 --token-buckets=none
variant tiny "$qwen" --quant=mxfp8 --ep-size=2 --ep-max-tokens=64
variant tools "$hf/ep2.mlir" --ep-max-tokens=64
# Token buckets and pinned matmul configurations.
variant tiny "$qwen" --token-buckets=none
variant tiny "$qwen" --quant=fp8-block128 --token-buckets=1,8
variant tiny "$qwen" --quant=fp8-block128 --matmul-config=persistent=false,group=4,raster=n
# The fused layer on the examples and full-size configs.
for f in examples/*.mlir; do variant examples "$f" --fuse-layer=64; done
for c in deepseek-v3-ep8-shard-fp8 deepseek-v3-small; do
  variant configs "examples/configs/$c.json" --fuse-layer=64
done
for q in fp8-block128 mxfp8; do
  variant configs examples/configs/qwen3-30b-a3b.json --quant=$q --fuse-layer=64
done
# Attention's serial schedule.
variant codegen test/codegen/nvidia/kernels/attention.mlir --attention-ping-pong=false
variant attention "$hf/attention/gqa_causal.mlir" --attention-ping-pong=false

# Each job writes NAME.ptx, or NAME.failed (must|may, then the error) when
# moe-compile fails; stderr of a compile that succeeds (remarks) is dropped.
compile() {
  local kind=$1 name=$2
  shift 2
  if "$MOE_COMPILE" "$@" --target=sm_90a --emit=ptx -o "$OUT/$name.ptx.tmp" \
      2>"$LOGS/$name.err"; then
    mv "$OUT/$name.ptx.tmp" "$OUT/$name.ptx"
  else
    rm -f "$OUT/$name.ptx.tmp"
    { echo "$kind"; grep -m1 -i 'error' "$LOGS/$name.err" ||
      head -n1 "$LOGS/$name.err"; } >"$LOGS/$name.failed"
  fi
}
export -f compile
export MOE_COMPILE=$moe_compile OUT=$out LOGS=$logs

start=$SECONDS
cd "$root"
xargs -P "${JOBS:-2}" -L 1 bash -c 'compile "$@"' _ <"$jobs"

status=0
: >"$out/FAILED"
for f in "$logs"/*.failed; do
  [ -e "$f" ] || continue
  name=$(basename "$f" .failed)
  echo "$name" >>"$out/FAILED"
  kind=$(head -n1 "$f")
  echo "skipped $name ($(sed -n 2p "$f"))"
  if [ "$kind" = must ]; then
    status=1
  fi
done
sort -o "$out/FAILED" "$out/FAILED"
echo "$(ls "$out" | grep -c '\.ptx$') PTX files in $out, $(wc -l <"$out/FAILED") skipped," \
  "$(wc -l <"$jobs") compiles in $((SECONDS - start)) s"
if [ $status -ne 0 ]; then
  echo "$0: inputs that should compile failed (see above)" >&2
fi
exit $status
