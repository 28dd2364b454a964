#!/usr/bin/env python3
"""moe-quantize against the reference quantizers, bit for bit.

The matrices of test/reference/check_quantize.py (normal, wide range,
special values, ragged, tiny) go through moe-quantize-reference and through
moe_compiler.quantize.quantize_weight as a weight: MXFP8 (floor and ceil)
per row and 32 of K, FP8 block-128 per 128 x 128 block. Every code and scale
must agree. Then the moe-quantize command on a layer's arguments: the
weights become codes with scales, other tensors are copied, and input it
cannot take is refused with no output written.
"""
import json
import os
import subprocess
import sys
import tempfile

import ml_dtypes
import numpy as np
from check_quantize import load_raw, matrices
from moe_compiler.quantize import quantize_weight
from moe_compiler.safetensors_io import SafetensorsFile, write_safetensors
from safetensors.numpy import save_file


def main():
    reference, tool = sys.argv[1:3]
    rng = np.random.default_rng(0)
    passed = failed = 0
    with tempfile.TemporaryDirectory() as tmp:
        for name, x in matrices(rng):
            save_file({"x": x}, f"{tmp}/in.safetensors")
            subprocess.run([reference, f"{tmp}/in.safetensors",
                            f"{tmp}/out.safetensors"], check=True)
            want = load_raw(f"{tmp}/out.safetensors")
            for scheme, key in (("mxfp8", "mx_floor"), ("mxfp8-ceil", "mx_ceil"),
                                ("fp8-block128", "b128w")):
                codes, scales = quantize_weight(x, scheme)
                for part, have in (("data", codes), ("scales", scales)):
                    expected = want[f"{key}_{part}"].view(np.uint8)
                    got = np.ascontiguousarray(have).view(np.uint8)
                    if np.array_equal(got, expected):
                        passed += 1
                    else:
                        failed += 1
                        bad = np.argwhere(got != expected)[:5].tolist()
                        print(f"FAIL {name} {scheme} {part}: at {bad}")
        print(f"{passed} passed, {failed} failed")

        # The command on a layer's arguments.
        bf16 = ml_dtypes.bfloat16
        layer = {"hidden_states": rng.standard_normal((3, 64)).astype(bf16),
                 "router_weight": rng.standard_normal((4, 64)).astype(bf16),
                 "w13": rng.standard_normal((4, 64, 64)).astype(bf16),
                 "w2": rng.standard_normal((4, 64, 32)).astype(bf16),
                 "shared_w13": rng.standard_normal((32, 64)).astype(bf16)}
        write_safetensors(f"{tmp}/layer.safetensors", layer)
        for scheme in ("mxfp8", "fp8-block128"):
            out = f"{tmp}/{scheme}.safetensors"
            run = subprocess.run([tool, "--scheme", scheme,
                                  f"{tmp}/layer.safetensors", "-o", out],
                                 capture_output=True, text=True)
            print(run.stdout.strip() or run.stderr.strip())
            with open(out, "rb") as fh:
                size = int.from_bytes(fh.read(8), "little")
                header = json.loads(fh.read(size))
            for key in sorted(header):
                print(f"  {key} {header[key]['dtype']} {header[key]['shape']}")
            f = SafetensorsFile(out)
            same = np.array_equal(f.get("router_weight"),
                                  layer["router_weight"])
            print(f"  router_weight copied: {same}")
        # Already quantized input, and a missing file: refused, nothing written.
        for args in ([f"{tmp}/mxfp8.safetensors"], [f"{tmp}/missing.safetensors"]):
            out = f"{tmp}/refused.safetensors"
            run = subprocess.run([tool, "--scheme", "mxfp8", *args, "-o", out],
                                 capture_output=True, text=True)
            print(f"rc {run.returncode}: {run.stderr.strip()}; "
                  f"written: {os.path.exists(out)}")
    return 1 if failed else 0


if __name__ == "__main__":
    sys.exit(main())
