#!/usr/bin/env python3
"""Runs a compiled layer through moe-exec on random inputs and compares its
output with moe-reference, the float64 C++ reference of the same layer.

Prints the relative error ||out - ref|| / ||ref|| and fails above --bound.
"""
import argparse
import ctypes
import json
import os
import subprocess
import sys

import numpy as np
from moe_compiler.quantize import quantize_weight
from moe_compiler.safetensors_io import (DTYPES, SafetensorsFile,
                                         write_safetensors)

# The scheme of FP8 weights, told by their scales' dtype.
SCHEMES = {"F32": "fp8-block128", "F8_E8M0": "mxfp8"}


def write_inputs(path, inputs):
    """Writes `inputs` (name -> (safetensors dtype, array))."""
    write_safetensors(path, {name: a for name, (_, a) in inputs.items()},
                      {name: dtype for name, (dtype, _) in inputs.items()})


def random_inputs(info, tokens, seed, adjust=None):
    """Random inputs for every argument the layer takes (`tokens` rows for
    the token dimension), FP8 weights quantized as the layer takes them.
    `adjust(name, values)`, when given, may change each float64 draw before
    it is stored."""
    rng = np.random.default_rng(seed)
    inputs = {}
    dtypes = {a["name"]: a["dtype"] for a in info["args"]}
    for arg in info["args"]:
        if arg["output"] or arg["name"] in inputs:
            continue
        shape = [tokens if d < 0 else d for d in arg["shape"]]
        name = arg["name"]
        if name == "hidden_states":
            scale = 1.0
        elif "bias" in name:
            scale = 0.3
        else:
            scale = 1.0 / np.sqrt(shape[-1])
        values = rng.standard_normal(shape) * scale
        if adjust:
            values = adjust(name, values)
        if arg["dtype"] == "F8_E4M3":
            scale_dtype = dtypes[name + "_scale"]
            codes, scales = quantize_weight(values, SCHEMES[scale_dtype])
            inputs[name] = ("F8_E4M3", codes)
            inputs[name + "_scale"] = (scale_dtype, scales)
            continue
        inputs[name] = (arg["dtype"], values.astype(DTYPES[arg["dtype"]]))
    return inputs


def main():
    ap = argparse.ArgumentParser(description=__doc__)
    ap.add_argument("library")
    ap.add_argument("--exec", dest="moe_exec", required=True)
    ap.add_argument("--reference", required=True)
    ap.add_argument("--tokens", type=int, required=True)
    ap.add_argument("--bound", type=float, required=True)
    ap.add_argument("--seed", type=int, default=0)
    ap.add_argument("--workdir", required=True)
    ap.add_argument("--inputs-only", action="store_true",
                    help="write in.safetensors and stop (for error tests)")
    ap.add_argument("--drop", help="leave this input out")
    ap.add_argument("--extra", help="add an input of this name")
    ap.add_argument("--as-f32", help="store this input as F32")
    ap.add_argument("--widen", help="add a column to this input")
    opts = ap.parse_args()

    lib = ctypes.CDLL(os.path.abspath(opts.library))
    lib.moe_layer_info.restype = ctypes.c_char_p
    info = json.loads(lib.moe_layer_info().decode())
    inputs = random_inputs(info, opts.tokens, opts.seed)

    if opts.drop:
        del inputs[opts.drop]
    if opts.extra:
        inputs[opts.extra] = ("F32", np.zeros([2], np.float32))
    if opts.as_f32:
        inputs[opts.as_f32] = ("F32", inputs[opts.as_f32][1].astype(np.float32))
    if opts.widen:
        dtype, array = inputs[opts.widen]
        inputs[opts.widen] = (dtype, np.concatenate(
            [array, array[..., :1]], axis=-1))
    os.makedirs(opts.workdir, exist_ok=True)
    paths = {k: os.path.join(opts.workdir, k + ".safetensors")
             for k in ("in", "out", "ref")}
    write_inputs(paths["in"], inputs)
    if opts.inputs_only:
        return 0
    subprocess.run([opts.moe_exec, opts.library, "--inputs", paths["in"],
                    "--outputs", paths["out"]], check=True)
    subprocess.run([opts.reference, opts.library, paths["in"], paths["ref"]],
                   check=True)
    out = SafetensorsFile(paths["out"]).get("out").astype(np.float64)
    ref = SafetensorsFile(paths["ref"]).get("out").astype(np.float64)
    if out.shape != ref.shape or not np.all(np.isfinite(out)):
        print(f"FAIL: output shape {out.shape} (reference {ref.shape}) or "
              f"non-finite values")
        return 1
    norm = np.linalg.norm(ref)
    error = np.linalg.norm(out - ref) / norm if norm > 0 else 0.0
    print(f"{info['name']}, {opts.tokens} tokens: relative error {error:.2e} "
          f"(bound {opts.bound:g})")
    return 0 if error <= opts.bound else 1


if __name__ == "__main__":
    sys.exit(main())
