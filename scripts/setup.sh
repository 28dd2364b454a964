#!/usr/bin/env bash
# Installs what a fresh machine lacks to build and test moe-compiler; does nothing when all is there.
set -euo pipefail

debs=(libmlir-22-dev mlir-22-tools llvm-22-dev llvm-22-tools libfabric-dev libgtest-dev
      ninja-build lld cmake clang-format)
missing=()
for p in "${debs[@]}"; do
  dpkg-query -W -f='${Status}' "$p" 2>/dev/null | grep -q "install ok installed" || missing+=("$p")
done
if ((${#missing[@]})); then
  echo "setup: installing ${missing[*]}"
  sudo_cmd=()
  [ "$(id -u)" = 0 ] || sudo_cmd=(sudo)
  "${sudo_cmd[@]}" apt-get update -qq
  DEBIAN_FRONTEND=noninteractive "${sudo_cmd[@]}" apt-get install -y -qq --no-install-recommends \
    "${missing[@]}" >/dev/null
fi

# Python packages the tests use (bit-exact float8/E8M0 references, tensor files).
py=${PYTHON:-python3}
if ! "$py" -c 'import numpy, ml_dtypes, safetensors' 2>/dev/null; then
  echo "setup: installing numpy ml_dtypes safetensors"
  "$py" -m pip install -q numpy ml_dtypes safetensors
fi
# The wheel's build backend (pyproject.toml), for scripts/wheel.sh.
if ! "$py" -c 'import scikit_build_core' 2>/dev/null; then
  echo "setup: installing scikit-build-core==1.1.2"
  "$py" -m pip install -q scikit-build-core==1.1.2
fi

# PyTorch and transformers for the package's torch parts (moe_compiler.MoE,
# moe_compiler.patch), tested on the CPU; about 5 GB, a minute or two to
# install. MOE_NO_TORCH=1 leaves them out (those tests then skip).
if [ "${MOE_NO_TORCH:-0}" != 1 ] &&
   ! "$py" -c 'import torch, transformers' 2>/dev/null; then
  echo "setup: installing torch==2.11.0 transformers==5.17.0"
  "$py" -m pip install -q torch==2.11.0 transformers==5.17.0
fi
