#!/usr/bin/env bash
# vLLM's Triton fused-MoE kernel as bench/decode.py's peer, taken from a vLLM
# wheel (0.33.0 is what bench/vllm_peer.py restates) into a git-ignored
# folder: vLLM's code is read from there, never committed.
#
#   bench/vllm-peer.sh WHEEL [DIR]    (DIR defaults to build/vllm-peer)
#
# Extracts vllm/model_executor/layers/fused_moe/fused_moe.py and every tuned
# config JSON under .../fused_moe/configs/ (about 1 MB in all; which one a
# layer gets depends on the GPU's name, so all are kept), notes the wheel in
# DIR/VERSION, then has bench/vllm_peer.py write DIR/vllm_kernels.py: the
# file's @triton.jit kernel and the jit helpers it calls, alone, so the GPU
# machine needs only torch and triton. The GPU machine has no network: carry
# DIR to it (run's carry, or copy it beside the checkout).
set -euo pipefail
root=$(cd "$(dirname "$0")/.." && pwd)
if [[ $# -lt 1 || $# -gt 2 ]]; then
  echo "usage: $0 WHEEL [DIR]" >&2
  exit 2
fi
wheel=$(realpath "$1")
dir=${2:-$root/build/vllm-peer}
mkdir -p "$dir"
dir=$(realpath "$dir")
rm -rf "$dir/configs" "$dir/fused_moe.py" "$dir/vllm_kernels.py"

# A wheel is a zip; Python's zipfile needs no unzip on the machine.
python3 - "$wheel" "$dir" <<'EOF'
import os
import shutil
import sys
import zipfile

wheel, out = sys.argv[1], sys.argv[2]
base = "vllm/model_executor/layers/fused_moe/"
wanted = {base + "fused_moe.py": "fused_moe.py"}
with zipfile.ZipFile(wheel) as z:
    for name in z.namelist():
        rest = name[len(base + "configs/"):]
        if name.startswith(base + "configs/") and rest.endswith(".json") \
                and "/" not in rest:
            wanted[name] = os.path.join("configs", rest)
    missing = [n for n in wanted if n not in z.namelist()]
    if missing:
        sys.exit(f"vllm-peer.sh: {wheel} lacks {', '.join(missing)}")
    os.makedirs(os.path.join(out, "configs"), exist_ok=True)
    for name, target in wanted.items():
        with z.open(name) as src, open(os.path.join(out, target), "wb") as dst:
            shutil.copyfileobj(src, dst)
print(f"vllm-peer.sh: fused_moe.py and {len(wanted) - 1} configs into {out}")
EOF

{
  echo "wheel $(basename "$wheel")"
  echo "sha256 $(sha256sum "$wheel" | cut -d' ' -f1)"
} > "$dir/VERSION"

# The kernel module, checked by parsing it (no triton needed here).
PYTHONPATH="$root${PYTHONPATH:+:$PYTHONPATH}" python3 -m bench.vllm_peer "$dir"
