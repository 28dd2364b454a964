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

import ml_dtypes
import numpy as np

DTYPES = {"BF16": (ml_dtypes.bfloat16, 2), "F32": (np.float32, 4),
          "F8_E4M3": (ml_dtypes.float8_e4m3fn, 1)}


def quantize_blocks(values, scale_shape, scale_dtype):
    """FP8 weights ([E,] N, K) as a quantized layer takes them: E4M3 codes
    and one f32 scale (amax / 448) per 128 x 128 block, or per 1 x 128 when
    the scale has a row per weight row (FP8 block-128, as DeepSeek-V3 stores
    them); or one E8M0 scale 2^(floor(log2 amax) - 8) per 1 x 32 block
    (MXFP8), as codes."""
    squeeze = values.ndim == 2
    if squeeze:
        values, scale_shape = values[None], [1] + list(scale_shape)
    experts, n, k = values.shape
    mx = scale_dtype == "F8_E8M0"
    row_block = 1 if scale_shape[1] == n else 128
    col_block = 32 if mx else 128
    scales = np.zeros(scale_shape, np.uint8 if mx else np.float32)
    codes = np.zeros(values.shape, ml_dtypes.float8_e4m3fn)
    for x in range(experts):
        for rb in range(scale_shape[1]):
            for cb in range(scale_shape[2]):
                rows = slice(rb * row_block, (rb + 1) * row_block)
                cols = slice(cb * col_block, (cb + 1) * col_block)
                tile = values[x, rows, cols].astype(np.float32)
                amax = np.abs(tile).max()
                if mx:
                    e = int(np.floor(np.log2(amax))) - 8 if amax > 0 else -127
                    e = min(max(e, -127), 127)
                    scales[x, rb, cb] = e + 127
                    scale = np.float32(2.0 ** e)
                    tile = np.clip(tile / scale, -448, 448)
                else:
                    scale = max(amax, 1e-4) / np.float32(448)
                    scales[x, rb, cb] = scale
                    tile = tile / scale
                codes[x, rows, cols] = tile.astype(ml_dtypes.float8_e4m3fn)
    if squeeze:
        codes, scales = codes[0], scales[0]
    return codes, scales


def write_safetensors(path, tensors):
    header, blobs, offset = {}, [], 0
    for name, (dtype, array) in tensors.items():
        data = np.ascontiguousarray(array).tobytes()
        header[name] = {"dtype": dtype, "shape": list(array.shape),
                        "data_offsets": [offset, offset + len(data)]}
        blobs.append(data)
        offset += len(data)
    text = json.dumps(header).encode()
    text += b" " * (-(8 + len(text)) % 8)
    with open(path, "wb") as f:
        f.write(len(text).to_bytes(8, "little") + text + b"".join(blobs))


def read_safetensors(path):
    raw = open(path, "rb").read()
    size = int.from_bytes(raw[:8], "little")
    out = {}
    for name, info in json.loads(raw[8:8 + size]).items():
        begin, end = info["data_offsets"]
        dtype = DTYPES[info["dtype"]][0]
        out[name] = np.frombuffer(raw[8 + size + begin:8 + size + end],
                                  dtype).reshape(info["shape"])
    return out


def random_inputs(info, tokens, seed, adjust=None):
    """Random inputs for every argument the layer takes (`tokens` rows for
    the token dimension), FP8 weights quantized as the layer takes them.
    `adjust(name, values)`, when given, may change each float64 draw before
    it is stored."""
    rng = np.random.default_rng(seed)
    inputs = {}
    shapes = {a["name"]: a["shape"] for a in info["args"]}
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
            codes, scales = quantize_blocks(values, shapes[name + "_scale"],
                                            dtypes[name + "_scale"])
            inputs[name] = ("F8_E4M3", codes)
            inputs[name + "_scale"] = (dtypes[name + "_scale"], scales)
            continue
        inputs[name] = (arg["dtype"], values.astype(DTYPES[arg["dtype"]][0]))
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
    write_safetensors(paths["in"], inputs)
    if opts.inputs_only:
        return 0
    subprocess.run([opts.moe_exec, opts.library, "--inputs", paths["in"],
                    "--outputs", paths["out"]], check=True)
    subprocess.run([opts.reference, opts.library, paths["in"], paths["ref"]],
                   check=True)
    out = read_safetensors(paths["out"])["out"].astype(np.float64)
    ref = read_safetensors(paths["ref"])["out"].astype(np.float64)
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
