#!/bin/sh
# Runs "$@" with Debian's LLVM and MLIR libraries out of sight: an empty
# folder over /usr/lib/llvm-22/lib and an empty file over the loader's own
# libLLVM. For `unshare -m`, which keeps the mounts to this process.
set -e
mount -t tmpfs none /usr/lib/llvm-22/lib
for f in /usr/lib/x86_64-linux-gnu/libLLVM.so.22.1 /lib/x86_64-linux-gnu/libLLVM.so.22.1; do
  if [ -e "$f" ]; then mount --bind /dev/null "$f"; fi
done
exec "$@"
